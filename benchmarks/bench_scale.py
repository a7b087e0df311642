"""Lift at scale in bounded memory.

Two settings, each part in its own interpreter so that its peak RSS is its own:

* 200k Gaussians x 100 views x 128x128, D = 64: robust lift vs one plain RGB render pass
  over the same views (the baseline, same run).
* 1M Gaussians x 300 views x 64x64, D = 64, the whole job: robust lift with the teacher maps
  streamed (a callable made per view on demand, as the feature cache serves them; never all
  held), the latents written to a PLY in the compact float16 (``latent_dtype="float16"``) and, for
  comparison, float32; the float16 file reloaded into a ``Scene`` that answers 3 unit-vector
  queries per Gaussian and renders a relevancy map of one view. Seconds per stage, peak RSS
  after each stage, file sizes.

The memory estimate (``rh3dgs.lifting.preflight.lift_memory_estimate``) of each lift is printed before it
starts. At 1M Gaussians the projections of all views (~12 GB) are not cached across passes;
the lift keeps per view only the Gaussians that reach a reliable pixel (``LiftConfig.compact_cache``),
so the three IRLS passes cost a fraction of the first one.

    python benchmarks/bench_scale.py
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import entry, machine, orbit, peak_rss_mb, random_scene, run_isolated, timeit, write_results  # noqa: E402

N, VIEWS, SIZE, D = 200_000, 100, 128, 64
BIG_N, BIG_VIEWS, BIG_SIZE, BIG_LATENTS = 1_000_000, 300, 64, 16
BIG_SCALE = 0.009  # Gaussian size: 1M in the same cube as the 200k of scale 0.015, ~5x denser
TARGET_RSS_MB = 6 * 1024
QUERIES = 3


def _maps(i: int, size: int = SIZE) -> torch.Tensor:
    """Teacher map of view i at patch resolution [size/8, size/8, D] (made on demand, like a cache read)."""
    g = torch.Generator().manual_seed(i)
    return torch.nn.functional.normalize(torch.randn(size // 8, size // 8, D, generator=g) + 1.0, dim=-1)


def _big_maps(i: int) -> torch.Tensor:
    return _maps(i, BIG_SIZE)


def _estimate(n: int, views: int, size: int):
    from rh3dgs.lifting.preflight import lift_memory_estimate

    return lift_memory_estimate(n, views, size, size, D)


def measure_large() -> dict:
    """1M x 300: lift (streamed maps) -> float16 PLY -> reload -> queries -> relevancy map."""
    from rh3dgs import Gaussians
    from rh3dgs.api import Scene
    from rh3dgs.field import SemanticField
    from rh3dgs.io.ply import load_ply, save_ply
    from rh3dgs.lifting import LiftConfig, lift
    from rh3dgs.memory import ply_bytes_per_gaussian

    stages = {}

    def stage(name: str, t: float) -> None:
        stages[name] = {"seconds": time.perf_counter() - t, "peak_rss_mb": peak_rss_mb()}

    t = time.perf_counter()
    g = random_scene(BIG_N, scale=BIG_SCALE)
    cams = orbit(BIG_VIEWS, BIG_SIZE)
    stage("setup (scene, cameras)", t)

    t = time.perf_counter()
    res = lift(g, cams, _big_maps, LiftConfig(method="robust", latent_dim=BIG_LATENTS), progress=False)
    stage("robust lift", t)
    info = res.info
    field32 = res.field()
    out = {}
    with tempfile.TemporaryDirectory(prefix="rh3dgs_bench_scale_") as tmp:
        lifted = Gaussians(g.means, g.scales, g.quats, g.opacities, g.sh0, g.shN, res.latents)
        del res
        t = time.perf_counter()
        p16 = save_ply(Path(tmp) / "scene.ply", lifted, latent_dtype="float16")
        stage("save PLY (float16 latents)", t)
        p32 = save_ply(Path(tmp) / "scene32.ply", lifted, latent_dtype="float32")
        out["ply_bytes"] = {"float16": p16.stat().st_size, "float32": p32.stat().st_size}
        p32.unlink()
        out["ply_bytes_per_gaussian"] = {"float16": ply_bytes_per_gaussian(0, BIG_LATENTS, "float16"),
                                         "float32": ply_bytes_per_gaussian(0, BIG_LATENTS, "float32")}
        del lifted, g
        t = time.perf_counter()
        g2 = load_ply(p16)
        stage("load PLY", t)
    assert torch.equal(g2.latents, field32.latents.half().float())  # the float16 values, exactly
    scene = Scene(g2, SemanticField(g2.latents, field32.decoder, field32.valid), cams)
    gen = torch.Generator().manual_seed(1)
    queries = torch.nn.functional.normalize(torch.randn(QUERIES, D, generator=gen), dim=-1)
    negatives = torch.nn.functional.normalize(torch.randn(4, D, generator=gen), dim=-1)
    t = time.perf_counter()
    rel = scene.relevancy(list(queries), negatives=list(negatives))
    stage(f"per-Gaussian relevancy ({QUERIES} queries)", t)
    rel32 = field32.gaussian_relevancy(queries, negatives)
    t = time.perf_counter()
    rmap = scene.render_relevancy(0, list(queries), negatives=list(negatives))
    stage("relevancy map of one view", t)
    out.update({
        "stages": stages, "passes": info["passes"], "valid": info["valid"], "cache": info["cache"],
        "views_per_batch": info["views_per_batch"],
        "compact_gaussians_per_view": info.get("compact_gaussians_per_view"),
        "compact_cache_mb": info.get("cache_bytes", 0) / 2**20,
        "relevancy_shape": list(rel.shape), "relevancy_map_shape": list(rmap.shape),
        "relevancy_max_abs_diff_fp16_vs_fp32": float((rel - rel32).abs().max()),
        "seconds": sum(s["seconds"] for s in stages.values()), "peak_rss_mb": peak_rss_mb(),
    })
    return out


def measure(part: str) -> dict:
    if part == "large":
        return {"part": part, **measure_large()}
    from rh3dgs.lifting import LiftConfig, lift
    from rh3dgs.rendering import render

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
    est = _estimate(N, VIEWS, SIZE)
    res = {}

    def run():
        res["r"] = lift(g, cams, _maps, LiftConfig(method="robust"), progress=False)

    t = timeit(run, repeats=1, warmup=0)["median_s"]
    return {"part": part, "seconds": t, "peak_rss_mb": peak_rss_mb(), "rss_over_setup_mb": peak_rss_mb() - base,
            "estimate": est.summary(), "passes": res["r"].info["passes"], "valid": res["r"].info["valid"]}


def main() -> dict:
    render_ = run_isolated(__file__, ["--only", "render"])
    lift_ = run_isolated(__file__, ["--only", "lift"])
    big_est = _estimate(BIG_N, BIG_VIEWS, BIG_SIZE)
    print(f"{BIG_N} Gaussians x {BIG_VIEWS} views x {BIG_SIZE}x{BIG_SIZE}: {big_est.summary()}", flush=True)
    big = run_isolated(__file__, ["--only", "large"])
    big["estimate"] = big_est.summary()
    big["estimate_detail_bytes"] = big_est.detail
    big_ok = big["peak_rss_mb"] < TARGET_RSS_MB
    payload = {"setting": {"gaussians": N, "views": VIEWS, "size": SIZE, "D": D}, "render": render_, "lift": lift_,
               "ratio_lift_to_render": lift_["seconds"] / render_["seconds"],
               "target_peak_rss_mb": TARGET_RSS_MB, "peak_rss_met": lift_["peak_rss_mb"] < TARGET_RSS_MB,
               "large": {"setting": {"gaussians": BIG_N, "views": BIG_VIEWS, "size": BIG_SIZE, "D": D,
                                     "latent_dim": BIG_LATENTS, "queries": QUERIES}, **big, "peak_rss_met": big_ok},
               "machine": machine()}
    sizes, per_g = big["ply_bytes"], big["ply_bytes_per_gaussian"]
    rows = "".join(f"| {name} | {s['seconds']:.1f} | {s['peak_rss_mb']:.0f} |\n" for name, s in big["stages"].items())
    md = (f"# lift at scale: {N} Gaussians x {VIEWS} views x {SIZE}x{SIZE}, D = {D}\n\n"
          f"{lift_['estimate']}\n\n| part | seconds | peak RSS (MB) | RSS over setup (MB) |\n|---|---|---|---|\n"
          f"| plain RGB render of the views | {render_['seconds']:.1f} | {render_['peak_rss_mb']:.0f} | "
          f"{render_['rss_over_setup_mb']:.0f} |\n"
          f"| robust lift ({lift_['passes']} passes, {lift_['valid']} Gaussians seen) | {lift_['seconds']:.1f} | "
          f"{lift_['peak_rss_mb']:.0f} | {lift_['rss_over_setup_mb']:.0f} |\n\n"
          f"lift / render: {payload['ratio_lift_to_render']:.2f}x; peak RSS under {TARGET_RSS_MB} MB: "
          f"**{'met' if payload['peak_rss_met'] else 'NOT met'}**\n\n"
          f"# the whole job at {BIG_N} Gaussians x {BIG_VIEWS} views x {BIG_SIZE}x{BIG_SIZE}, D = {D}, "
          f"d = {BIG_LATENTS} latents\n\n"
          f"{big['estimate']}\n\nTeacher maps streamed per view; robust lift ({big['passes']} passes, "
          f"{big['valid']} Gaussians seen, {big['views_per_batch']} views per batch, {big['cache']} cache: "
          f"{big['compact_gaussians_per_view'] or 0:.0f} Gaussians per view kept, {big['compact_cache_mb']:.0f} MB); "
          f"latents saved as float16, reloaded, {QUERIES} unit-vector queries.\n\n"
          f"| stage | seconds | peak RSS so far (MB) |\n|---|---|---|\n{rows}| **total** | "
          f"**{big['seconds']:.1f}** | **{big['peak_rss_mb']:.0f}** |\n\n"
          f"PLY: {sizes['float16'] / 1e6:.1f} MB with float16 latents ({per_g['float16']} B / Gaussian) vs "
          f"{sizes['float32'] / 1e6:.1f} MB float32 ({per_g['float32']} B / Gaussian): "
          f"{sizes['float16'] / sizes['float32']:.2f}x; per-Gaussian relevancy from the float16 latents differs "
          f"from float32 by at most {big['relevancy_max_abs_diff_fp16_vs_fp32']:.1e}. "
          f"Peak RSS under {TARGET_RSS_MB} MB: **{'met' if big_ok else 'NOT met'}**\n")
    return write_results("scale", payload, md)


if __name__ == "__main__":
    entry(measure, main)
