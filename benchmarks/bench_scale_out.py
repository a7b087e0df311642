"""The lift and the distillation over K = 1 and K = 2 processes on this machine (torch.distributed, gloo).

Each K is its own launch: K = 1 a plain interpreter (every core to its threads), K = 2 ``torchrun
--nproc_per_node 2`` (one thread per rank: the same cores). Per run: seconds per pass (the lift) or per step
(the distillation), the bytes each collective sent per call (``rh3dgs.distributed.TRAFFIC``), and each
process's peak resident memory (VmHWM).

* lift: the 1M-Gaussian, 300-view, 64x64, D = 64 scene of ``bench_scale.py`` (maps streamed per view);
* distill: 200k Gaussians, 24 views of 128x128, D = 64, d = 16, 20 steps of 4 views (the lift first).

* pixels: 50k Gaussians, 16 views of 256x256 (one process): the per-pixel cost of a pass, for the model.

The model of a 50M-Gaussian, 5,000-view scene on 8 and 64 GPUs built from these numbers (:func:`_model`, its
assumptions in :data:`TARGET`, :data:`GPU` and the report) is scale_out.md's last part.

    python benchmarks/bench_scale_out.py            # measure and report (37 min at a load of 10-18 on 2 cores)
    python benchmarks/bench_scale_out.py --report   # the report again from results/scale_out.json
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_peak_fma, entry, machine, orbit, peak_rss_mb, random_scene, run_isolated, write_results  # noqa: E402

LIFT = {"gaussians": 1_000_000, "views": 300, "size": 64, "D": 64, "scale": 0.009}
PIXELS = {"gaussians": 50_000, "views": 16, "size": 256, "D": 64, "scale": 0.02}
DISTILL = {"gaussians": 200_000, "views": 24, "size": 128, "D": 64, "latent_dim": 16, "steps": 20, "views_per_step": 4,
           "scale": 0.015}
if os.environ.get("RH3DGS_BENCH_QUICK"):  # a dry run of the same code in a minute (results not meaningful)
    LIFT = dict(LIFT, gaussians=20_000, views=16, scale=0.03)
    PIXELS = dict(PIXELS, gaussians=5_000, views=4, size=128)
    DISTILL = dict(DISTILL, gaussians=10_000, views=8, size=64, steps=4)


def _maps(size: int, D: int):
    def get(i: int) -> torch.Tensor:  # at patch resolution, made on demand (a cache read)
        g = torch.Generator().manual_seed(i)
        return torch.nn.functional.normalize(torch.randn(size // 8, size // 8, D, generator=g) + 1.0, dim=-1)
    return get


def _traffic() -> Dict[str, Dict[str, float]]:
    from rh3dgs.distributed import TRAFFIC

    return {k: {"calls": len(v), "bytes_total": int(sum(v)), "bytes_per_call_max": int(max(v)),
                "bytes_per_call_mean": float(sum(v) / len(v))} for k, v in TRAFFIC.items()}


def _lift() -> Dict:
    from rh3dgs.lifting import LiftConfig, lift

    s = LIFT
    g, cams = random_scene(s["gaussians"], scale=s["scale"]), orbit(s["views"], s["size"])
    t, c = time.perf_counter(), time.process_time()
    res = lift(g, cams, _maps(s["size"], s["D"]), LiftConfig(method="robust"), progress=False)
    info = res.info
    return {"seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c,
            "seconds_per_pass": info["seconds_per_pass"],
            "passes": info["passes"], "valid": info["valid"], "cache": info["cache"],
            "shares": {k: info[k] for k in ("views_by_rank", "owned_by_rank", "seen_by_rank") if k in info},
            "peak_rss_mb": peak_rss_mb(), "traffic": _traffic(), "threads": torch.get_num_threads()}


def _distill() -> Dict:
    from rh3dgs.distill import DistillConfig, distill

    s = DISTILL
    g, cams = random_scene(s["gaussians"], scale=s["scale"]), orbit(s["views"], s["size"])
    t, c = time.perf_counter(), time.process_time()
    res = distill(g, cams, _maps(s["size"], s["D"]), DistillConfig(steps=s["steps"], views_per_step=s["views_per_step"],
                                                                    latent_dim=s["latent_dim"]))
    seconds = time.perf_counter() - t
    info = res.info
    return {"seconds": seconds, "cpu_seconds": time.process_time() - c, "seconds_init": info["seconds_init"],
            "seconds_per_step": (seconds - info["seconds_init"]) / s["steps"], "final_loss": info["final_loss"],
            "peak_rss_mb": peak_rss_mb(), "traffic": _traffic(), "threads": torch.get_num_threads(),
            "latents_sum": float(res.latents.double().abs().sum())}


def _pixels() -> Dict:
    """The lift's first pass where pixels dominate: 50k Gaussians, 16 views of 256x256 (D = 64, one process)."""
    from rh3dgs.lifting import LiftConfig, lift

    s = PIXELS
    g, cams = random_scene(s["gaussians"], scale=s["scale"]), orbit(s["views"], s["size"])
    t, c = time.perf_counter(), time.process_time()
    res = lift(g, cams, _maps(s["size"], s["D"]), LiftConfig(method="robust"), progress=False)
    return {"seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c,
            "seconds_per_pass": res.info["seconds_per_pass"]}


