"""``ns-train rh3dgs`` iteration time vs splatfacto's, on the same data and device, in the same run.

Both methods are trained in-process through nerfstudio's own ``Trainer`` (``config.setup()``,
``trainer.setup()``) on one generated synthetic dataset; each iteration is timed exactly as
nerfstudio's ``ITER_TRAIN_TIME`` does (``pipeline.train()``, the before-iteration callbacks,
``train_iteration`` - forward, losses, backward, optimizer and scheduler steps - and the
after-iteration callbacks, i.e. densification), without evaluation, logging or checkpoints.
The mean time per iteration excludes the first ``WARMUP`` iterations. Besides wall time, the
process's CPU time per iteration (all its threads) is reported: on a CPU shared with other
jobs it is the load-independent figure (wall time grows when other processes take the cores).

* ``rh3dgs``: the ``rh3dgs-lite`` preset (its 300-step schedule: the objective of ``distill()``, LIC
  included, densification between steps 60 and 200) with the simulated teacher's maps (D = 64).
* baseline on CUDA: nerfstudio's own ``splatfacto`` method (gsplat's CUDA rasterizer) with the
  same model hyperparameters and optimizer schedule as the rh3dgs run.
* baseline on CPU: nerfstudio's splatfacto cannot run on a CPU (``.cuda()`` calls, gsplat's CUDA
  rasterizer, an LPIPS download), so the baseline is ``splatfacto-native-lite``, the same preset without
  semantics: :class:`rh3dgs.nerfstudio.splatfacto_native.SplatfactoNativeModel` (the class the rh3dgs
  model extends), splatfacto's parameters, losses, metrics and densification on rh3dgs's CPU
  rasterizer; no latents, decoder or teacher. Labelled "splatfacto (CPU port: rh3dgs model,
  semantics off)".

Both start from the same seed point cloud (every point, no subsampling). Both methods are trained in one
child interpreter (``run_isolated``) with their iterations interleaved step by step, the order swapped every
step (:func:`measure_pair`): each pair of iterations sees the same moment of a shared machine (this VM's
speed drifts by ~20 % between runs a minute apart: four single-pair runs of separate interpreters gave
1.16-1.47x at 256x256), one set-up each (~8 s), and the peak RSS is that of the two together.
:func:`measure_training` times one method alone in its own interpreter (its own peak RSS, and on CUDA its own
peak allocated GPU memory).

    python benchmarks/bench_nstrain.py                # device: CUDA when available, else CPU
    RH3DGS_BENCH_DEVICE=cpu python benchmarks/bench_nstrain.py
    RH3DGS_BENCH_NSTRAIN_SIZES=64,256 python benchmarks/bench_nstrain.py   # image sides (default 256)
    RH3DGS_BENCH_NSTRAIN_FOX=0 python benchmarks/bench_nstrain.py   # without the fox row
    OMP_NUM_THREADS=1 python benchmarks/bench_nstrain.py   # on a CPU shared with other jobs

Each image size gets its own synthetic dataset (the same scene and ~4k seed points, the
``rh3dgs-lite`` preset's own cap) and one row per method.

The fox row (the fox data downscaled 4x, at least 50k Gaussians): ``shared/realdata/fox``'s
photos 4x downscaled (270x480) with the poses of bench_real's ``ns-process-data`` (COLMAP; kept in
``outputs/bench_cache/fox_ns_4x_2x``, made here when missing), 50,000 seed points (:func:`fox_seeded`), the
teacher ``tiny-clip`` computed at set-up and the latents initialised at random (the initialising lift of
50k Gaussians is the start of a run, not an iteration).

On a 2-core machine where other processes hold the cores, torch's 2-thread parallel regions
stall on a descheduled thread (wall and even CPU time per iteration grew 10-25x in such a
run); with one thread per process the figures stay stable. The thread count is in the output.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence, Tuple

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import entry, machine, peak_rss_mb, run_isolated, write_results  # noqa: E402

ITERS, WARMUP = 300, 10
VIEWS, SIZES, DENSITY = 12, (256,), 300.0  # ~4k seed points (the synthetic scene's Gaussian centres)
FOX_GAUSSIANS, FOX_ITERS = 50_000, 70  # the fox row: seed points, iterations (the first WARMUP not timed)
TARGET_RATIO = 1.3  # rh3dgs-lite / splatfacto per iteration at most, at 256x256 and on the fox
LABELS = {
    "rh3dgs": "rh3dgs (rh3dgs-lite preset)",
    "splatfacto:cuda": "splatfacto (nerfstudio)",
    "splatfacto:cpu": "splatfacto (CPU port: rh3dgs model, semantics off)",
}


def default_device() -> str:
    return os.environ.get("RH3DGS_BENCH_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


def default_sizes() -> Tuple[int, ...]:
    env = os.environ.get("RH3DGS_BENCH_NSTRAIN_SIZES")
    return tuple(int(v) for v in env.split(",")) if env else SIZES


def make_data(root: Path, views: int = VIEWS, size: int = SIZES[0], density: float = DENSITY) -> Path:
    """The synthetic labelled scene as a nerfstudio dataset with simulated teacher maps."""
    from rh3dgs.data.synthetic import SceneConfig, make_scene, write_dataset
    from rh3dgs.data.teacher_sim import simulate_teacher

    scene = make_scene(SceneConfig(num_views=views, image_size=size, gaussians_per_unit_area=density))
    write_dataset(scene, root, progress=False)
    simulate_teacher(root, progress=False)
    return root


def method_config(method: str, data: Path, out: Path, device: str, iters: int):
    """nerfstudio TrainerConfig of ``method`` ("rh3dgs" or "splatfacto") on ``device``."""
    from rh3dgs.nerfstudio.config import make_optimizers, rh3dgs_lite_config, splatfacto_native_lite_config

    c = splatfacto_native_lite_config() if method == "splatfacto" and device != "cuda" else rh3dgs_lite_config()
    c.pipeline.model.max_init_points = None  # same seed points as splatfacto
    if method == "splatfacto" and device == "cuda":
        from nerfstudio.configs.method_configs import method_configs
        from nerfstudio.models.splatfacto import SplatfactoModelConfig

        ours, steps = c.pipeline.model, c.max_num_iterations  # the lite schedule's horizon
        c = copy.deepcopy(method_configs["splatfacto"])
        for f in dataclasses.fields(SplatfactoModelConfig):  # same hyperparameters as the rh3dgs run
            if f.name != "_target":
                setattr(c.pipeline.model, f.name, getattr(ours, f.name))
        c.optimizers = {k: v for k, v in make_optimizers(steps).items() if k not in ("latents", "decoder")}
    elif method not in ("rh3dgs", "splatfacto"):
        raise ValueError(f"unknown method {method!r}")
    if method == "rh3dgs" or device != "cuda":
        c.pipeline.datamanager.teacher_cache_dir = out / "teacher_cache"
    c.pipeline.datamanager.data = data
    c.output_dir = out
    c.experiment_name = method
    c.machine.device_type = device
    c.vis = "tensorboard"  # no viewer server; nothing is logged from the timed loop
    c.max_num_iterations = iters
    c.set_timestamp()
    return c


@contextlib.contextmanager
def _setup_shims(cuda: bool) -> Iterator[Optional[str]]:
    """Work-arounds for building the trainers on this machine, undone on exit; yields why the PLY
    reader is replaced (None: nerfstudio's own open3d reader is used).

    * nerfstudio reads the seed point cloud with open3d; where open3d cannot be imported (e.g. no
      libusb on the machine) the same PLY is read with plyfile and nerfstudio's transform applied.
    * On CUDA, splatfacto builds LPIPS (downloads AlexNet weights) although training never uses it
      (eval metrics only); without local weights it gets rh3dgs's NaN stand-in.
    """
    import numpy as np
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import Nerfstudio

    saved = []
    why = None
    try:
        import open3d  # noqa: F401
    except Exception as e:  # ImportError / OSError of a missing system library
        why = f"{type(e).__name__}: {e}"
        from plyfile import PlyData

        def load(self, ply_file_path, transform_matrix, scale_factor):
            v = PlyData.read(str(ply_file_path))["vertex"]
            if v.count == 0:
                return None
            xyz = torch.from_numpy(np.stack([v["x"], v["y"], v["z"]], -1).astype(np.float32))
            xyz = torch.cat([xyz, torch.ones_like(xyz[..., :1])], -1) @ transform_matrix.T
            rgb = torch.from_numpy(np.stack([v["red"], v["green"], v["blue"]], -1).astype(np.uint8))
            return {"points3D_xyz": xyz * scale_factor, "points3D_rgb": rgb}

        saved.append((Nerfstudio, "_load_3D_points", Nerfstudio._load_3D_points))
        Nerfstudio._load_3D_points = load
    if cuda:
        from rh3dgs.nerfstudio.splatfacto_native import NoLPIPS, alexnet_weights_available

        if not alexnet_weights_available():
            import torchmetrics.image.lpip as lpip

            saved.append((lpip, "LearnedPerceptualImagePatchSimilarity", lpip.LearnedPerceptualImagePatchSimilarity))
            lpip.LearnedPerceptualImagePatchSimilarity = lambda *a, **k: NoLPIPS()
    try:
        yield why
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


@contextlib.contextmanager
def _own_event_writers() -> Iterator[None]:
    """nerfstudio's event writers (a module-level list each Trainer.setup() appends to) as they were before, on exit:
    the trainers made inside log into their output folders, which a measurement then deletes; a writer left behind
    would flush into a deleted folder from the next trainer of this interpreter (a later test, the next method)."""
    import nerfstudio.configs.base_config  # noqa: F401  (before writer: the two import each other)
    from nerfstudio.utils import writer

    before = list(writer.EVENT_WRITERS)
    try:
        yield
    finally:
        for w in writer.EVENT_WRITERS:
            if w not in before and hasattr(w, "tb_writer"):
                w.tb_writer.close()
        writer.EVENT_WRITERS[:] = before


def _setup_trainer(method: str, data: Path, out: Path, device: str, iters: int, edit=None):
    """nerfstudio's Trainer of ``method`` on ``data``, set up (``edit``: changes to its config first); and
    why the seed PLY was not read by open3d (None: it was)."""
    with _setup_shims(device == "cuda") as ply_fallback:
        config = method_config(method, Path(data), Path(out), device, iters)
        if edit is not None:
            edit(config)
        trainer = config.setup(local_rank=0, world_size=1)
        trainer.setup()
    return trainer, ply_fallback


def _train_step(trainer, step: int) -> Tensor:
    """nerfstudio's Trainer.train() loop body, the part its ITER_TRAIN_TIME times; the loss."""
    from nerfstudio.engine.callbacks import TrainingCallbackLocation

    trainer.step = step
    trainer.pipeline.train()
    for cb in trainer.callbacks:
        cb.run_callback_at_location(step, location=TrainingCallbackLocation.BEFORE_TRAIN_ITERATION)
    loss, _, _ = trainer.train_iteration(step)
    for cb in trainer.callbacks:
        cb.run_callback_at_location(step, location=TrainingCallbackLocation.AFTER_TRAIN_ITERATION)
    return loss


def _timed_step(trainer, step: int, method: str, device: str) -> Tuple[float, float, Tensor]:
    """One :func:`_train_step`: its wall and CPU seconds (CUDA synchronised around it) and its loss, which must be finite."""
    if device == "cuda":
        torch.cuda.synchronize()
    t, c = time.perf_counter(), time.process_time()
    loss = _train_step(trainer, step)
    if device == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    if not torch.isfinite(loss):
        raise RuntimeError(f"{method}: non-finite loss at step {step}")
    return wall, cpu, loss


def _timings(method: str, device: str, times, cpu_times, warmup: int) -> dict:
    timed, cpu_timed = times[warmup:], cpu_times[warmup:]
    return {"method": method, "device": device, "iters": len(times), "warmup": warmup,
            "label": LABELS.get(method if method == "rh3dgs" else f"{method}:{device if device == 'cuda' else 'cpu'}"),
            "mean_ms": 1000 * statistics.fmean(timed), "median_ms": 1000 * statistics.median(timed),
            "min_ms": 1000 * min(timed), "max_ms": 1000 * max(timed), "cpu_mean_ms": 1000 * statistics.fmean(cpu_timed)}


def measure_training(method: str, data: Path, iters: int = ITERS, warmup: int = WARMUP, device: str = "cpu",
                     out: Optional[Path] = None) -> dict:
    """Train ``method`` for ``iters`` iterations in this process; per-iteration times (see module docstring)."""
    if warmup >= iters:
        raise ValueError(f"warmup ({warmup}) must be < iters ({iters})")
    tmp = tempfile.TemporaryDirectory(prefix="rh3dgs_bench_nstrain_") if out is None else None
    try:
        with _own_event_writers():
            return _measure_training(method, data, iters, warmup, device, Path(tmp.name) if tmp else out)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _measure_training(method: str, data: Path, iters: int, warmup: int, device: str, out: Path) -> dict:
    cuda = device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    rss0 = peak_rss_mb()
    t0 = time.perf_counter()
    trainer, ply_fallback = _setup_trainer(method, data, out, device, iters)
    setup_s = time.perf_counter() - t0
    model = trainer.pipeline.model
    n0 = int(model.num_points)

    times, cpu_times = [], []
    for step in range(iters):
        wall, cpu, loss = _timed_step(trainer, step, method, device)
        times.append(wall)
        cpu_times.append(cpu)
    return {**_timings(method, device, times, cpu_times, warmup), "setup_s": setup_s, "gaussians_start": n0,
            "final_loss": float(loss.detach()), "peak_rss_before_setup_mb": rss0,
            **_run_info(trainer, ply_fallback, device)}


def _run_info(trainer, ply_fallback: Optional[str], device: str) -> dict:
    """What a measurement reports of a trained run besides its timings (peak memory: this interpreter's so far)."""
    return {"gaussians_end": int(trainer.pipeline.model.num_points), "peak_rss_mb": peak_rss_mb(),
            "cuda_peak_allocated_mb": torch.cuda.max_memory_allocated() / 2 ** 20 if device == "cuda" else None,
            "param_groups": sorted(trainer.optimizers.optimizers), "threads": torch.get_num_threads(),
            "seed_ply_read_by": "open3d" if ply_fallback is None else f"plyfile (open3d unavailable: {ply_fallback})"}


def fox_seeded(ns: Path, out: Path, n: int = FOX_GAUSSIANS, seed: int = 0) -> Path:
    """The COLMAP'd fox dataset ``ns`` with ``n`` seed points: COLMAP's points and, for the rest, copies of random
    ones moved by N(0, (s / 2)^2) per axis (s: the point's mean distance to its 3 nearest neighbours, scipy's
    cKDTree), with their colours; the images linked, not copied. The scale of a densified splat from the start."""
    import numpy as np
    from plyfile import PlyData, PlyElement
    from scipy.spatial import cKDTree

    out.mkdir(parents=True, exist_ok=True)
    (out / "images").symlink_to(ns.resolve() / "images")
    shutil.copy(ns / "transforms.json", out / "transforms.json")
    v = PlyData.read(str(ns / "sparse_pc.ply"))["vertex"]
    xyz = np.stack([v["x"], v["y"], v["z"]], -1).astype(np.float64)
    rgb = np.stack([v["red"], v["green"], v["blue"]], -1)
    s = cKDTree(xyz).query(xyz, k=4)[0][:, 1:].mean(1)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(xyz), max(0, n - len(xyz)))
    pts = np.concatenate([xyz, xyz[pick] + rng.normal(size=(len(pick), 3)) * (s[pick, None] / 2)])
    cols = np.concatenate([rgb, rgb[pick]])
    arr = np.empty(len(pts), dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("red", "u1"), ("green", "u1"),
                                    ("blue", "u1")])
    for i, k in enumerate("xyz"):
        arr[k] = pts[:, i]
    for i, k in enumerate(("red", "green", "blue")):
        arr[k] = cols[:, i]
    PlyData([PlyElement.describe(arr, "vertex")]).write(str(out / "sparse_pc.ply"))
    return out


