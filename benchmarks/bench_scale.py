"""Lift at scale in bounded memory: 200k Gaussians x 100 views x 128x128 (issue "performance").

Teacher maps are produced per view on demand (a callable, as the feature cache serves them),
so no more than one chunk of upsampled maps is held at a time unless the lift decides to cache
(see ``rh3dgs.memory.lift_memory_estimate``, printed first). Baseline in the same run: one
plain RGB render pass over the same views. Each part runs in its own interpreter so that its
peak RSS is its own.

    python benchmarks/bench_scale.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import entry, machine, orbit, peak_rss_mb, random_scene, run_isolated, timeit, write_results  # noqa: E402

N, VIEWS, SIZE, D = 200_000, 100, 128, 64
TARGET_RSS_MB = 6 * 1024


def _maps(i: int) -> torch.Tensor:
    """Teacher map of view i at patch resolution [16, 16, D] (made on demand, like a cache read)."""
    g = torch.Generator().manual_seed(i)
    return torch.nn.functional.normalize(torch.randn(SIZE // 8, SIZE // 8, D, generator=g) + 1.0, dim=-1)


def measure(part: str) -> dict:
    from rh3dgs.lift import LiftConfig, lift
    from rh3dgs.memory import lift_memory_estimate
    from rh3dgs.render import render

    g = random_scene(N, scale=0.015)
    cams = orbit(VIEWS, SIZE)
    base = peak_rss_mb()
    if part == "render":
        def run():
            with torch.no_grad():
                for s in range(0, VIEWS, 8):
                    render(g, cams[list(range(s, min(s + 8, VIEWS)))])
        t = timeit(run, repeats=1, warmup=0)["median_s"]
        return {"part": part, "seconds": t, "peak_rss_mb": peak_rss_mb(), "rss_over_setup_mb": peak_rss_mb() - base}
    est = lift_memory_estimate(N, VIEWS, SIZE, SIZE, D)
    res = {}

    def run():
        res["r"] = lift(g, cams, _maps, LiftConfig(method="robust"), progress=False)

    t = timeit(run, repeats=1, warmup=0)["median_s"]
    return {"part": part, "seconds": t, "peak_rss_mb": peak_rss_mb(), "rss_over_setup_mb": peak_rss_mb() - base,
            "estimate": est.summary(), "passes": res["r"].info["passes"], "valid": res["r"].info["valid"]}


def main() -> dict:
    render_ = run_isolated(__file__, ["--only", "render"])
    lift_ = run_isolated(__file__, ["--only", "lift"])
    payload = {"setting": {"gaussians": N, "views": VIEWS, "size": SIZE, "D": D}, "render": render_, "lift": lift_,
               "ratio_lift_to_render": lift_["seconds"] / render_["seconds"],
               "target_peak_rss_mb": TARGET_RSS_MB, "peak_rss_met": lift_["peak_rss_mb"] < TARGET_RSS_MB,
               "machine": machine()}
    md = (f"# lift at scale: {N} Gaussians x {VIEWS} views x {SIZE}x{SIZE}, D = {D}\n\n"
          f"{lift_['estimate']}\n\n| part | seconds | peak RSS (MB) | RSS over setup (MB) |\n|---|---|---|---|\n"
          f"| plain RGB render of the views | {render_['seconds']:.1f} | {render_['peak_rss_mb']:.0f} | "
          f"{render_['rss_over_setup_mb']:.0f} |\n"
          f"| robust lift ({lift_['passes']} passes, {lift_['valid']} Gaussians seen) | {lift_['seconds']:.1f} | "
          f"{lift_['peak_rss_mb']:.0f} | {lift_['rss_over_setup_mb']:.0f} |\n\n"
          f"lift / render: {payload['ratio_lift_to_render']:.2f}x; peak RSS under {TARGET_RSS_MB} MB: "
          f"**{'met' if payload['peak_rss_met'] else 'NOT met'}**\n")
    return write_results("scale", payload, md)


if __name__ == "__main__":
    entry(measure, main)