def measure(part: str) -> Dict:
    """One process's run of ``part`` ("lift" or "distill"); under torchrun each rank's, saved to $RH3DGS_BENCH_OUT."""
    from rh3dgs.distributed import process_group_from_env

    with process_group_from_env() as group:
        out = {"lift": _lift, "distill": _distill, "pixels": _pixels}[part]()
        out["rank"] = 0 if group is None else group.rank
    if os.environ.get("RH3DGS_BENCH_OUT"):
        Path(os.environ["RH3DGS_BENCH_OUT"], f"rank{out['rank']}.json").write_text(json.dumps(out))
    return out


def _two(part: str) -> List[Dict]:
    """``part`` over two processes (torchrun, one thread each); each rank's JSON."""
    exe = Path(sys.executable).parent / "torchrun"
    launcher = [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]
    with tempfile.TemporaryDirectory(prefix="rh3dgs_scale_out_") as tmp:
        env = dict(os.environ, OMP_NUM_THREADS="1", RH3DGS_BENCH_OUT=tmp, RH3DGS_QUIET="1")
        subprocess.run(launcher + ["--standalone", "--nproc_per_node", "2", __file__, "--only", part], check=True,
                       env=env, capture_output=True, text=True)
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]


def _bytes(n: float) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{n:.0f} B"


def _traffic_rows(ranks: List[Dict]) -> str:
    names = sorted({k for r in ranks for k in r["traffic"]})
    rows = []
    for k in names:
        t = [r["traffic"].get(k, {"calls": 0, "bytes_total": 0, "bytes_per_call_max": 0}) for r in ranks]
        rows.append(f"| {k} | {' / '.join(str(x['calls']) for x in t)} | "
                    f"{' / '.join(_bytes(x['bytes_per_call_max']) for x in t)} | "
                    f"{' / '.join(_bytes(x['bytes_total']) for x in t)} |")
    return "| collective | calls (rank 0 / 1) | bytes per call, largest | bytes in all |\n|---|---|---|---|\n" + \
        "\n".join(rows) + "\n"


# ------------------------------------------------------------------------------------------------ the model
TARGET = {"gaussians": 50e6, "views": 5000, "width": 1920, "height": 1080, "D": 128, "d": 16, "passes": 2,
          "in_view": 0.05, "halo": 2.0, "scene_floats": 59}
"""The modelled scene: 50M Gaussians (SH degree 3: 59 floats each), 5,000 views of 1920x1080, CLIP features
lifted in the 128-dim subspace (``LiftConfig.subspace``), d = 16 latents, the default two passes; a view's
frustum holds 5 % of the Gaussians; a rank's consecutive views see ``halo`` x N / K Gaussians (its region and
the neighbouring ones), up to N."""
GPU = {"name": "H100 SXM 80 GB", "fma_per_s": 33.5e12, "mem_bytes": 80e9, "hbm_bytes_per_s": 3.35e12,
       "nvlink_bytes_per_s": 200e9, "net_bytes_per_s": 40e9, "gpus_per_node": 8}
