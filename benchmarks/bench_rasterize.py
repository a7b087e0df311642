"""Native CPU rasterizer vs the pure-torch reference: forward, backward, speed and peak memory.

Scene: 20k Gaussians, one 256x256 view, 16 feature channels (issue 2's setting).
Each backend runs in its own interpreter so that its peak RSS is its own.

    python benchmarks/bench_rasterize.py            # both, prints ratios, writes results/
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import entry, machine, orbit, peak_rss_mb, random_scene, run_isolated, timeit, write_results  # noqa: E402

N, SIZE, C = 20_000, 256, 16


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
    return {"backend": backend, "fwd_bwd_s": t["median_s"], "fwd_s": tf["median_s"],
            "bwd_s": max(t["median_s"] - tf["median_s"], 0.0), "peak_rss_mb": peak_rss_mb(),
            "rss_over_setup_mb": peak_rss_mb() - base_rss, "n_isects": int(p.flatten_ids.numel())}


def main() -> dict:
    native = run_isolated(__file__, ["--only", "native"])
    ref = run_isolated(__file__, ["--only", "reference"])
    ratio = ref["fwd_bwd_s"] / native["fwd_bwd_s"]
    r_fwd, r_bwd = ref["fwd_s"] / native["fwd_s"], ref["bwd_s"] / max(native["bwd_s"], 1e-9)
    payload = {"setting": {"gaussians": N, "size": SIZE, "channels": C}, "native": native, "reference": ref,
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
          f"(forward {r_fwd:.1f}x, backward {r_bwd:.1f}x; backward = fwd+bwd - forward)\n")
    return write_results("rasterize", payload, md)


if __name__ == "__main__":
    entry(measure, main)
