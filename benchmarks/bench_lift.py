"""Training-free lift vs one plain forward render pass over the same views.

Scene: 50k Gaussians, 40 views at 128x128 (issue 3's setting); teacher maps [40, 16, 16, D]
(patch resolution, upsampled inside the lift). Baseline: rendering RGB for the same 40 views.
Reports each lift variant's time and its ratio to the baseline, for D = 64 and D = 512.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, orbit, peak_rss_mb, random_scene, timeit, write_results  # noqa: E402

N, VIEWS, SIZE = 50_000, 40, 128


def surface_scene():
    """The synthetic labelled scene (opaque surfaces, like a real capture) at ~50k Gaussians."""
    from rh3dgs.data.synthetic import SceneConfig, make_scene

    cfg = SceneConfig(gaussians_per_unit_area=3750.0, num_views=VIEWS, image_size=SIZE)
    s = make_scene(cfg)
    return s.gaussians, s.cameras


def main(dims=(64, 512), scenes=("surfaces", "random cube")) -> dict:
    payload = {"setting": {"gaussians": N, "views": VIEWS, "size": SIZE}, "scenes": {}}
    md = [f"# training-free lift vs plain render\n\n{VIEWS} views at {SIZE}x{SIZE}, {machine()['threads']} threads. "
          "Baseline: one plain RGB render pass over the same views, measured in the same run.\n"]
    for scene in scenes:
        g, cams = surface_scene() if scene == "surfaces" else (random_scene(N, scale=0.03), orbit(VIEWS, SIZE))
        p, rows = run_scene(g, cams, dims)
        payload["scenes"][scene] = p
        md.append(f"\n## {scene}: {len(g)} Gaussians; plain render {p['plain_render_s']:.2f} s\n\n"
                  "| D | variant | lift (s) | passes | ratio to render |\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    payload["peak_rss_mb"] = peak_rss_mb()
    payload["machine"] = machine()
    md.append(f"\npeak RSS {payload['peak_rss_mb']:.0f} MB\n")
    return write_results("lift", payload, "".join(md))


def run_scene(g, cams, dims):
    from rh3dgs.lift import LiftConfig, lift
    from rh3dgs.render import render

    def plain():
        with torch.no_grad():
            for s in range(0, VIEWS, 8):
                render(g, cams[list(range(s, min(s + 8, VIEWS)))])

    base = timeit(plain, repeats=2)["median_s"]
    rows, payload = [], {"gaussians": len(g), "plain_render_s": base, "runs": []}
    for D in dims:
        maps = torch.nn.functional.normalize(torch.randn(VIEWS, SIZE // 8, SIZE // 8, D,
                                                         generator=torch.Generator().manual_seed(D)) + 1.0, dim=-1)
        for name, cfg in [("robust (VCD + Huber IRLS)", LiftConfig(method="robust")),
                          ("karcher (VCD)", LiftConfig(method="karcher")),
                          ("euclidean (VCD)", LiftConfig(method="euclidean")),
                          ("robust, no VCD", LiftConfig(method="robust", use_vcd=False))]:
            res = {}

            def run():
                res["r"] = lift(g, cams, maps, cfg, progress=False)

            t = timeit(run, repeats=1, warmup=0)["median_s"]
            info = res["r"].info
            payload["runs"].append({"D": D, "variant": name, "seconds": t, "ratio_to_render": t / base,
                                    "passes": info["passes"]})
            rows.append(f"| {D} | {name} | {t:.2f} | {info['passes']} | {t / base:.2f}x |")
    return payload, rows


if __name__ == "__main__":
    main()
