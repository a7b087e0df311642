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
  rasterizer, an LPIPS download), so the baseline is the same preset with ``semantics=False``,
  which builds :class:`rh3dgs.nerfstudio.splatfacto_cpu.SplatfactoCPUModel` (the class the rh3dgs
  model extends): splatfacto's parameters, losses, metrics and densification on rh3dgs's CPU
  rasterizer; no latents, decoder or teacher. Labelled "splatfacto (CPU port: rh3dgs model,
  semantics off)".

Both start from the same seed point cloud (every point, no subsampling). Each method runs in its
own interpreter (``run_isolated``) so that its peak RSS (and on CUDA its peak allocated GPU
memory) is its own.

    python benchmarks/bench_nstrain.py                # device: CUDA when available, else CPU
    RH3DGS_BENCH_DEVICE=cpu python benchmarks/bench_nstrain.py
    RH3DGS_BENCH_NSTRAIN_SIZES=256 python benchmarks/bench_nstrain.py   # image sides (default 64,256)
    OMP_NUM_THREADS=1 python benchmarks/bench_nstrain.py   # on a CPU shared with other jobs

Each image size gets its own synthetic dataset (the same scene and ~4k seed points, the
``rh3dgs-lite`` preset's own cap) and one row per method: ``ROUNDS`` interleaved runs of the two
(this VM's speed drifts by ~20 % between runs a minute apart: four single-pair runs of one build gave
1.16-1.47x at 256x256), the median of each timing and of the per-round ratios.

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
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import entry, machine, peak_rss_mb, run_isolated, write_results  # noqa: E402

ITERS, WARMUP = 300, 10
ROUNDS = 3  # interleaved (splatfacto, rh3dgs) pairs per image size
VIEWS, SIZES, DENSITY = 12, (64, 256), 300.0  # ~4k seed points (the synthetic scene's Gaussian centres)
LABELS = {
    "rh3dgs": "rh3dgs (rh3dgs-lite preset)",
    "splatfacto:cuda": "splatfacto (nerfstudio)",
    "splatfacto:cpu": "splatfacto (CPU port: rh3dgs model, semantics off)",
}


def default_device() -> str:
    return os.environ.get("RH3DGS_BENCH_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


def _median_run(runs):
    """One row from several runs of a method: the median of each timing, the rest of the first run."""
    keys = ("mean_ms", "median_ms", "cpu_mean_ms", "min_ms", "max_ms")
    return {**runs[0], **{k: statistics.median(r[k] for r in runs) for k in keys if k in runs[0]}}


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
    from rh3dgs.nerfstudio.config import make_optimizers, rh3dgs_lite_config

    c = rh3dgs_lite_config()
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
    elif method == "splatfacto":
        c.pipeline.model.semantics = False
    elif method != "rh3dgs":
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
        from rh3dgs.nerfstudio.splatfacto_cpu import NoLPIPS, alexnet_weights_available

        if not alexnet_weights_available():
            import torchmetrics.image.lpip as lpip

            saved.append((lpip, "LearnedPerceptualImagePatchSimilarity", lpip.LearnedPerceptualImagePatchSimilarity))
            lpip.LearnedPerceptualImagePatchSimilarity = lambda *a, **k: NoLPIPS()
    try:
        yield why
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def measure_training(method: str, data: Path, iters: int = ITERS, warmup: int = WARMUP, device: str = "cpu",
                     out: Optional[Path] = None) -> dict:
    """Train ``method`` for ``iters`` iterations in this process; per-iteration times (see module docstring)."""
    from nerfstudio.engine.callbacks import TrainingCallbackLocation

    if warmup >= iters:
        raise ValueError(f"warmup ({warmup}) must be < iters ({iters})")
    cuda = device == "cuda"
    tmp = None
    if out is None:
        tmp = tempfile.TemporaryDirectory(prefix="rh3dgs_bench_nstrain_")
        out = Path(tmp.name)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    rss0 = peak_rss_mb()
    t0 = time.perf_counter()
    with _setup_shims(cuda) as ply_fallback:
        trainer = method_config(method, Path(data), Path(out), device, iters).setup(local_rank=0, world_size=1)
        trainer.setup()
    setup_s = time.perf_counter() - t0
    model = trainer.pipeline.model
    n0 = int(model.num_points)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    times, cpu_times = [], []
    for step in range(iters):  # nerfstudio's Trainer.train() loop body, the part its ITER_TRAIN_TIME times
        sync()
        t, c = time.perf_counter(), time.process_time()
        trainer.step = step
        trainer.pipeline.train()
        for cb in trainer.callbacks:
            cb.run_callback_at_location(step, location=TrainingCallbackLocation.BEFORE_TRAIN_ITERATION)
        loss, _, _ = trainer.train_iteration(step)
        for cb in trainer.callbacks:
            cb.run_callback_at_location(step, location=TrainingCallbackLocation.AFTER_TRAIN_ITERATION)
        sync()
        times.append(time.perf_counter() - t)
        cpu_times.append(time.process_time() - c)
        if not torch.isfinite(loss):
            raise RuntimeError(f"{method}: non-finite loss at step {step}")
    timed, cpu_timed = times[warmup:], cpu_times[warmup:]
    res = {"method": method, "label": LABELS.get(method if method == "rh3dgs" else f"{method}:{'cuda' if cuda else 'cpu'}"),
           "device": device, "iters": iters, "warmup": warmup,
           "mean_ms": 1000 * statistics.fmean(timed), "median_ms": 1000 * statistics.median(timed),
           "min_ms": 1000 * min(timed), "max_ms": 1000 * max(timed), "cpu_mean_ms": 1000 * statistics.fmean(cpu_timed),
           "setup_s": setup_s,
           "gaussians_start": n0, "gaussians_end": int(model.num_points), "final_loss": float(loss.detach()),
           "peak_rss_mb": peak_rss_mb(), "peak_rss_before_setup_mb": rss0,
           "cuda_peak_allocated_mb": torch.cuda.max_memory_allocated() / 2 ** 20 if cuda else None,
           "param_groups": sorted(trainer.optimizers.optimizers), "threads": torch.get_num_threads(),
           "seed_ply_read_by": "open3d" if ply_fallback is None else
           f"plyfile (open3d unavailable: {ply_fallback})"}
    if tmp is not None:
        tmp.cleanup()
    return res


def measure(spec: str) -> dict:
    """Child of :func:`run_isolated`: ``spec`` is JSON ``{"method", "data", "iters", "warmup", "device"}``."""
    kw = json.loads(spec)
    return measure_training(kw["method"], Path(kw["data"]), kw["iters"], kw["warmup"], kw["device"])


def main(iters: int = ITERS, warmup: int = WARMUP, device: Optional[str] = None,
         sizes: Optional[Sequence[int]] = None) -> dict:
    device = device or default_device()
    sizes = tuple(sizes or default_sizes())
    t0 = time.time()
    per_size = {}
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="rh3dgs_bench_nstrain_data_") as tmp:
            data = make_data(Path(tmp) / "data", size=size)
            # interleaved rounds (splatfacto, rh3dgs, splatfacto, rh3dgs, ...): this VM's speed drifts by ~20 %
            # between runs a minute apart, which a single pair measured it in full
            rounds = [{m: run_isolated(__file__, ["--only", json.dumps({"method": m, "data": str(data), "iters": iters,
                                                                           "warmup": warmup, "device": device})])
                       for m in ("splatfacto", "rh3dgs")} for _ in range(ROUNDS)]
        ours, base = _median_run([r["rh3dgs"] for r in rounds]), _median_run([r["splatfacto"] for r in rounds])
        ratio = lambda key: statistics.median(r["rh3dgs"][key] / r["splatfacto"][key] for r in rounds)  # noqa: E731
        per_size[size] = {"baseline": base, "rh3dgs": ours, "rounds": rounds,
                          "ratio_rh3dgs_to_splatfacto": ratio("mean_ms"), "ratio_median": ratio("median_ms"),
                          "ratio_cpu_time": ratio("cpu_mean_ms"),
                          "ratio_per_round": [r["rh3dgs"]["mean_ms"] / r["splatfacto"]["mean_ms"] for r in rounds]}
    payload = {"setting": {"views": VIEWS, "sizes": list(sizes), "iters": iters, "warmup": warmup, "device": device},
               "sizes": {str(k): v for k, v in per_size.items()}, "seconds": time.time() - t0, "machine": machine()}
    gpu = device == "cuda"

    def row(size, r):
        cells = [f"{size}x{size}", r["label"], f"{r['mean_ms']:.1f}", f"{r['median_ms']:.1f}",
                 f"{r['cpu_mean_ms']:.1f}",
                 f"{r['gaussians_start']} -> {r['gaussians_end']}", f"{r['setup_s']:.1f}", f"{r['peak_rss_mb']:.0f}"]
        if gpu:
            cells.append(f"{r['cuda_peak_allocated_mb']:.0f}")
        return "| " + " | ".join(cells) + " |"

    head = ("| image | method | mean ms/iter | median ms/iter | CPU ms/iter (mean) | Gaussians | setup (s) "
            "| peak RSS (MB) |")
    sep = "|---|---|---|---|---|---|---|---|"
    if gpu:
        head, sep = head + " peak GPU alloc (MB) |", sep + "---|"
    rows = "\n".join(row(s_, r[m]) for s_, r in per_size.items() for m in ("baseline", "rh3dgs"))
    ratios = "\n".join(f"- {s_}x{s_}: **rh3dgs / splatfacto: {r['ratio_rh3dgs_to_splatfacto']:.2f}x** mean time per "
                       f"iteration ({r['ratio_median']:.2f}x median, {r['ratio_cpu_time']:.2f}x CPU time); per round: "
                       + ", ".join(f"{x:.2f}x" for x in r["ratio_per_round"])
                       for s_, r in per_size.items())
    first = next(iter(per_size.values()))
    ours, base = first["rh3dgs"], first["baseline"]
    md = (f"# ns-train: rh3dgs vs splatfacto iteration time ({device})\n\n"
          f"Synthetic scene, {VIEWS} views per image size, {iters} iterations of the rh3dgs-lite schedule "
          f"(densification steps 60-200, the default objective: VCD + VFM + LIC + ray term), mean over iterations {warmup}..{iters - 1}; both methods "
          f"trained in-process by nerfstudio's Trainer in this run, each in its own interpreter, {ROUNDS} interleaved "
          "rounds (splatfacto, rh3dgs, ...): the rows give the median over the rounds, the ratios the median of the "
          "per-round ratios; "
          f"torch threads: {ours['threads']}, CPUs: {machine()['cpu_count']}. Iteration = what nerfstudio's "
          "ITER_TRAIN_TIME covers (callbacks, forward, losses, metrics, backward, optimizer step, densification).\n\n"
          + (f"Baseline: {base['label']}. " if gpu else
             f"Baseline: {base['label']} - nerfstudio's splatfacto needs CUDA; this is its model, losses and "
             "densification on rh3dgs's CPU rasterizer without latents, decoder or teacher. ")
          + f"Seed point cloud ({ours['gaussians_start']} points) read by {ours['seed_ply_read_by']}."
          + f"\n\n{head}\n{sep}\n{rows}\n\n{ratios}\n\n"
          f"1-min load average {os.getloadavg()[0]:.1f} at the end; {payload['seconds']:.0f} s in all\n")
    return write_results("nstrain", payload, md)


if __name__ == "__main__":
    entry(measure, main)
