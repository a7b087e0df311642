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


def main(dims=(64, 512)) -> dict:
    from rh3dgs.lift import LiftConfig, lift
    from rh3dgs.render import render

    g = random_scene(N, scale=0.03)
    cams = orbit(VIEWS, SIZE)

    def plain():
        with torch.no_grad():
            for s in range(0, VIEWS, 8):
                render(g, cams[list(range(s, min(s + 8, VIEWS)))])

    base = timeit(plain, repeats=2)["median_s"]
    rows, payload = [], {"setting": {"gaussians": N, "views": VIEWS, "size": SIZE}, "plain_render_s": base, "runs": []}
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
    payload["peak_rss_mb"] = peak_rss_mb()
    payload["machine"] = machine()
    md = (f"# training-free lift vs plain render\n\n{N} Gaussians, {VIEWS} views at {SIZE}x{SIZE}, "
          f"{machine()['threads']} threads. Baseline (RGB render of the same views): **{base:.2f} s**.\n\n"
          "| D | variant | lift (s) | passes | ratio to render |\n|---|---|---|---|---|\n" + "\n".join(rows) +
          f"\n\npeak RSS {payload['peak_rss_mb']:.0f} MB\n")
    write_results("lift", payload, md)
    print(md)
    return payload


if __name__ == "__main__":
    main()