"""The GPUs and interconnect: fp32 FMA rate, memory, HBM bandwidth; per GPU 200 GB/s within a node (NVLink 4 at
~45 % of its 450 GB/s per direction, as NCCL's all-to-all gets) and 40 GB/s between nodes (one 400 Gb/s NDR
InfiniBand port per GPU at 80 %)."""


def _model(lift1: Dict, pixels: Dict, dist1: Dict, cpu: Dict) -> Dict:
    """Seconds, bytes and memory of the lift and the distillation of :data:`TARGET` on 8 and 64 :data:`GPU` s, from
    this run's one-process costs (see scale_out.md for the reasoning)."""
    s, p, t, g = LIFT, PIXELS, TARGET, GPU
    speed = g["fma_per_s"] / cpu["peak_fma_per_s_per_core"]  # a GPU = this many of this CPU's cores, at the same
    #                                                          fraction of peak as our CPU kernels reach
    # core-seconds, from the CPU time of the run (a shared machine's wall time is not): each pass's share of it
    core = lambda run, wall: wall * run["cpu_seconds"] / run["seconds"]  # noqa: E731
    # a first pass = Gaussians in view x a + pixels x channels x b: the 1M-Gaussian 64x64 run is Gaussian-bound,
    # the 50k-Gaussian 256x256 one pixel-bound; each gives one cost once the other's (small) share is taken off
    gauss_view = core(lift1, lift1["seconds_per_pass"][0]) / (s["views"] * s["gaussians"])
    px_cost = max(0.0, core(pixels, pixels["seconds_per_pass"][0]) - p["views"] * p["gaussians"] * gauss_view) \
        / (p["views"] * p["size"] ** 2 * p["D"])
    gauss_view = max(0.0, gauss_view - s["size"] ** 2 * s["D"] * px_cost / s["gaussians"])
    gauss_cost = core(lift1, lift1["seconds"] - sum(lift1["seconds_per_pass"])) / s["gaussians"]  # fill, PCA
    N, V, HW, D = t["gaussians"], t["views"], t["width"] * t["height"], t["D"]
    t_view = (t["in_view"] * N * gauss_view + HW * D * px_cost) / speed  # every pass: no cache across passes
    d = DISTILL
    step_px = core(dist1, dist1["seconds_per_step"]) / (d["views_per_step"] * d["size"] ** 2 * d["latent_dim"])
    rows = []
    for K in (8, 64):
        seen = min(N, t["halo"] * N / K)
        bw = g["nvlink_bytes_per_s"] if K <= g["gpus_per_node"] else g["net_bytes_per_s"]
        sums_bytes = seen * (D + 2) * 4  # to the owners, then the new means (D + 1: with the active flag) back
        back_bytes = seen * (D + 1) * 4
        t_pass = V / K * t_view
        t_exchange = (sums_bytes + back_bytes) / bw
        t_finish = N / K * gauss_cost / speed
        scene = N * t["scene_floats"] * 4
        mem = 2 * scene + seen * t["scene_floats"] * 4 + seen * (2 * D + 3) * 4 + N / K * (4 * D + 5) * 4 \
            + HW * D * 4 * 3  # the scene and its Z-order copy, the seen sub-scene and sums, the owned block, a view
        grad_bytes = (N * t["d"] + 512 * t["d"] + t["d"]) * 4
        allreduce = 2 * (K - 1) / K * grad_bytes / bw
        step_compute = HW * t["d"] * step_px / speed + 6 * N * t["d"] * 4 / g["hbm_bytes_per_s"]  # a view, Adam
        fixed_views = V / K * HW * 20 * 24  # the views' compositing weights kept by distill(): 20 per pixel, 24 B
        rows.append({"gpus": K, "seen_per_rank": seen, "lift_seconds_per_pass_compute": t_pass,
                     "lift_bytes_per_pass_per_rank": sums_bytes + back_bytes, "lift_seconds_per_pass_exchange": t_exchange,
                     "lift_seconds_finish": t_finish, "lift_seconds": t["passes"] * (t_pass + t_exchange) + t_finish,
                     "lift_memory_per_rank": mem, "distill_allreduce_bytes": grad_bytes,
                     "distill_seconds_per_step_allreduce": allreduce, "distill_seconds_per_step_compute": step_compute,
                     "distill_fixed_views_bytes_per_rank": fixed_views})
    return {"target": t, "gpu": g, "gpu_over_cpu_core": speed, "costs": {
        "pass_core_seconds_per_view_gaussian": gauss_view, "pass_core_seconds_per_pixel_channel": px_cost,
        "lift_core_seconds_per_gaussian_after_passes": gauss_cost, "distill_core_seconds_per_pixel_latent": step_px,
        "modelled_gpu_seconds_per_view_pass": t_view}, "rows": rows}


