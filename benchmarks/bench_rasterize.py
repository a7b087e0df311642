"""Native CPU rasterizer vs the pure-torch reference: forward, backward, speed and peak memory.

Scene: 20k Gaussians, one 256x256 view, 16 feature channels (issue 2's setting).
Each backend runs in its own interpreter so that its peak RSS is its own.

The physical limit (issue 21): the native forward and backward are also stated as composited
(Gaussian, pixel) pairs per second per core (pairs counted exactly by the aggregation op's record of
the same row traversal) and as the fraction of this CPU's peak single-precision FMA rate
(``_common.cpu_peak_fma``: FMA lanes per cycle of the CPU's vector datapath, ``_common.FMA_PEAKS``, times the
clock) that the arithmetic every composited pair
needs would take, each operation counted as one FMA lane: alpha (sigma, exp, clamps: ALPHA_OPS) and
compositing (C + 6) forward, the same alpha and 4 C + 30 backward. Pairs tested but not composited
(alpha < 1/255 inside a row, or culled) are overhead, not counted.

The memory side: the bytes a tile must move past the core's L1 (each intersected Gaussian's 64-byte record,
its 4-byte index and its feature row once per tile; each pixel's outputs once; the backward also each
Gaussian's gradient row per tile and each pixel's output gradients) per composited pair, times the pairs per
second, against a copy's bandwidth measured in the same run (``_common.memory_bandwidth``).

    python benchmarks/bench_rasterize.py            # both, prints ratios, writes results/
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (cpu_peak_fma, entry, fma_peak_table, machine, memory_bandwidth, orbit, peak_rss_mb,  # noqa: E402
                     random_scene, run_isolated, timeit, write_results)

N, SIZE, C = 20_000, 256, 16
ALPHA_OPS = 24  # per pair: dx, sigma (mul + 2 FMA), clamps, exp (12), alpha (mul + min + 3 selects)
FWD_OPS, BWD_OPS = ALPHA_OPS + C + 6, ALPHA_OPS + 4 * C + 30
# bytes per tile intersection (record 64 + index 4 + feature row; the backward adds the gradient row: means2d 2,
# conic 3, opacity 1, depth 1, features C) and per pixel (forward outputs: features, alpha, 2 depth moments;
# backward: their gradients and the forward's saved transmittance and last index)
FWD_BYTES_ISECT, FWD_BYTES_PIXEL = 68 + 4 * C, 4 * (C + 3)
BWD_BYTES_ISECT, BWD_BYTES_PIXEL = 68 + 4 * C + 4 * (C + 7), 4 * (C + 5)


def _which_limit(limit: dict) -> str:
    """One sentence: which of arithmetic and memory traffic is nearer its limit, per pass."""
    parts = []
    for k, v in limit.items():
        fma, mem = v["fraction_of_peak_fma"], v["fraction_of_bandwidth"]
        near = "the arithmetic" if fma >= mem else "the memory traffic"
        parts.append(f"{k}: {near} is nearer its limit ({100 * fma:.0f} % of peak FMA, {100 * mem:.0f} % of the "
                     "copy bandwidth)")
    bound = all(max(v["fraction_of_peak_fma"], v["fraction_of_bandwidth"]) < 0.5 for v in limit.values())
    return ("; ".join(parts) + (". Neither is above half of its limit: the time goes to the instructions around "
                                "the necessary arithmetic (lane masks, gathers, transposes, row culling) and their "
                                "latencies, not to a unit's throughput." if bound else "."))


def composited_pairs(p) -> int:
    """(Gaussian, pixel) pairs the compositing traversal visits (exact: the recording forward's record)."""
    from rh3dgs.ops import rasterize_to_pixels

    ones = torch.ones(*p.opacities.shape, 1)
    rec = rasterize_to_pixels(p.means2d, p.conics, ones, p.opacities, p.depths, SIZE, SIZE, p.tile_size,
                              p.isect_offsets, p.flatten_ids, record=True).contributions
    return int(rec.lanes.numel())


def _inputs():
    from rh3dgs.rendering import project

    g = random_scene(N)
    cams = orbit(1, SIZE)
    with torch.no_grad():
        p = project(g, cams)
    feats = torch.randn(1, N, C, generator=torch.Generator().manual_seed(1))
    return p, feats


def measure(backend: str) -> dict:
    from rh3dgs.ops import rasterize_to_pixels
    from rh3dgs.ops._ref import _ref_rasterize_to_pixels

    p, feats = _inputs()
    base_rss = peak_rss_mb()

    def forward():
        ins = [t.detach().clone().requires_grad_(True) for t in (p.means2d, p.conics, feats, p.opacities, p.depths)]
        if backend == "native":
            o = rasterize_to_pixels(*ins, SIZE, SIZE, p.tile_size, p.isect_offsets, p.flatten_ids)
            return o.render, o.alpha, o.d1, o.d2
        return _ref_rasterize_to_pixels(*ins[:5], None, SIZE, SIZE, p.tile_size, p.isect_offsets, p.flatten_ids)

    def step():
        outs = forward()
        (outs[0].sum() + outs[1].sum() + outs[2].sum()).backward()

    native = backend == "native"
    t = timeit(step, repeats=9 if native else 1, warmup=2 if native else 0)
    tf = timeit(forward, repeats=9 if native else 1, warmup=1 if native else 0)  # graph built, no backward
    extra = {}
    if native:
        with torch.no_grad():
            fwd_only = timeit(lambda: rasterize_to_pixels(p.means2d, p.conics, feats, p.opacities, p.depths, SIZE, SIZE,
                                                          p.tile_size, p.isect_offsets, p.flatten_ids), repeats=9)
        extra = {"pairs": composited_pairs(p), "fwd_nograd_s": fwd_only["median_s"],
                 "fwd_nograd_cpu_s": fwd_only["cpu_median_s"], "fwd_bwd_cpu_s": t["cpu_median_s"],
                 "fwd_graph_cpu_s": tf["cpu_median_s"]}
    return {**extra, "backend": backend, "fwd_bwd_s": t["median_s"], "fwd_s": tf["median_s"],
            "bwd_s": max(t["median_s"] - tf["median_s"], 0.0), "peak_rss_mb": peak_rss_mb(),
            "rss_over_setup_mb": peak_rss_mb() - base_rss, "n_isects": int(p.flatten_ids.numel())}


def main() -> dict:
    native = run_isolated(__file__, ["--only", "native"])
    ref = run_isolated(__file__, ["--only", "reference"])
    ratio = ref["fwd_bwd_s"] / native["fwd_bwd_s"]
    r_fwd, r_bwd = ref["fwd_s"] / native["fwd_s"], ref["bwd_s"] / max(native["bwd_s"], 1e-9)
    peak, bandwidth = cpu_peak_fma(), memory_bandwidth()
    threads = int(machine()["threads"])
    pairs = native["pairs"]
    limit = {}
    bwd_cpu = max(native["fwd_bwd_cpu_s"] - native["fwd_graph_cpu_s"], 1e-9)
    isects, pixels = native["n_isects"], SIZE * SIZE
    for part, secs, cpu_s, ops, b_isect, b_pixel in (
            ("forward", native["fwd_nograd_s"], native["fwd_nograd_cpu_s"], FWD_OPS, FWD_BYTES_ISECT, FWD_BYTES_PIXEL),
            ("backward", native["bwd_s"], bwd_cpu, BWD_OPS, BWD_BYTES_ISECT, BWD_BYTES_PIXEL)):
        # per core: over the CPU time of all threads (robust to other processes' load), and over
        # wall time x threads (what an idle machine would give only without that load)
        rate = pairs / cpu_s
        bytes_per_pair = (isects * b_isect + pixels * b_pixel) / pairs
        limit[part] = {"pairs_per_s_per_core": rate, "pairs_per_s_per_core_wall": pairs / (secs * threads),
                       "ops_per_pair": ops, "fraction_of_peak_fma": rate * ops / peak["peak_fma_per_s_per_core"],
                       "bytes_per_pair": bytes_per_pair, "gb_s_per_core": rate * bytes_per_pair / 1e9,
                       "fraction_of_bandwidth": rate * bytes_per_pair / 1e9 / bandwidth["one_thread_gb_s"]}
    payload = {"setting": {"gaussians": N, "size": SIZE, "channels": C}, "native": native, "reference": ref,
               "cpu_peak": peak, "memory_bandwidth": bandwidth, "physical_limit": limit,
               "speedup_native_vs_reference": ratio, "speedup_forward": r_fwd, "speedup_backward": r_bwd,
               "memory_ratio_reference_vs_native": ref["rss_over_setup_mb"] / max(native["rss_over_setup_mb"], 1e-3),
               "machine": machine()}
    md = (f"# rasterize: native CPU op vs pure-torch reference\n\n{N} Gaussians, {SIZE}x{SIZE}, {C} channels, "
          f"forward+backward, {native['n_isects']} tile intersections, {machine()['threads']} threads.\n\n"
          "| backend | fwd+bwd (s) | forward (s) | backward (s) | peak RSS (MB) | RSS over setup (MB) |\n"
          "|---|---|---|---|---|---|\n"
          + "".join(f"| {name} | {r['fwd_bwd_s']:.3f} | {r['fwd_s']:.3f} | {r['bwd_s']:.3f} | {r['peak_rss_mb']:.0f} | "
                    f"{r['rss_over_setup_mb']:.0f} |\n" for name, r in (("native", native), ("torch reference", ref)))
          + f"\n**speed ratio (reference / native): {ratio:.1f}x** forward + backward "
          f"(forward {r_fwd:.1f}x, backward {r_bwd:.1f}x; backward = fwd+bwd - forward)\n"
          f"\n## Physical limit\n\n{pairs:,} composited (Gaussian, pixel) pairs ({pairs / SIZE ** 2:.1f} per pixel). "
          f"CPU: {peak['model']} ({peak['microarchitecture']}, {peak['isa']}: {peak['fma_lanes_per_cycle']} FP32 FMA "
          f"lanes per cycle) at {peak['clock_ghz']:.2f} GHz: peak {peak['peak_fma_per_s_per_core'] / 1e9:.1f} G FMA/s "
          "per core. Each pair's necessary arithmetic counted as FMA lanes (forward: alpha + compositing; backward: "
          "alpha + gradients; see the module docstring); forward timed without autograd, backward = fwd+bwd - forward; "
          f"per core = pairs / CPU seconds of all {threads} threads (wall x threads in brackets: inflated by other "
          "processes' load).\n\n"
          "| pass | pairs / s / core | ops / pair | fraction of peak FMA | bytes / pair | GB/s / core | "
          "fraction of one core's copy bandwidth |\n|---|---|---|---|---|---|---|\n"
          + "".join(f"| {k} | {v['pairs_per_s_per_core'] / 1e6:.1f} M ({v['pairs_per_s_per_core_wall'] / 1e6:.1f} M) | "
                    f"{v['ops_per_pair']} | **{100 * v['fraction_of_peak_fma']:.1f} %** | {v['bytes_per_pair']:.1f} | "
                    f"{v['gb_s_per_core']:.2f} | **{100 * v['fraction_of_bandwidth']:.1f} %** |\n"
                    for k, v in limit.items())
          + f"\nMemory: a {bandwidth['mib']} MiB copy moves {bandwidth['one_thread_gb_s']:.1f} GB/s on one thread, "
          f"{bandwidth['all_threads_gb_s']:.1f} GB/s on {bandwidth['threads']} (read + written, best of 5). "
          f"{_which_limit(limit)}\n\nPeaks by vector datapath (`benchmarks/_common.py` FMA_PEAKS; the fraction "
          "above is against this machine's row):\n\n" + fma_peak_table(peak))
    return write_results("rasterize", payload, md)


if __name__ == "__main__":
    entry(measure, main)
