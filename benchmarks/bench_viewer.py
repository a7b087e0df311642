"""Frame time of ``rh3dgs view`` on the CPU: one browser frame = render + relevancy + colour map.

Scene: 50k random Gaussians (benchmarks/_common.random_scene) with a semantic field of
d = 16 latents and D = 64 teacher space (the synthetic demo's sizes), one camera at 512x512.
Measures exactly what the viewer's render thread does per frame
(``rh3dgs.viewer.server.render_frame``) for the three outputs, plus the moving resolution.
Target: RGB under 250 ms at full resolution on 2 cores; relevancy adding at most 15 %.
The JPEG encoding and websocket transfer (viser) are not included.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, orbit, peak_rss_mb, random_scene, timeit, write_results  # noqa: E402

N, SIZE, MOVING, LATENT_DIM, TEACHER_DIM = 50_000, 512, 256, 16, 64
TARGET_MS, TARGET_OVERHEAD = 250.0, 0.15


def build_scene():
    from rh3dgs.api import Scene, TextEmbeddings
    from rh3dgs.field import SemanticField
    from rh3dgs.query import CANONICAL_NEGATIVES

    g = random_scene(N, scale=0.03)
    gen = torch.Generator().manual_seed(1)
    latents = torch.randn(N, LATENT_DIM, generator=gen)
    decoder = torch.randn(TEACHER_DIM, LATENT_DIM, generator=gen) / LATENT_DIM ** 0.5
    names = ["query", *CANONICAL_NEGATIVES]
    table = {n: torch.nn.functional.normalize(torch.randn(TEACHER_DIM, generator=gen), dim=0) for n in names}
    return Scene(g, SemanticField(latents, decoder), orbit(1, SIZE), text_encoder=TextEmbeddings(table))


def main(repeats: int = 5) -> dict:
    from rh3dgs.viewer.controls import OUTPUT_HEAT, OUTPUT_OVERLAY, OUTPUT_RGB, QueryControls
    from rh3dgs.viewer.server import render_frame

    scene = build_scene()
    rows, runs = [], []
    for size in (SIZE, MOVING):
        cam = orbit(1, size)
        base = None
        for output in (OUTPUT_RGB, OUTPUT_OVERLAY, OUTPUT_HEAT):
            controls = QueryControls.from_scene(scene)
            controls.update(positives="query", output=output)
            parts = {}

            def frame():
                _, parts["render"], parts["compose"] = render_frame(scene, controls, cam)

            t = timeit(frame, repeats=repeats, warmup=1)
            ms = 1000 * t["median_s"]
            base = ms if output == OUTPUT_RGB else base
            over = ms / base - 1.0
            runs.append({"size": size, "output": output, "median_ms": ms, "min_ms": 1000 * t["min_s"],
                         "overhead_vs_rgb": over, "last_render_ms": 1000 * parts["render"],
                         "last_compose_ms": 1000 * parts["compose"]})
            rows.append(f"| {size}x{size} | {output} | {ms:.0f} | {1000 * t['min_s']:.0f} | "
                        f"{'-' if output == OUTPUT_RGB else f'{100 * over:+.1f} %'} |")
    full = {r["output"]: r for r in runs if r["size"] == SIZE}
    ok_time = full[OUTPUT_RGB]["median_ms"] < TARGET_MS
    ok_over = full[OUTPUT_OVERLAY]["overhead_vs_rgb"] <= TARGET_OVERHEAD
    payload = {"setting": {"gaussians": N, "size": SIZE, "moving_size": MOVING, "latent_dim": LATENT_DIM,
                           "teacher_dim": TEACHER_DIM, "repeats": repeats},
               "runs": runs, "targets": {"rgb_full_ms": TARGET_MS, "relevancy_overhead": TARGET_OVERHEAD,
                                         "rgb_full_met": ok_time, "overhead_met": ok_over},
               "peak_rss_mb": peak_rss_mb(), "machine": machine()}
    md = (f"# viewer frame time (CPU)\n\n{N} Gaussians, latents d={LATENT_DIM}, teacher D={TEACHER_DIM}, "
          f"{machine()['threads']} torch threads, {machine()['cpu_count']} CPUs. One frame = render + relevancy + "
          "colour map (`rh3dgs.viewer.server.render_frame`), no JPEG / websocket.\n\n"
          "| size | output | median (ms) | min (ms) | vs RGB |\n|---|---|---|---|---|\n" + "\n".join(rows) +
          f"\n\ntargets: RGB full resolution < {TARGET_MS:.0f} ms: **{'met' if ok_time else 'NOT met'}** "
          f"({full[OUTPUT_RGB]['median_ms']:.0f} ms); relevancy overhead <= {100 * TARGET_OVERHEAD:.0f} %: "
          f"**{'met' if ok_over else 'NOT met'}** ({100 * full[OUTPUT_OVERLAY]['overhead_vs_rgb']:+.1f} %)\n")
    write_results("viewer", payload, md)
    print(md)
    return payload


if __name__ == "__main__":
    main()