def _fox_config(teacher_cache: Path):
    def edit(c):
        if hasattr(c.pipeline.datamanager, "teacher"):  # rh3dgs's data manager (not nerfstudio's splatfacto)
            c.pipeline.datamanager.teacher.name = "tiny-clip"  # no features folder: the teacher at set-up
            c.pipeline.datamanager.teacher_cache_dir = teacher_cache
        if getattr(c.pipeline.model, "semantics", False):
            c.pipeline.model.init = "random"  # not the lift: that is the start of training, not an iteration
    return edit


def measure_pair(data: Path, iters: int = ITERS, warmup: int = WARMUP, device: str = "cpu", fox: bool = False) -> dict:
    """splatfacto and rh3dgs trained in this one interpreter, their iterations interleaved (step s of both, the order
    swapped every step: neither always runs on the other's cache state): both see the same minutes of a shared
    machine. Per method what :func:`measure_training` reports (peak RSS and GPU memory: the two together). ``fox``: the fox
    row's configuration (:func:`_fox_config`: teacher tiny-clip, latents initialised at random)."""
    with tempfile.TemporaryDirectory(prefix="rh3dgs_bench_nstrain_") as tmp, _own_event_writers():
        edit = _fox_config(Path(tmp) / "teacher_cache") if fox else None
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        trainers, fallback, setup = {}, {}, {}
        for m in ("splatfacto", "rh3dgs"):
            t0 = time.perf_counter()
            trainers[m], fallback[m] = _setup_trainer(m, data, Path(tmp) / m, device, iters, edit)
            setup[m] = time.perf_counter() - t0
        n0 = {m: int(t.pipeline.model.num_points) for m, t in trainers.items()}
        times = {m: ([], []) for m in trainers}
        order = list(trainers)
        for step in range(iters):
            for m in (order if step % 2 == 0 else order[::-1]):
                wall, cpu = _timed_step(trainers[m], step, m, device)[:2]
                times[m][0].append(wall)
                times[m][1].append(cpu)
        return {m: {**_timings(m, device, *times[m], warmup), "setup_s": setup[m], "gaussians_start": n0[m],
                    **_run_info(t, fallback[m], device)}
                for m, t in trainers.items()}