def _model_md(m: Dict) -> str:
    c, t, g = m["costs"], m["target"], m["gpu"]
    head = "| | " + " | ".join(f"{r['gpus']} GPUs" for r in m["rows"]) + " |\n|---|" + "---|" * len(m["rows"]) + "\n"
    row = lambda name, f: f"| {name} | " + " | ".join(f(r) for r in m["rows"]) + " |\n"  # noqa: E731
    gb = lambda x: f"{x / 1e9:.1f} GB"  # noqa: E731
    sec = lambda x: f"{x:.2f} s" if x < 100 else f"{x / 60:.1f} min"  # noqa: E731
    return (
        f"\n## model: {t['gaussians'] / 1e6:.0f}M Gaussians, {t['views']} views of {t['width']}x{t['height']}, "
        f"on 8 and 64 GPUs ({g['name']})\n\n"
        "Measured here (one process; core-seconds: each part's wall time x the run's CPU time / wall time, as the "
        "machine is shared), a pass of the lift costs "
        f"{c['pass_core_seconds_per_view_gaussian'] * 1e9:.0f} ns per (view, Gaussian in view) (projection, "
        f"binning, the compact cache: the 1M-Gaussian 64x64 run) + {c['pass_core_seconds_per_pixel_channel'] * 1e9:.1f}"
        f" ns per (pixel, channel) (compositing, weights, maps, aggregation: the 50k-Gaussian 256x256 run); after the "
        f"passes (fill, PCA, reordering) {c['lift_core_seconds_per_gaussian_after_passes'] * 1e6:.2f} us per Gaussian; "
        f"a distillation step {c['distill_core_seconds_per_pixel_latent'] * 1e9:.0f} ns per (pixel, latent channel) "
        "(all of a step's cost put on its pixels: an upper bound at larger images). At this size no pass is cached "
        "(the 2 GB cache holds a few 1080p views), so every pass costs the first one's.\n\n"
        "Assumptions: (1) a GPU does this work at the fraction of its peak fp32 FMA rate that our CPU kernels reach of "
        f"this core's, so one GPU = {m['gpu_over_cpu_core']:.0f} of these cores ({g['fma_per_s'] / 1e12:.1f} TFMA/s "
        "against the core's peak); (2) the per-view work scales with pixels x channels and, for the projection, with "
        f"the Gaussians in the frustum ({100 * t['in_view']:.0f} % of them); (3) a rank's contiguous share of a "
        f"capture's views sees {t['halo']:.0f} x N / K Gaussians (its region and the neighbouring ones); (4) the lift "
        f"runs {t['passes']} passes (the default: the weighted mean and one IRLS step), D = {t['D']} (CLIP's 512 in "
        f"the lift's subspace); (5) interconnect: {g['nvlink_bytes_per_s'] / 1e9:.0f} GB/s per GPU within a node "
        f"(NVLink), {g['net_bytes_per_s'] / 1e9:.0f} GB/s across nodes (8 GPUs per node); (6) the distillation "
        "renders one view per rank per step, its Adam update is memory-bound (6 passes over N x d floats).\n\n"
        + head
        + row("Gaussians a rank sees", lambda r: f"{r['seen_per_rank'] / 1e6:.1f}M")
        + row("lift: compute per pass", lambda r: sec(r["lift_seconds_per_pass_compute"]))
        + row("lift: bytes per pass per rank (sums out, means back)", lambda r: gb(r["lift_bytes_per_pass_per_rank"]))
        + row("lift: exchange per pass", lambda r: sec(r["lift_seconds_per_pass_exchange"]))
        + row("lift: fill, PCA (owned rows)", lambda r: sec(r["lift_seconds_finish"]))
        + row("**lift: total**", lambda r: f"**{sec(r['lift_seconds'])}**")
        + row("lift: memory per rank", lambda r: gb(r["lift_memory_per_rank"]))
        + row("distill: gradient all_reduce per step", lambda r: gb(r["distill_allreduce_bytes"]))
        + row("distill: all_reduce seconds per step (ring)", lambda r: sec(r["distill_seconds_per_step_allreduce"]))
        + row("distill: compute per step", lambda r: sec(r["distill_seconds_per_step_compute"]))
        + row("distill: fixed views' weights per rank", lambda r: gb(r["distill_fixed_views_bytes_per_rank"]))
        + _reading(m))


