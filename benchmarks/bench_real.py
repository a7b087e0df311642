"""CPU render time of real trained splats (issue 20 point 4, issue 21): per-stage breakdown and FPS.

Splats: ``shared/realdata/splats/`` (see its README; never copied into the repository): biker
(152,746 Gaussians) and guitar (90,854), SuperSplat compressed PLY converted to the INRIA layout
with the npm package ``@playcanvas/splat-transform`` into a temporary folder (installed into the
system temp folder on first use), and donut (45,624, INRIA PLY). None has cameras: 4 orbit
cameras around the median centre, at the distance that fits the sphere holding 95 % of the
Gaussians into the vertical field of view (50 degrees horizontal), 17 degrees above the equator.

Per splat and resolution (1280x720 and 640x480), with torch's threads (2 here):
Gaussians (visible), tile intersections per pixel, Gaussians composited per pixel (mean, p99,
max: exact, from the aggregation op's record of the same row traversal), the RGB frame time
(``rh3dgs.render``, median over interleaved rounds of the 4 views), its stages (projection, SH,
binning, rasterization; each timed alone), FPS, and the frame with RGB + 16 latents.
Target: biker at 1280x720 >= 2 FPS (RGB).

    python benchmarks/bench_real.py         # skipped with a reason when the data is absent
"""
from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, machine, peak_rss_mb, timeit, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SPLATS = {  # name: (file, world up axis)
    "biker": ("biker.compressed.ply", (0.0, -1.0, 0.0)),
    "guitar": ("guitar.compressed.ply", (0.0, -1.0, 0.0)),
    "donut": ("donut.ply", (0.0, 0.0, 1.0)),  # README: z up
}
SIZES = ((1280, 720), (640, 480))
VIEWS, ROUNDS, LATENTS = 4, 3, 16
TARGET_FPS = 2.0
SPLAT_TRANSFORM = "@playcanvas/splat-transform@3.7"


def realdata_dir() -> Optional[Path]:
    """``$RH3DGS_REALDATA``, else the first ``shared/realdata`` beside the repository or above it."""
    env = os.environ.get("RH3DGS_REALDATA")
    if env:
        return Path(env) if Path(env).is_dir() else None
    for parent in REPO.parents:
        if (parent / "shared" / "realdata").is_dir():
            return parent / "shared" / "realdata"
    return None


def _splat_transform() -> Tuple[Optional[Path], str]:
    """The splat-transform CLI (installed with npm into the temp folder once), or None and why."""
    if shutil.which("npm") is None:
        return None, "npm not found (needed for @playcanvas/splat-transform)"
    prefix = Path(tempfile.gettempdir()) / "rh3dgs-splat-transform"
    exe = prefix / "node_modules" / ".bin" / "splat-transform"
    if not exe.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", SPLAT_TRANSFORM],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0 or not exe.exists():
            return None, f"npm install {SPLAT_TRANSFORM} failed: {r.stderr.strip()[-300:]}"
    return exe, ""


def load_splat(path: Path, work: Path):
    """load_ply, converting SuperSplat compressed PLY first. splat-transform writes +inf opacity logits
    for fully opaque splats; a load_ply that rejects them gets a copy with them clamped to +/-30."""
    import numpy as np
    import plyfile

    from rh3dgs.errors import PlyFormatError
    from rh3dgs.io.ply import load_ply

    if path.name.endswith(".compressed.ply"):
        exe, why = _splat_transform()
        if exe is None:
            raise RuntimeError(why)
        out = work / path.name.replace(".compressed.ply", ".ply")
        subprocess.run([str(exe), str(path), str(out)], check=True, capture_output=True, timeout=600)
        path = out
    try:
        return load_ply(path), 0
    except PlyFormatError as exc:
        if "opacity" not in str(exc):
            raise
    ply = plyfile.PlyData.read(str(path))
    v = ply["vertex"].data.copy()
    n_inf = int(np.isinf(v["opacity"]).sum())
    v["opacity"] = np.clip(v["opacity"], -30.0, 30.0)  # sigmoid(30) = 1 - 1e-13: opaque
    fixed = work / (path.stem + ".clamped.ply")
    plyfile.PlyData([plyfile.PlyElement.describe(v, "vertex")]).write(str(fixed))
    return load_ply(fixed), n_inf