def _pair_row(data: Path, iters: int, warmup: int, device: str, fox: bool) -> dict:
    """One row of the table: :func:`measure_pair` in a child interpreter, and the ratios rh3dgs / splatfacto."""
    pair = run_isolated(__file__, ["--only", json.dumps({"method": "pair", "data": str(data), "iters": iters,
                                                         "warmup": warmup, "device": device, "fox": fox})])
    ours, base = pair["rh3dgs"], pair["splatfacto"]
    return {"baseline": base, "rh3dgs": ours, "ratio_rh3dgs_to_splatfacto": ours["mean_ms"] / base["mean_ms"],
            "ratio_median": ours["median_ms"] / base["median_ms"],
            "ratio_cpu_time": ours["cpu_mean_ms"] / base["cpu_mean_ms"]}


def measure(spec: str) -> dict:
    """Child of :func:`run_isolated`: ``spec`` is JSON ``{"method", "data", "iters", "warmup", "device"}``
    (method "pair": :func:`measure_pair`, with ``"fox"``)."""
    kw = json.loads(spec)
    if kw["method"] == "pair":
        return measure_pair(Path(kw["data"]), kw["iters"], kw["warmup"], kw["device"], kw.get("fox", False))
    return measure_training(kw["method"], Path(kw["data"]), kw["iters"], kw["warmup"], kw["device"])