def _reading(m: Dict) -> str:
    """What the table says, from its numbers."""
    r8, r64 = m["rows"]
    fits = [r["gpus"] for r in m["rows"] if r["lift_memory_per_rank"] < m["gpu"]["mem_bytes"]]
    comm = max(r["lift_seconds_per_pass_exchange"] / r["lift_seconds_per_pass_compute"] for r in m["rows"])
    fixed = [r["gpus"] for r in m["rows"] if r["distill_fixed_views_bytes_per_rank"] < m["gpu"]["mem_bytes"] / 2]
    ar = max(r["distill_seconds_per_step_allreduce"] / r["distill_seconds_per_step_compute"] for r in m["rows"])
    return (f"\nReading it: the lift's exchange per pass is at most {100 * comm:.1f} % of its compute (each Gaussian a "
            f"rank sees sends its D + 2 sums once per pass and gets its mean back); {8 * r8['lift_seconds'] / (64 * r64['lift_seconds']):.2f} "
            f"of the ideal 8 -> 64 GPU speed-up is kept (the finishing and the halo of seen Gaussians do not shrink "
            f"with the views). Memory per rank fits an {m['gpu']['name']} on "
            f"{' and '.join(map(str, fits)) or 'neither'} GPUs; the scene itself (the loaded one and its Z-order copy, "
            f"N x 59 floats each, on every rank) is its largest part. The distillation as built keeps every view's "
            f"compositing weights (fixed geometry: ~24 B per contribution, 20 contributions per pixel), which fit half "
            f"a GPU on {' and '.join(map(str, fixed)) or 'neither of these'} GPU counts: at this size its views would "
            f"have to be re-rendered each step (not built). Its dense gradient all_reduce (N x d floats every step) "
            f"costs up to {ar:.2f} x a step's compute; a sparse one over the rows the step's views touch would cost "
            f"their share.\n")


def main() -> Dict:
    """Every part, then :func:`report`."""
    load0 = os.getloadavg()[1]
    lift1 = run_isolated(__file__, ["--only", "lift"])
    pixels = run_isolated(__file__, ["--only", "pixels"])
    lift2 = _two("lift")
    dist1 = run_isolated(__file__, ["--only", "distill"])
    dist2 = _two("distill")
    payload = {"lift": {"setting": LIFT, "one": lift1, "two": lift2, "pixels": {"setting": PIXELS, **pixels}},
               "distill": {"setting": DISTILL, "one": dist1, "two": dist2}, "machine": machine(),
               "cpu": cpu_peak_fma(), "load_average": [load0, os.getloadavg()[1]]}
    return report(payload)