def orbit_cameras(g, up, width: int, height: int, views: int = VIEWS):
    from rh3dgs import Cameras

    centre = g.means.median(0).values
    radius = float((g.means - centre).norm(dim=1).quantile(0.95))
    f = 0.5 * width / math.tan(math.radians(25.0))  # Cameras.look_at: 50 degrees horizontal
    dist = radius / math.sin(math.atan(0.5 * height / f))
    up_t = torch.tensor(up)
    helper = torch.tensor([1.0, 0.0, 0.0]) if abs(up[0]) < 0.9 else torch.tensor([0.0, 1.0, 0.0])
    e1 = torch.nn.functional.normalize(torch.cross(up_t, helper, dim=0), dim=0)
    e2 = torch.cross(up_t, e1, dim=0)
    elev = 0.3
    eyes = torch.stack([centre + dist * (math.cos(elev) * (math.cos(t) * e1 + math.sin(t) * e2) + math.sin(elev) * up_t)
                        for t in (2 * math.pi * i / views for i in range(views))])
    return Cameras.look_at(eyes, centre, up=up, fov_deg=50.0, width=width, height=height)


def composited_per_pixel(proj, width: int, height: int) -> Dict[str, float]:
    """Exact (Gaussian, pixel) contributions of the compositing traversal, per pixel."""
    from rh3dgs.ops import aggregate_sphere

    ones = torch.ones(1, height, width, 1)
    *_, rec = aggregate_sphere(proj.means2d, proj.conics, proj.opacities, ones, ones[..., 0], proj.isect_offsets,
                               proj.flatten_ids, proj.tile_size, mode="init", record=True)
    seg = rec.segments.long()
    pix = torch.repeat_interleave(seg[:, 1], seg[:, 2]) + rec.lanes.long()
    counts = torch.bincount(pix, minlength=width * height).float()
    return {"mean": float(counts.mean()), "p99": float(counts.quantile(0.99)), "max": float(counts.max()),
            "row_segments_per_pixel": seg.shape[0] / (width * height)}


def _ms(fn) -> float:
    return 1000 * timeit(fn, repeats=3)["median_s"]


