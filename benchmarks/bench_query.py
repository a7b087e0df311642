"""Relevancy fast path (query folded into latent space) vs the slow path (decode to D, normalise).

1M pixel-equivalents of rendered latents (d = 16) against 4 queries + 4 canonical negatives in
a D = 512 teacher space. Both paths give the same relevancy (checked here to 1e-5).

Second part (the query target): 8 phrases (already encoded) against the canonical
negatives on one rendered view, 50k Gaussians at 256x256 with d = 16 latents (the viewer's
``relevancy_maps``), as a fraction of rendering that view (RGB + latents). Target: <= 10 %.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import entry, machine, orbit, peak_rss_mb, run_isolated, timeit, write_results  # noqa: E402

P, d, D, Q, J = 1_000_000, 16, 512, 4, 4


def measure(part: str) -> dict:
    """Everything, in this interpreter (run by :func:`main` in a fresh one: its peak RSS is its own)."""
    from rh3dgs.field import SemanticField
    from rh3dgs.query import feature_relevancy, relevancy_from_cosines

    g = torch.Generator().manual_seed(0)
    dec = torch.linalg.qr(torch.randn(D, d, generator=g))[0]
    field = SemanticField(torch.zeros(1, d), dec)
    lat = torch.randn(P, d, generator=g)
    phi = torch.nn.functional.normalize(torch.randn(Q, D, generator=g), dim=-1)
    neg = torch.nn.functional.normalize(torch.randn(J, D, generator=g), dim=-1)
    out = {}

    def fast():
        cos = field.cosine(lat, torch.cat([phi, neg]))
        out["fast"] = relevancy_from_cosines(cos[:, :Q], cos[:, Q:])

    def slow():
        out["slow"] = feature_relevancy(field.decode(lat), phi, neg)

    tf = timeit(fast, repeats=3)["median_s"]
    ts = timeit(slow, repeats=2)["median_s"]
    err = float((out["fast"] - out["slow"]).abs().max())
    assert err < 1e-5, err
    payload = {"pixels": P, "latent_dim": d, "teacher_dim": D, "queries": Q, "fast_s": tf, "slow_s": ts,
               "speedup": ts / tf, "max_abs_diff": err, "machine": machine()}
    payload["per_view"] = _query_vs_render()
    payload["peak_rss_mb"] = peak_rss_mb()
    return payload


def main() -> dict:
    payload = run_isolated(__file__, ["--only", "all"])
    tf, ts, err, per_view = payload["fast_s"], payload["slow_s"], payload["max_abs_diff"], payload["per_view"]
    md = (f"# relevancy: latent fast path vs decoded slow path\n\n{P} pixels, d={d}, D={D}, {Q} queries + {J} "
          f"negatives.\n\n| path | seconds |\n|---|---|\n| slow (decode to D) | {ts:.3f} |\n| fast (latent) | {tf:.3f} |\n\n"
          f"**speed-up {ts / tf:.1f}x**, max |difference| {err:.1e}\n")
    md += (f"\n## 8 phrases on one rendered view\n\n{per_view['gaussians']} Gaussians, {per_view['size']}x"
           f"{per_view['size']}, d={d}: render (RGB + latents) {per_view['render_ms']:.1f} ms, relevancy of "
           f"{per_view['phrases']} phrases + {per_view['negatives']} negatives {per_view['query_ms']:.2f} ms: "
           f"**{100 * per_view['ratio']:.1f} % of the render** (target <= 10 %: "
           f"{'met' if per_view['ratio'] <= 0.10 else 'NOT met'})\n\npeak RSS {payload['peak_rss_mb']:.0f} MB "
           "(this benchmark's own interpreter; the slow path's [P, D] decode dominates)\n")
    return write_results("query", payload, md)


def _query_vs_render(size: int = 256, phrases: int = 8) -> dict:
    """Median times of rendering one view (RGB + latents) and of querying 8 phrases on it."""
    from bench_viewer import build_scene

    from rh3dgs.rendering import render
    from rh3dgs.query import relevancy_maps

    scene = build_scene()
    cam = orbit(1, size)
    g = torch.Generator().manual_seed(3)
    pos = torch.nn.functional.normalize(torch.randn(phrases, scene.field.decoder.shape[0], generator=g), dim=-1)
    neg = scene.encode(list(scene.negatives))
    out = {}

    def rend():
        with torch.no_grad():
            out["r"] = render(scene.gaussians, cam, scene.field.latents)

    def query():
        r = out["r"]
        relevancy_maps(scene.field, r.features[0], r.alpha[0], pos, neg)

    tr = timeit(rend, repeats=7)["median_s"]
    tq = timeit(query, repeats=15)["median_s"]
    return {"gaussians": len(scene.gaussians), "size": size, "phrases": phrases, "negatives": len(neg),
            "render_ms": 1e3 * tr, "query_ms": 1e3 * tq, "ratio": tq / tr}


if __name__ == "__main__":
    entry(measure, main)