def report(payload: Dict) -> Dict:
    """scale_out.md and .json from a run's measurements (the model recomputed: ``--report`` after editing it)."""
    lift1, lift2 = payload["lift"]["one"], payload["lift"]["two"]
    dist1, dist2, cpu = payload["distill"]["one"], payload["distill"]["two"], payload["cpu"]
    payload["model"] = model = _model(lift1, payload["lift"]["pixels"], dist1, cpu)
    load0, load1 = payload["load_average"]
    peak2 = max(r["peak_rss_mb"] for r in lift2)
    payload["lift_peak_per_rank_below_one_process"] = peak2 < lift1["peak_rss_mb"]
    passes = lambda r: " / ".join(f"{x:.1f}" for x in r["seconds_per_pass"])  # noqa: E731
    s, d = payload["lift"]["setting"], payload["distill"]["setting"]
    sh = lift2[0]["shares"]
    md = (f"# scale-out: K = 1 and 2 processes on this machine (gloo)\n\n"
          f"CPU: {cpu['model']} ({payload['machine']['cpu_count']} cores); K = 1: one process of {lift1['threads']} "
          f"threads; K = 2: torchrun, 2 processes of 1 thread. Load average (5 min) {load0:.1f} at the start, "
          f"{load1:.1f} at the end: on a busy machine the wall times follow the load, the CPU seconds and the memory "
          f"much less.\n\n"
          f"## lift: {s['gaussians']} Gaussians x {s['views']} views x {s['size']}x{s['size']}, D = {s['D']}\n\n"
          f"| | seconds | CPU seconds | seconds per pass | peak RSS (MB) |\n|---|---|---|---|---|\n"
          f"| K = 1 | {lift1['seconds']:.1f} | {lift1['cpu_seconds']:.1f} | {passes(lift1)} | "
          f"{lift1['peak_rss_mb']:.0f} |\n"
          + "".join(f"| K = 2, rank {r['rank']} | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} | {passes(r)} | "
                    f"{r['peak_rss_mb']:.0f} |\n" for r in lift2)
          + f"\nShares: views {sh['views_by_rank']}, Gaussians owned {sh['owned_by_rank']}, seen {sh['seen_by_rank']} "
          f"(every orbit view sees the whole cube). Peak memory per rank {peak2:.0f} MB against "
          f"{lift1['peak_rss_mb']:.0f} MB in one process: **{'below' if payload['lift_peak_per_rank_below_one_process'] else 'NOT below'}**."
          f" Wall time K = 1 / K = 2: {lift1['seconds'] / max(r['seconds'] for r in lift2):.2f}x; CPU seconds of both "
          f"ranks / one process: {sum(r['cpu_seconds'] for r in lift2) / lift1['cpu_seconds']:.2f} (two one-thread "
          f"processes add no per-thread sums and cache half the views each; on a loaded machine neither ratio is a "
          f"speed-up measurement).\n\n"
          + _traffic_rows(lift2)
          + f"\n## distillation: {d['gaussians']} Gaussians x {d['views']} views x {d['size']}x{d['size']}, D = {d['D']}, "
          f"d = {d['latent_dim']}, {d['steps']} steps of {d['views_per_step']} views (after the lift)\n\n"
          f"| | seconds (lift + fixed views) | seconds per step | CPU seconds in all | peak RSS (MB) |\n"
          f"|---|---|---|---|---|\n"
          f"| K = 1 | {dist1['seconds_init']:.1f} | {dist1['seconds_per_step']:.3f} | {dist1['cpu_seconds']:.1f} | "
          f"{dist1['peak_rss_mb']:.0f} |\n"
          + "".join(f"| K = 2, rank {r['rank']} | {r['seconds_init']:.1f} | {r['seconds_per_step']:.3f} | "
                    f"{r['cpu_seconds']:.1f} | {r['peak_rss_mb']:.0f} |\n" for r in dist2)
          + "\n" + _traffic_rows(dist2) + _model_md(model))
    return write_results("scale_out", payload, md)


if __name__ == "__main__":
    if sys.argv[1:] == ["--report"]:
        from _common import RESULTS

        report(json.loads((RESULTS / "scale_out.json").read_text()))
    else:
        entry(measure, main)