def fox_row(device: str, warmup: int = WARMUP) -> Tuple[Optional[dict], str]:
    """The real fox photos (``shared/realdata``, 4x downscaled, COLMAP'd by bench_real) with FOX_GAUSSIANS seed points
    (:func:`fox_seeded`): both methods in one child interpreter, iterations interleaved (:func:`measure_pair`).
    Returns the row (None when the data is missing) and a sentence on how it was measured or why not."""
    from bench_real import fox_dataset, realdata_dir

    root = realdata_dir()
    ns = fox_dataset(root) if root is not None else None
    if ns is None:
        return None, ("fox row skipped: " + ("shared/realdata not found (set RH3DGS_REALDATA)" if root is None
                                             else "ns-process-data (COLMAP) gave no dataset"))
    size = json.loads((ns / "transforms.json").read_text())
    with tempfile.TemporaryDirectory(prefix="rh3dgs_bench_nstrain_fox_") as tmp:
        data = fox_seeded(ns, Path(tmp) / "fox")
        row = _pair_row(data, FOX_ITERS, warmup, device, fox=True)
    from plyfile import PlyData

    colmap_points = PlyData.read(str(ns / "sparse_pc.ply"))["vertex"].count
    row["label"] = f"fox {size['w']}x{size['h']}"
    note = (f"fox: the {len(size['frames'])} real photos 4x downscaled ({size['w']}x{size['h']}, bench_real's COLMAP poses), "
            f"{FOX_GAUSSIANS:,} seed points (COLMAP's {colmap_points:,} and jittered copies: "
            "`fox_seeded`, the size of a densified splat), teacher tiny-clip (random-initialised open_clip), "
            f"the latents initialised at random (the lift at the start, ~50 s at this size, is not an iteration); "
            f"{FOX_ITERS} iterations, mean over iterations {warmup}..{FOX_ITERS - 1}")
    return row, note