def measure(g, up, width: int, height: int) -> Dict:
    from rh3dgs import render
    from rh3dgs.ops import isect_tiles, project_gaussians, rasterize_to_pixels
    from rh3dgs.rendering import _sh_colors, project

    cams = orbit_cameras(g, up, width, height)
    latents = torch.randn(len(g), LATENTS, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fns = {}
        for i in range(len(cams)):  # RGB and RGB + latents of every view, interleaved
            fns[f"rgb{i}"] = lambda cam=cams[i:i + 1]: render(g, cam)
            fns[f"sem{i}"] = lambda cam=cams[i:i + 1]: render(g, cam, latents)
        t = interleaved(fns, ROUNDS)
        rgb, sem, rgb_cpu = ([x for i in range(len(cams)) for x in t[kind][f"{name}{i}"]]
                             for kind, name in (("wall", "rgb"), ("wall", "sem"), ("cpu", "rgb")))
        cam = cams[0:1]
        W, H = width, height
        scales = g.activated_scales
        stages = {
            "projection": _ms(lambda: project_gaussians(g.means, g.quats, scales, cam.viewmats, cam.Ks, W, H)),
        }
        proj = project(g, cam)
        tw, th = math.ceil(W / 16), math.ceil(H / 16)
        stages["SH colours"] = _ms(lambda: _sh_colors(g, cam))
        stages["binning + depth sort"] = _ms(lambda: isect_tiles(proj.means2d, proj.radii, proj.depths, 16, tw, th))
        col = _sh_colors(g, cam)
        stages["rasterization"] = _ms(lambda: rasterize_to_pixels(proj.means2d, proj.conics, col, proj.opacities,
                                                                  proj.depths, W, H, 16, proj.isect_offsets,
                                                                  proj.flatten_ids))
        per_pixel = composited_per_pixel(proj, W, H)
    frame, threads = statistics.median(rgb), torch.get_num_threads()
    ideal = statistics.median(rgb_cpu) / threads  # the wall time on idle cores with perfect scaling
    return {"size": f"{width}x{height}", "gaussians": len(g), "visible": int((proj.radii > 0).sum()),
            "isects": int(proj.flatten_ids.numel()), "isects_per_pixel": proj.flatten_ids.numel() / (W * H),
            "composited_per_pixel": per_pixel, "frame_ms": 1000 * frame, "fps": 1.0 / frame,
            "frame_cpu_ms": 1000 * ideal * threads, "ideal_frame_ms": 1000 * ideal, "ideal_fps": 1.0 / ideal,
            "frame_ms_rgb_latents": 1000 * statistics.median(sem),
            "latents_over_rgb": statistics.median([s / r for s, r in zip(sem, rgb)]), "stages_ms": stages,
            "frames_ms": [1000 * t for t in rgb]}


def main() -> Dict:
    root = realdata_dir()
    if root is None:
        reason = "skipped: shared/realdata not found (set RH3DGS_REALDATA); the real splats are not redistributable"
        print(reason)
        return {"skipped": reason}
    load = os.getloadavg()[0]
    runs, notes = [], []
    with tempfile.TemporaryDirectory(prefix="rh3dgs-real-") as work:
        for name, (fname, up) in SPLATS.items():
            try:
                g, n_inf = load_splat(root / "splats" / fname, Path(work))
            except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                notes.append(f"{name}: skipped ({exc})")
                print(notes[-1])
                continue
            if n_inf:
                notes.append(f"{name}: {n_inf} +/-inf opacity logits clamped to +/-30 (load_ply rejected them)")
            for W, H in SIZES:
                r = measure(g, up, W, H)
                r["splat"], r["sh_degree"] = name, g.sh_degree
                runs.append(r)
                print(f"{name} {r['size']}: {r['frame_ms']:.0f} ms ({r['fps']:.2f} FPS), "
                      + ", ".join(f"{k} {v:.0f} ms" for k, v in r["stages_ms"].items()), flush=True)
    load_end = os.getloadavg()[0]
    biker = next((r for r in runs if r["splat"] == "biker" and r["size"] == "1280x720"), None)
    met = biker is not None and biker["fps"] >= TARGET_FPS
    rows = "\n".join(
        f"| {r['splat']} | {r['size']} | {r['gaussians']:,} ({r['visible']:,}) | {r['isects_per_pixel']:.2f} | "
        f"{r['composited_per_pixel']['mean']:.1f} / {r['composited_per_pixel']['p99']:.0f} / "
        f"{r['composited_per_pixel']['max']:.0f} | "
        + " | ".join(f"{v:.0f}" for v in r["stages_ms"].values())
        + f" | **{r['frame_ms']:.0f}** | **{r['fps']:.2f}** | {r['ideal_frame_ms']:.0f} | {r['ideal_fps']:.2f} | "
        f"{100 * (r['latents_over_rgb'] - 1):+.1f} % |"
        for r in runs)
    stage_names = list(runs[0]["stages_ms"]) if runs else []
    threads = torch.get_num_threads()
    md = (f"# real splats: CPU render time\n\n{threads} torch threads, {os.cpu_count()} CPUs, 1-min load average "
          f"{load:.1f} at the start, {load_end:.1f} at the end (the machine is shared: wall times grow with it). "
          f"{VIEWS} orbit views around the median centre, {ROUNDS} interleaved rounds; frame = `rh3dgs.render` "
          "(RGB), median; stages timed alone on view 0. Composited = (Gaussian, pixel) pairs the compositing "
          "traversal visits, per pixel (mean / p99 / max). 'ideal' = CPU time of the frame / threads: the wall "
          "time on otherwise idle cores with perfect parallel scaling (what the load hides).\n\n"
          "| splat | size | Gaussians (visible) | tile isects / pixel | composited / pixel | "
          + " | ".join(f"{s} (ms)" for s in stage_names)
          + " | frame (ms) | FPS | ideal frame (ms) | ideal FPS | + 16 latents |\n|---|---|---|---|---|"
          + "---|" * len(stage_names) + "---|---|---|---|---|\n"
          + rows + "\n\n"
          + (f"target: biker at 1280x720 >= {TARGET_FPS:.0f} FPS (RGB): wall **{'met' if met else 'NOT met'}**"
             + (f" ({biker['fps']:.2f} FPS), ideal **{'met' if biker['ideal_fps'] >= TARGET_FPS else 'NOT met'}** "
                f"({biker['ideal_fps']:.2f} FPS)" if biker else " (biker not measured)") + "\n")
          + ("".join(f"\n- {n}" for n in notes) + "\n" if notes else ""))
    payload = {"runs": runs, "notes": notes, "target_fps": TARGET_FPS, "target_met": met,
               "target_met_ideal": biker is not None and biker["ideal_fps"] >= TARGET_FPS, "load_average_start": load,
               "load_average_end": load_end, "peak_rss_mb": peak_rss_mb(), "machine": machine()}
    return write_results("real", payload, md)


if __name__ == "__main__":
    main()
