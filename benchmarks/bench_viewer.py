"""Frame time of ``rh3dgs view`` on the CPU: one browser frame = render + relevancy + colour map.

Scene: 50k random Gaussians (benchmarks/_common.random_scene) with a semantic field of
d = 16 latents and D = 64 teacher space (the synthetic demo's sizes), one camera at 512x512.
Measures exactly what the viewer's render thread does per frame
(``rh3dgs.viewer.server.render_frame``) for the three outputs, plus the moving resolution.
Target: RGB under 250 ms at full resolution on 2 cores; relevancy adding at most 15 %; and (issue 21)
``rh3dgs.render`` with RGB + 16 latents in one traversal within 5 % of RGB alone (interleaved rounds).
The JPEG encoding and websocket transfer (viser) are not included.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, machine, orbit, peak_rss_mb, random_scene, timeit, write_results  # noqa: E402

N, SIZE, MOVING, LATENT_DIM, TEACHER_DIM = 50_000, 512, 256, 16, 64
TARGET_MS, TARGET_OVERHEAD = 250.0, 0.15
TARGET_RENDER_OVERHEAD = 0.05  # issue 21: render with RGB + 16 latents / RGB <= 1.05


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


def _stage_breakdown(scene, cam, repeats: int) -> dict:
    """Median ms of the RGB render's stages: projection, tile binning, compositing."""
    from rh3dgs.ops import isect_tiles, project_gaussians, rasterize_to_pixels
    from rh3dgs.rendering import _sh_colors  # (not `from rh3dgs import render`: that is the function)

    g, W, H = scene.gaussians, cam.width, cam.height
    with torch.no_grad():
        proj = lambda: project_gaussians(g.means, g.quats, g.activated_scales, cam.viewmats, cam.Ks, W, H)  # noqa: E731
        radii, means2d, depths, conics = proj()
        _, offsets, ids = isect_tiles(means2d, radii, depths, 16, (W + 15) // 16, (H + 15) // 16)
        col = _sh_colors(g, cam)
        op = g.activated_opacities[None]
        lat = torch.cat([col, scene.field.latents[None]], -1)
        stages = {
            "projection": proj,
            "tile binning": lambda: isect_tiles(means2d, radii, depths, 16, (W + 15) // 16, (H + 15) // 16),
            "compositing, 3 channels": lambda: rasterize_to_pixels(means2d, conics, col, op, depths, W, H, 16,
                                                                   offsets, ids),
            f"compositing, 3 + {LATENT_DIM} channels": lambda: rasterize_to_pixels(means2d, conics, lat, op, depths,
                                                                                    W, H, 16, offsets, ids),
        }
        out = {name: 1000 * timeit(fn, repeats=repeats, warmup=1)["median_s"] for name, fn in stages.items()}
    out["intersections"] = int(ids.numel())
    return out


def _latent_render_overhead(scene, cam, rounds: int) -> dict:
    """``render`` with RGB + d latents (one traversal) vs RGB alone, interleaved rounds: median ratio."""
    import statistics

    from rh3dgs.rendering import render

    g, lat = scene.gaussians, scene.field.latents
    with torch.no_grad():
        t = interleaved({"rgb": lambda: render(g, cam), "sem": lambda: render(g, cam, lat)}, rounds)
    rgb, sem = t["wall"]["rgb"], t["wall"]["sem"]
    ratio = statistics.median([s / r for s, r in zip(sem, rgb)])
    cpu_ratio = statistics.median([s / r for s, r in zip(t["cpu"]["sem"], t["cpu"]["rgb"])])
    return {"rgb_ms": 1000 * statistics.median(rgb), "rgb_latents_ms": 1000 * statistics.median(sem),
            "ratio": ratio, "cpu_ratio": cpu_ratio, "rounds": rounds, "met": ratio <= 1.0 + TARGET_RENDER_OVERHEAD}


def main(repeats: int = 7) -> dict:
    """Outputs are timed interleaved (RGB, overlay, heat, RGB, ...) so that load from other processes
    hits them alike; the relevancy overhead is the median of the per-round ratios."""
    import statistics
    import time

    from rh3dgs.viewer.controls import OUTPUT_HEAT, OUTPUT_OVERLAY, OUTPUT_RGB, QueryControls
    from rh3dgs.viewer.server import render_frame

    scene = build_scene()
    threads = torch.get_num_threads()
    outputs = (OUTPUT_RGB, OUTPUT_OVERLAY, OUTPUT_HEAT)
    rows, runs = [], []
    for size in (SIZE, MOVING):
        cam = orbit(1, size)
        ctls = {}
        for output in outputs:
            ctls[output] = QueryControls.from_scene(scene)
            ctls[output].update(positives="query", output=output)
            render_frame(scene, ctls[output], cam)  # warm-up
        times = {o: [] for o in outputs}
        cpu = {o: [] for o in outputs}
        for _ in range(repeats):
            for output in outputs:
                t, c = time.perf_counter(), time.process_time()
                render_frame(scene, ctls[output], cam)
                times[output].append(1000 * (time.perf_counter() - t))
                cpu[output].append(1000 * (time.process_time() - c))
        for output in outputs:
            ms, cpu_ms = statistics.median(times[output]), statistics.median(cpu[output])
            over = statistics.median([a / b - 1.0 for a, b in zip(times[output], times[OUTPUT_RGB])])
            cpu_over = cpu_ms / statistics.median(cpu[OUTPUT_RGB]) - 1.0
            runs.append({"size": size, "output": output, "median_ms": ms, "min_ms": min(times[output]),
                         "overhead_vs_rgb": over, "cpu_ms": cpu_ms, "cpu_overhead_vs_rgb": cpu_over,
                         "ideal_ms": cpu_ms / threads, "times_ms": times[output], "cpu_times_ms": cpu[output]})
            dash = output == OUTPUT_RGB
            rows.append(f"| {size}x{size} | {output} | {ms:.0f} | {min(times[output]):.0f} | "
                        f"{'-' if dash else f'{100 * over:+.1f} %'} | {cpu_ms:.0f} | {cpu_ms / threads:.0f} | "
                        f"{'-' if dash else f'{100 * cpu_over:+.1f} %'} |")
    stages = _stage_breakdown(scene, orbit(1, SIZE), repeats=3)
    latent = _latent_render_overhead(scene, orbit(1, SIZE), rounds=15)
    full = {r["output"]: r for r in runs if r["size"] == SIZE}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rgb_ms, over = full[OUTPUT_RGB]["median_ms"], full[OUTPUT_OVERLAY]["overhead_vs_rgb"]
    ideal_ms, cpu_over = full[OUTPUT_RGB]["ideal_ms"], full[OUTPUT_OVERLAY]["cpu_overhead_vs_rgb"]
    payload = {"setting": {"gaussians": N, "size": SIZE, "moving_size": MOVING, "latent_dim": LATENT_DIM,
                           "teacher_dim": TEACHER_DIM, "repeats": repeats, "threads": threads},
               "runs": runs, "stages_ms_512": stages, "render_rgb_latents_vs_rgb": latent, "load_average_1min": load,
               "targets": {"rgb_full_ms": TARGET_MS, "relevancy_overhead": TARGET_OVERHEAD,
                           "rgb_full_met_wall": rgb_ms < TARGET_MS, "overhead_met_wall": over <= TARGET_OVERHEAD,
                           "rgb_full_met_ideal": ideal_ms < TARGET_MS, "overhead_met_cpu": cpu_over <= TARGET_OVERHEAD},
               "peak_rss_mb": peak_rss_mb(), "machine": machine()}
    stage_rows = "\n".join(f"| {k} | {v:.0f} |" for k, v in stages.items() if k != "intersections")
    yes = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    md = (f"# viewer frame time (CPU)\n\n{N} Gaussians, latents d={LATENT_DIM}, teacher D={TEACHER_DIM}, "
          f"{threads} torch threads, {machine()['cpu_count']} CPUs, 1-min load average **{load:.1f}** at the end "
          "of the run (other processes share the CPUs: wall times grow with the load; CPU time of this process "
          "much less). One frame = render + relevancy + colour map (`rh3dgs.viewer.server.render_frame`), "
          f"no JPEG / websocket; {repeats} interleaved rounds. 'ideal' = CPU time / threads, the wall time on "
          "otherwise idle cores with perfect parallel scaling.\n\n"
          "| size | output | wall median (ms) | wall min (ms) | wall vs RGB | CPU (ms) | ideal (ms) | CPU vs RGB |\n"
          "|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) +
          f"\n\n`rh3dgs.render` at {SIZE}x{SIZE}, RGB + {LATENT_DIM} latents in one traversal vs RGB alone "
          f"({latent['rounds']} interleaved rounds, median of the per-round ratios): {latent['rgb_latents_ms']:.0f} vs "
          f"{latent['rgb_ms']:.0f} ms, **{100 * (latent['ratio'] - 1):+.1f} %** wall, "
          f"{100 * (latent['cpu_ratio'] - 1):+.1f} % CPU time (target <= "
          f"{100 * TARGET_RENDER_OVERHEAD:.0f} %: **{yes(latent['met'])}**)"
          f"\n\nRGB render at {SIZE}x{SIZE} by stage, wall ({stages['intersections']:,} tile intersections):\n\n"
          "| stage | median (ms) |\n|---|---|\n" + stage_rows +
          f"\n\ntargets at {SIZE}x{SIZE}: RGB < {TARGET_MS:.0f} ms: wall **{yes(rgb_ms < TARGET_MS)}** "
          f"({rgb_ms:.0f} ms), ideal **{yes(ideal_ms < TARGET_MS)}** ({ideal_ms:.0f} ms); relevancy overhead <= "
          f"{100 * TARGET_OVERHEAD:.0f} %: wall **{yes(over <= TARGET_OVERHEAD)}** ({100 * over:+.1f} %), CPU time "
          f"**{yes(cpu_over <= TARGET_OVERHEAD)}** ({100 * cpu_over:+.1f} %)\n")
    return write_results("viewer", payload, md)


if __name__ == "__main__":
    main()