def main(iters: int = ITERS, warmup: int = WARMUP, device: Optional[str] = None,
         sizes: Optional[Sequence[int]] = None, fox: bool = True) -> dict:
    device = device or default_device()
    sizes = tuple(sizes or default_sizes())
    t0 = time.time()
    per_size = {}
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="rh3dgs_bench_nstrain_data_") as tmp:
            data = make_data(Path(tmp) / "data", size=size)
            per_size[f"{size}x{size}"] = _pair_row(data, iters, warmup, device, fox=False)
    fox = fox and os.environ.get("RH3DGS_BENCH_NSTRAIN_FOX", "1") != "0"
    fox, fox_note = fox_row(device, warmup) if fox else (None, "fox row not run (RH3DGS_BENCH_NSTRAIN_FOX=0)")
    if fox is not None:
        per_size[fox.pop("label")] = fox
    payload = {"setting": {"views": VIEWS, "sizes": list(sizes), "iters": iters, "warmup": warmup, "device": device,
                           "fox": fox_note},
               "sizes": {str(k): v for k, v in per_size.items()}, "seconds": time.time() - t0, "machine": machine()}
    gpu = device == "cuda"

    def row(label, r):
        cells = [label, r["label"], f"{r['mean_ms']:.1f}", f"{r['median_ms']:.1f}",
                 f"{r['cpu_mean_ms']:.1f}",
                 f"{r['gaussians_start']} -> {r['gaussians_end']}", f"{r['setup_s']:.1f}", f"{r['peak_rss_mb']:.0f}"]
        if gpu:
            cells.append(f"{r['cuda_peak_allocated_mb']:.0f}" if r.get("cuda_peak_allocated_mb") is not None else "-")
        return "| " + " | ".join(cells) + " |"

    head = ("| image | method | mean ms/iter | median ms/iter | CPU ms/iter (mean) | Gaussians | setup (s) "
            "| peak RSS (MB) |")
    sep = "|---|---|---|---|---|---|---|---|"
    if gpu:
        head, sep = head + " peak GPU alloc (MB) |", sep + "---|"
    rows = "\n".join(row(s_, r[m]) for s_, r in per_size.items() for m in ("baseline", "rh3dgs"))
    ratios = "\n".join(f"- {s_}: **rh3dgs / splatfacto: {r['ratio_rh3dgs_to_splatfacto']:.2f}x** mean time per "
                       f"iteration ({r['ratio_median']:.2f}x median, {r['ratio_cpu_time']:.2f}x CPU time)"
                       + (f" (target <= {TARGET_RATIO}x: **{'met' if r['ratio_rh3dgs_to_splatfacto'] <= TARGET_RATIO else 'NOT met'}**)")
                       for s_, r in per_size.items())
    first = next(iter(per_size.values()))  # the synthetic scene's first size
    ours, base = first["rh3dgs"], first["baseline"]
    md = (f"# ns-train: rh3dgs vs splatfacto iteration time ({device})\n\n"
          f"Synthetic scene, {VIEWS} views per image size, {iters} iterations of the rh3dgs-lite schedule "
          f"(densification steps 60-200, the default objective: VCD + VFM + LIC + ray term), mean over iterations {warmup}..{iters - 1}; both methods "
          "trained in-process by nerfstudio's Trainer in this run, in one interpreter with their iterations interleaved "
          "step by step, the order swapped every step (one set-up each; peak RSS of the two together); "
          f"torch threads: {ours['threads']}, CPUs: {machine()['cpu_count']}. Iteration = what nerfstudio's "
          "ITER_TRAIN_TIME covers (callbacks, forward, losses, metrics, backward, optimizer step, densification).\n\n"
          + (f"Baseline: {base['label']}. " if gpu else
             f"Baseline: {base['label']} - nerfstudio's splatfacto needs CUDA; this is its model, losses and "
             "densification on rh3dgs's CPU rasterizer without latents, decoder or teacher. ")
          + f"Seed point cloud ({ours['gaussians_start']} points) read by {ours.get('seed_ply_read_by', 'open3d')}. {fox_note}."
          + f"\n\n{head}\n{sep}\n{rows}\n\n{ratios}\n\n"
          f"1-min load average {os.getloadavg()[0]:.1f} at the end; {payload['seconds']:.0f} s in all\n")
    return write_results("nstrain", payload, md)


if __name__ == "__main__":
    entry(measure, main)
