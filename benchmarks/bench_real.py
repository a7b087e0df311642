"""CPU render time of real trained splats: per-stage breakdown and FPS.

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
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the browser tests' helpers
from _browser import browser_ready, read_viewer_url, run_driver, stop_server  # noqa: E402
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
    from rh3dgs.ops import rasterize_to_pixels

    ones = torch.ones(*proj.opacities.shape, 1)
    rec = rasterize_to_pixels(proj.means2d, proj.conics, ones, proj.opacities, proj.depths, width, height,
                              proj.tile_size, proj.isect_offsets, proj.flatten_ids, record=True).contributions
    counts = torch.bincount(rec.pixels(), minlength=width * height).float()
    return {"mean": float(counts.mean()), "p99": float(counts.quantile(0.99)), "max": float(counts.max()),
            "row_segments_per_pixel": rec.segments.shape[0] / (width * height)}


def _ms(fn) -> float:
    return 1000 * timeit(fn, repeats=3)["median_s"]


def stage_times(g, cam) -> Tuple[Dict[str, float], object]:
    """Milliseconds of each stage of one RGB frame through ``cam`` (one view), each timed alone (median of 3):
    projection, SH colours, binning + depth sort, rasterization; and the frame's projection."""
    from rh3dgs.ops import isect_tiles, project_gaussians, rasterize_to_pixels
    from rh3dgs.rendering import _sh_colors, project

    W, H = int(cam.width), int(cam.height)
    with torch.no_grad():
        scales = g.activated_scales
        stages = {"projection": _ms(lambda: project_gaussians(g.means, g.quats, scales, cam.viewmats, cam.Ks, W, H))}
        proj = project(g, cam)
        tw, th = math.ceil(W / 16), math.ceil(H / 16)
        stages["SH colours"] = _ms(lambda: _sh_colors(g, cam))
        stages["binning + depth sort"] = _ms(lambda: isect_tiles(proj.means2d, proj.radii, proj.depths, 16, tw, th))
        col = _sh_colors(g, cam)
        stages["rasterization"] = _ms(lambda: rasterize_to_pixels(proj.means2d, proj.conics, col, proj.opacities,
                                                                  proj.depths, W, H, 16, proj.isect_offsets,
                                                                  proj.flatten_ids))
    return stages, proj


def measure(g, up, width: int, height: int) -> Dict:
    from rh3dgs import render

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
        stages, proj = stage_times(g, cams[0:1])
        W, H = width, height
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


def splats_part(root: Path) -> Tuple[Dict, str]:
    """The real splats' render times: (payload, Markdown section)."""
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
    md = (f"## real splats: CPU render time\n\n{threads} torch threads, {os.cpu_count()} CPUs, 1-min load average "
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
    return payload, md


# ====================================================================== the fox user path
FOX_DOWNSCALE = int(os.environ.get("RH3DGS_BENCH_FOX_DOWNSCALE", "4"))  # 1080x1920 -> 270x480
FOX_TRAIN_DOWNSCALE = int(os.environ.get("RH3DGS_BENCH_FOX_TRAIN_DOWNSCALE", "2"))  # images_2: 135x240
FOX_ITERS = int(os.environ.get("RH3DGS_BENCH_FOX_ITERS", "200"))
FOX_QUERIES = ("fox", "wallpaper")
# fox_part's ns-process-data output (outputs/ is not tracked), read by bench_nstrain's fox row; named by the two
# downscales, so that a run with other ones (RH3DGS_BENCH_FOX_*DOWNSCALE) neither reads nor replaces this one
FOX_CACHE = REPO / "outputs" / "bench_cache" / f"fox_ns_{FOX_DOWNSCALE}x_{FOX_TRAIN_DOWNSCALE}x"
# the stage (label, console script, arguments) that makes work/ns from work/images
COLMAP_STAGE = ("ns-process-data (COLMAP)", "ns-process-data", "images", "--data", "images", "--output-dir", "ns",
                "--no-gpu", "--matching-method", "exhaustive", "--num-downscales",
                str(int(math.log2(FOX_TRAIN_DOWNSCALE))))
PSNR_TOLERANCE_DB = 0.5

# Runs one console script (ns-train, rh3dgs...) in this interpreter and writes its peak RSS at exit:
# VmHWM of the process itself (ru_maxrss would carry the benchmark's peak over vfork + exec) and the
# largest ru_maxrss of its waited-for children (COLMAP under ns-process-data; their figure can only
# carry the stage's own peak, never the benchmark's).
_STAGE = r"""
import atexit, json, resource, sys
from importlib.metadata import entry_points
out, name = sys.argv[1], sys.argv[2]
def _peak():
    with open("/proc/self/status") as f:
        own = next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024.0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    with open(out, "w") as f:
        json.dump({"own_mb": own, "children_mb": kids}, f)
atexit.register(_peak)
ep = next(e for e in entry_points(group="console_scripts") if e.name == name)
sys.argv = [name, *sys.argv[3:]]
sys.exit(ep.load()())
"""


def _stage_env() -> Dict[str, str]:
    """The environment of a stage's process: this checkout first on PYTHONPATH, one OpenMP thread unless set."""
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def run_stage(work: Path, label: str, script: str, *args: str) -> Dict:
    """``script args`` (a console script) in a fresh interpreter: wall time, CPU time (its process tree),
    peak RSS (VmHWM, children included), exit status; its output goes to ``work/logs/<label>.log``."""
    import json as _json
    import resource
    import time

    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    rss_file = logs / f"{label}.rss.json"
    env = _stage_env()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    with open(logs / f"{label}.log", "w") as log:
        rc = subprocess.run([sys.executable, "-c", _STAGE, str(rss_file), script, *args], cwd=work, env=env,
                            stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss = _json.loads(rss_file.read_text()) if rss_file.is_file() else {}
    cmd = " ".join([script, *(a if " " not in a and ";" not in a else repr(a) for a in args)])
    rec = {"stage": label, "command": cmd, "rc": rc, "wall_s": wall,
           "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
           "peak_rss_mb": max(rss.get("own_mb", float("nan")), rss.get("children_mb", 0.0)) if rss else float("nan"),
           "log_tail": (logs / f"{label}.log").read_text(errors="replace").strip().splitlines()[-3:]}
    print(f"[fox] {label}: rc {rc}, {wall:.0f} s wall, {rec['cpu_s']:.0f} s CPU, {rec['peak_rss_mb']:.0f} MB", flush=True)
    return rec


def _eval_split(names):
    """nerfstudio's held-out frames (train_split_fraction 0.9 of the sorted file names)."""
    from nerfstudio.data.utils.dataparsers_utils import get_train_eval_split_fraction

    names = sorted(names)
    _, i_eval = get_train_eval_split_fraction(names, 0.9)
    return [names[i] for i in i_eval]


def _independent_ply_count(path: Path) -> Dict:
    """Open a PLY with plyfile (not rh3dgs's reader): vertex count, property names, all finite."""
    import numpy as np
    import plyfile

    v = plyfile.PlyData.read(str(path))["vertex"].data
    names = list(v.dtype.names)
    finite = all(bool(np.isfinite(v[n].astype(np.float64)).all()) for n in names)
    return {"file": path.name, "vertices": int(len(v)), "properties": len(names), "finite": finite,
            "sem_columns": sum(n.startswith("sem_") for n in names)}


def _fox_sheet(work: Path, scene_dir: Path, configs: Dict[str, Path], out_png: Path) -> Dict:
    """PNG sheet on nerfstudio's held-out frames: photo (undistorted), render of the lifted rh3dgs-lite scene,
    relevancy of each query; PSNR of the render against the photo. (The baseline run has no semantic field:
    rh3dgs.load refuses it; its PSNR is ns-eval's, in the table.)"""
    import numpy as np
    from PIL import Image

    import rh3dgs

    def psnr(a, b):
        return float(-10 * np.log10(np.mean((a - b) ** 2)))

    scene = rh3dgs.load(scene_dir)
    names = list(scene.cameras.names)
    held = [n for n in _eval_split(names)][:3]
    rows, psnrs = [], {"rh3dgs-lite": []}
    for n in held:
        cam = scene.cameras[names.index(n)]
        photo = next((work / "xcache" / "images").rglob(f"{n}.png"))  # the undistorted copy the lift read
        gt = np.asarray(Image.open(photo).convert("RGB"), dtype=np.float32) / 255
        lite = scene.render(cam).clamp(0, 1).numpy()
        psnrs["rh3dgs-lite"].append(psnr(lite, gt))
        rel = scene.render_relevancy(cam, list(FOX_QUERIES)).numpy()  # [Q, H, W]
        heat = [np.stack([r, np.zeros_like(r), 1 - r], -1) * 0.6 + gt * 0.4 for r in rel]
        rows.append(np.concatenate([gt, lite, *heat], axis=1))
    sheet = (np.concatenate(rows, axis=0) * 255 + 0.5).clip(0, 255).astype(np.uint8)
    from rh3dgs.io.atomic import atomic_save_png

    out_png.parent.mkdir(parents=True, exist_ok=True)
    atomic_save_png(out_png, sheet)
    return {"frames": held, "columns": ["photo (undistorted)", "rh3dgs-lite (lifted scene)",
                                        *[f"relevancy '{q}' (red = 1)" for q in FOX_QUERIES]],
            "psnr_sheet": {k: statistics.mean(v) for k, v in psnrs.items()}, "png": out_png.name}


def _fox_render(scene_dir: Path) -> list:
    """Render figures of the trained fox Gaussians: dataset resolution (its first camera) and 1280x720."""
    import rh3dgs
    from rh3dgs import Cameras

    scene = rh3dgs.load(scene_dir)
    g, cam = scene.gaussians, scene.cameras[0]
    out = []
    for W, H in ((int(cam.width), int(cam.height)), (1280, 720)):
        K = cam.Ks.clone()
        s = H / float(cam.height)  # same vertical field of view, square pixels
        K[:, 0, 0] *= s
        K[:, 1, 1] *= s
        K[:, 0, 2], K[:, 1, 2] = W / 2, H / 2
        c = Cameras(cam.viewmats, K, W, H)
        with torch.no_grad():
            frame = timeit(lambda: rh3dgs.render(g, c), repeats=3)["median_s"]
        stages, proj = stage_times(g, c)
        out.append({"size": f"{W}x{H}", "gaussians": len(g), "visible": int((proj.radii > 0).sum()),
                    "isects_per_pixel": proj.flatten_ids.numel() / (W * H),
                    "composited_per_pixel": composited_per_pixel(proj, W, H)["mean"], "frame_ms": 1000 * frame,
                    "stages_ms": stages})
    return out


def _view_stage(work: Path, scene_dir: Path, query: str, out_png: Path) -> Dict:
    """``rh3dgs view SCENE`` on the fox scene, as a user opens it: seconds until it prints its URL, then
    headless chromium through the browser tests' driver (``tests/browser/drive_viewer.js``: the RGB frame, a
    text query's heat map, a camera drag) when chromium and the driver are installed; the server's peak
    RSS (VmHWM before it stops). The heat-map screenshot goes to ``out_png``."""
    import time

    cmd = ["view", str(scene_dir.relative_to(work)), "--port", "0", "--device", "cpu", "--output", "viewout"]
    rec = {"stage": "rh3dgs view", "command": "rh3dgs " + " ".join(cmd) + f" + headless chromium (query '{query}', "
           "camera drag)", "rc": 1, "wall_s": float("nan"), "cpu_s": float("nan"), "peak_rss_mb": float("nan")}
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "rh3dgs.cli", *cmd], cwd=work, env=_stage_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, lines = read_viewer_url(proc, 600)
        rec["ready_s"] = time.perf_counter() - t
        if url is None:
            rec["log_tail"] = [ln.rstrip() for ln in lines[-3:]]
            return rec
        chromium, why = browser_ready()
        if chromium is None:
            rec.update(rc=0, browser=f"not driven: {why}")
        else:
            shots = work / "viewshots"
            res = run_driver("drive_viewer.js", [url, shots, query], chromium, 900)
            rec.update(rc=0, browser="headless chromium", frames=res["frames"])
            if (shots / "heat.png").is_file():
                shutil.copyfile(shots / "heat.png", out_png)
                rec["png"] = out_png.name
        with open(f"/proc/{proc.pid}/status") as f:
            rec["peak_rss_mb"] = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM")) / 1024.0
    finally:
        stop_server(proc, 10)
        rec["wall_s"] = time.perf_counter() - t
    print(f"[fox] rh3dgs view: ready in {rec['ready_s']:.0f} s, {rec.get('browser', '')}", flush=True)
    return rec


#: the lift's stages in its profile: (label, function qualified name as cProfile names it)
LIFT_STAGES = (
    ("read PLY, cameras, frame", ("load_ply", "load_transforms", "to_data_frame")),
    ("teacher model (open_clip import + build)", ("make_teacher",)),
    ("teacher maps (cache)", ("dataset_maps",)),
    ("views: render (projection, binning, RGB + depth moments)", ("render",)),
    ("views: teacher maps, guided upsampling", ("get_maps",)),
    ("views: VCD pixel weights", ("pixel_weights",)),
    ("passes: aggregate on the sphere (native)", ("aggregate_sphere", "aggregate_sphere_replay")),
    ("fill from 3D neighbours", ("fill_from_neighbours",)),
    ("PCA decoder", ("pca_decoder",)),
    ("write scene folder", ("save_scene",)),
)


def _lift_profile(work: Path, prof: Path) -> Dict:
    """cProfile of the lift stage: cumulative seconds of each :data:`LIFT_STAGES` function and the ten
    rh3dgs functions with the largest own time."""
    import pstats

    st = pstats.Stats(str(prof))
    total = max(v[3] for v in st.stats.values())
    stages = []
    for label, names in LIFT_STAGES:
        hits = [(k, v) for k, v in st.stats.items() if k[2] in names and "/rh3dgs/" in k[0]]
        # outermost calls only: a function's cumulative time already holds its recursive / nested calls
        stages.append({"stage": label, "functions": sorted({f"{Path(k[0]).stem}.{k[2]}" for k, _ in hits}),
                       "calls": sum(v[1] for _, v in hits), "cum_s": sum(v[3] for _, v in hits)})
    own = sorted(((v[2], f"{Path(k[0]).parent.name}/{Path(k[0]).name}:{k[2]}", v[1]) for k, v in st.stats.items()
                  if "/rh3dgs/" in k[0] or k[0] == "~"), reverse=True)[:10]
    return {"total_s": total, "stages": stages, "top_own": [{"function": n, "own_s": t, "calls": c} for t, n, c in own]}


def _ensure_system() -> Optional[str]:
    """COLMAP and ffmpeg (``ns-process-data images``) and the headless browser (the view stage): the
    project's own set-up installs what is missing (``scripts/setup_system.sh colmap test``, idempotent);
    returns its last line when it could not, else None."""
    if shutil.which("colmap") and shutil.which("ffmpeg") and browser_ready()[0]:
        return None
    print("[fox] installing COLMAP / ffmpeg / the browser: scripts/setup_system.sh colmap test", flush=True)
    p = subprocess.run(["bash", str(REPO / "scripts" / "setup_system.sh"), "colmap", "test"], cwd=REPO,
                       capture_output=True, text=True)
    tail = (p.stderr.strip() or p.stdout.strip()).splitlines()[-1:] or [""]
    return None if p.returncode == 0 else tail[0]


def downscale_photos(fox: Path, dest: Path) -> Tuple[list, Tuple[int, int]]:
    """A FOX_DOWNSCALE-times smaller copy of the fox photos in ``dest`` (the data itself is never edited or
    copied into the repository): the photos and the copies' (width, height)."""
    from PIL import Image

    dest.mkdir(parents=True, exist_ok=True)
    photos = sorted((fox / "images").glob("*.jpg"))
    for p in photos:
        with Image.open(p) as im:
            im.reduce(FOX_DOWNSCALE).save(dest / p.name, quality=95)
    with Image.open(dest / photos[0].name) as im:
        return photos, im.size


def cache_fox_dataset(ns: Path) -> None:
    """Keep ``ns`` (ns-process-data's output: the downscaled photos, COLMAP's poses and seed points) as
    FOX_CACHE for bench_nstrain's fox row, replacing an older copy whole (copied, then renamed)."""
    FOX_CACHE.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="fox_ns.", dir=FOX_CACHE.parent))
    shutil.copytree(ns, tmp / "ns", ignore=shutil.ignore_patterns("colmap"))
    shutil.rmtree(FOX_CACHE, ignore_errors=True)
    os.replace(tmp / "ns", FOX_CACHE)
    shutil.rmtree(tmp, ignore_errors=True)


def fox_dataset(root: Path) -> Optional[Path]:
    """The fox as a nerfstudio dataset at 1/FOX_DOWNSCALE (ns-process-data, COLMAP): the copy the last
    ``fox_part`` kept (FOX_CACHE), else made now (~1.5 min); None if COLMAP did not give one."""
    if (FOX_CACHE / "transforms.json").is_file():
        return FOX_CACHE
    work = Path(tempfile.mkdtemp(prefix="rh3dgs-fox-data-"))
    try:
        downscale_photos(root / "fox", work / "images")
        problem = _ensure_system()
        if problem:
            print(f"[fox] set-up: {problem}", flush=True)
        run_stage(work, *COLMAP_STAGE)
        if not (work / "ns" / "transforms.json").is_file():
            return None
        cache_fox_dataset(work / "ns")
        return FOX_CACHE
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fox_part(root: Path, keep: Optional[Path] = None) -> Tuple[Dict, str]:
    """The user path on ``realdata/fox`` on CPU: ns-process-data (COLMAP) -> ns-train rh3dgs-lite and the
    splatfacto baseline (same preset, semantics off: splatfacto on rh3dgs's rasterizer) -> ns-eval ->
    rh3dgs export / extract / lift / query / select / export -> ns-export gaussian-splat; a PNG sheet."""
    import json as _json

    fox = root / "fox"
    load = os.getloadavg()[0]
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="rh3dgs-fox-"))
    work.mkdir(parents=True, exist_ok=True)
    stages = []
    # 0. a downscaled copy of the photos in the work folder (the data itself is never edited or copied
    # into the repository): COLMAP's SIFT at 2 MP takes most of an hour on 2 shared cores
    import time

    t = time.perf_counter()
    photos, size = downscale_photos(fox, work / "images")
    stages.append({"stage": "downscale copy", "command": f"PIL Image.reduce({FOX_DOWNSCALE}) of {len(photos)} photos",
                   "rc": 0, "wall_s": time.perf_counter() - t, "cpu_s": float("nan"), "peak_rss_mb": float("nan")})
    done_file = work / "stages.json"  # with RH3DGS_BENCH_FOX_KEEP: a rerun reuses the stages that succeeded
    done = {r["stage"]: r for r in _json.loads(done_file.read_text())} if keep and done_file.is_file() else {}

    def S(label: str, *a: str) -> Dict:
        rec = done.get(label)
        if rec is None or rec["rc"] != 0:
            rec = done[label] = run_stage(work, label, *a)
            if keep:
                from rh3dgs.io.atomic import atomic_save_json

                atomic_save_json(done_file, list(done.values()))
        stages.append(rec)
        return rec

    setup_problem = _ensure_system()
    if setup_problem:
        print(f"[fox] set-up: {setup_problem}", flush=True)
    S(*COLMAP_STAGE)
    if (work / "ns" / "transforms.json").is_file():
        cache_fox_dataset(work / "ns")
    seed = _independent_ply_count(work / "ns" / "sparse_pc.ply") if (work / "ns" / "sparse_pc.ply").is_file() else {}
    frames = len(_json.loads((work / "ns" / "transforms.json").read_text())["frames"]) \
        if (work / "ns" / "transforms.json").is_file() else 0
    common = ["--machine.device-type", "cpu", "--vis", "tensorboard", "--output-dir", "out", "--experiment-name", "fox",
              "--max-num-iterations", str(FOX_ITERS), "--viewer.quit-on-train-completion", "True",
              "--pipeline.datamanager.teacher.name", "tiny-clip", "--pipeline.datamanager.teacher-cache-dir", "cache"]
    configs = {"rh3dgs-lite": work / "out/fox/rh3dgs-lite/lite/config.yml",
               "baseline": work / "out/fox/rh3dgs-lite/baseline/config.yml"}
    parser = ["nerfstudio-data", "--downscale-factor", str(FOX_TRAIN_DOWNSCALE)]  # images_N, the nerfstudio way
    ds = ["--downscale", str(FOX_TRAIN_DOWNSCALE)]
    S("ns-train rh3dgs-lite", "ns-train", "rh3dgs-lite", *common, "--timestamp", "lite", "--data", "ns", *parser)
    S("ns-train baseline", "ns-train", "rh3dgs-lite", *common, "--timestamp", "baseline",
      "--pipeline.model.semantics", "False", "--data", "ns", *parser)
    evals = {}
    for name, cfg in configs.items():
        S(f"ns-eval {name}", "ns-eval", "--load-config", str(cfg), "--output-path", f"eval_{name}.json")
        f = work / f"eval_{name}.json"
        evals[name] = _json.loads(f.read_text())["results"] if f.is_file() else {}
    S("rh3dgs export (ns run)", "rh3dgs", "export", str(configs["rh3dgs-lite"]), "--output", "fox_lite.ply")
    S("rh3dgs extract", "rh3dgs", "extract", "--data", "ns", "--teacher", "tiny-clip", "--cache", "xcache", *ds)
    lift_args = ("lift", "fox_lite.ply", "--data", "ns", "--teacher", "tiny-clip", "--cache", "xcache", *ds)
    S("rh3dgs lift", "rh3dgs", *lift_args, "--output", "scene")
    profile = {}
    if (work / "scene" / "rh3dgs.json").is_file():  # the same lift again under cProfile, into another folder
        prof = work / "logs" / "lift.prof"
        run = ("import cProfile, sys; from rh3dgs.cli import main; p = cProfile.Profile(); "
               "code = p.runcall(main, sys.argv[2:]); p.dump_stats(sys.argv[1]); sys.exit(code)")
        subprocess.run([sys.executable, "-c", run, str(prof), *lift_args, "--output", "scene_profiled",
                        "--overwrite"], cwd=work, env=_stage_env(), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        profile = _lift_profile(work, prof) if prof.is_file() else {}
    S("rh3dgs query", "rh3dgs", "query", "scene", ";".join(FOX_QUERIES), "--views", "0", "--output", "query")
    if (work / "scene" / "rh3dgs.json").is_file():
        stages.append(_view_stage(work, work / "scene", FOX_QUERIES[0],
                                  REPO / "benchmarks" / "results" / "real_fox_view.png"))
    S("rh3dgs select", "rh3dgs", "select", "scene", FOX_QUERIES[0], "--output", "fox_selected.ply")
    S("rh3dgs export (scene)", "rh3dgs", "export", "scene", "--output", "scene.ply")
    S("ns-export gaussian-splat", "ns-export", "gaussian-splat", "--load-config", str(configs["rh3dgs-lite"]),
      "--output-dir", "nsexport")
    plys = [_independent_ply_count(p) for p in (work / "fox_lite.ply", work / "scene.ply", work / "fox_selected.ply",
                                                work / "nsexport" / "splat.ply") if p.is_file()]
    sheet, render_runs = {}, []
    if (work / "scene" / "rh3dgs.json").is_file():
        sheet = _fox_sheet(work, work / "scene", configs, REPO / "benchmarks" / "results" / "real_fox.png")
        render_runs = _fox_render(work / "scene")
    p_lite, p_base = (evals.get(k, {}).get("psnr", float("nan")) for k in ("rh3dgs-lite", "baseline"))
    payload = {"downscale": FOX_DOWNSCALE, "train_downscale": FOX_TRAIN_DOWNSCALE, "image_size": list(size), "photos": len(photos), "iterations": FOX_ITERS,
               "frames_registered": frames, "seed_points": seed.get("vertices", 0), "stages": stages,
               "eval": evals, "psnr_gap_db": p_lite - p_base,
               "psnr_accepted": bool(p_lite >= p_base - PSNR_TOLERANCE_DB), "plys": plys, "sheet": sheet,
               "render": render_runs, "lift_profile": profile, "load_average_start": load, "load_average_end": os.getloadavg()[0],
               "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1"), "work": str(work) if keep else None}
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return payload, fox_markdown(payload)


def fox_markdown(p: Dict) -> str:
    f = lambda v, d=0: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.{d}f}"  # noqa: E731
    W, H = p["image_size"]
    lines = [
        "## the fox user path on CPU (realdata/fox)", "",
        f"{p['photos']} photos downscaled {p['downscale']}x to {W}x{H} (a copy in a temp folder; COLMAP runs on "
        f"these), trained and lifted at 1/{p.get('train_downscale', 1)} of that (`images_{p.get('train_downscale', 1)}`, "
        "`nerfstudio-data --downscale-factor`, `rh3dgs --downscale`), "
        f"`ns-process-data images` (COLMAP, CPU, exhaustive matching): {p['frames_registered']} frames registered, "
        f"{f(p['seed_points'])} SfM seed points. Both trainings: the `rh3dgs-lite` preset capped at "
        f"{p['iterations']} iterations, same data, same seed points, same run; baseline = the same preset with "
        "`--pipeline.model.semantics False` (splatfacto's model, losses and densification on rh3dgs's CPU "
        "rasterizer: nerfstudio's own splatfacto cannot run on a CPU). Teacher: `tiny-clip` (random-initialised "
        f"open_clip, no weights on this machine). OMP_NUM_THREADS={p['omp_num_threads']}; 1-min load average "
        f"{p['load_average_start']:.1f} at the start, {p['load_average_end']:.1f} at the end (2 cores shared with "
        "other engineers: wall times grow with the load, CPU times less). Peak RSS = VmHWM of the stage's "
        "process (its children, e.g. COLMAP, included).", "",
        "| stage | command | wall (s) | CPU (s) | peak RSS (MB) | status |", "|---|---|---|---|---|---|"]
    for s in p["stages"]:
        lines.append(f"| {s['stage']} | `{s['command']}` | {f(s['wall_s'])} | {f(s['cpu_s'])} | {f(s['peak_rss_mb'])} "
                     f"| {'ok' if s['rc'] == 0 else 'rc ' + str(s['rc'])} |")
    lines += ["", "Held-out frames (nerfstudio's split: 10 %, `ns-eval`):", "",
              "| method | PSNR (dB) | SSIM | Gaussians |", "|---|---|---|---|"]
    for k, e in p["eval"].items():
        lines.append(f"| {k} | {f(e.get('psnr'), 2)} | {f(e.get('ssim'), 3)} | {f(e.get('num_gaussians'))} |")
    gap = p["psnr_gap_db"]
    lines += ["", f"PSNR of rh3dgs-lite - baseline: **{f(gap, 2)} dB**; acceptance (within {PSNR_TOLERANCE_DB} dB of "
              f"the baseline): **{'met' if p['psnr_accepted'] else 'NOT met'}** at {p['iterations']} iterations.", ""]
    if p["plys"]:
        lines += ["PLYs opened by an independent reader (plyfile):", "", "| file | vertices | properties | sem_* | finite |",
                  "|---|---|---|---|---|"]
        lines += [f"| {q['file']} | {q['vertices']:,} | {q['properties']} | {q['sem_columns']} | {q['finite']} |"
                  for q in p["plys"]]
        lines.append("")
    if p["render"]:
        names = list(p["render"][0].get("stages_ms", {}))
        lines += ["Render of the lifted fox scene (`rh3dgs.render`, RGB, median of 3; stages timed alone, "
                  "`stage_times`):", "",
                  "| size | Gaussians (visible) | tile isects / pixel | composited / pixel | "
                  + "".join(f"{n} (ms) | " for n in names) + "frame (ms) |",
                  "|---|---|---|---|" + "---|" * len(names) + "---|"]
        lines += [f"| {r['size']} | {r['gaussians']:,} ({r['visible']:,}) | {r['isects_per_pixel']:.2f} | "
                  f"{r['composited_per_pixel']:.1f} | " + "".join(f"{r['stages_ms'][n]:.0f} | " for n in names)
                  + f"{r['frame_ms']:.0f} |" for r in p["render"]]
        lines.append("")
    view = next((s for s in p["stages"] if s["stage"] == "rh3dgs view"), None)
    if view is not None:
        fr = view.get("frames", {})
        lines += [f"`rh3dgs view`: URL printed {f(view.get('ready_s'), 1)} s after the command (the scene loaded); "
                  f"browser: {view.get('browser', '-')}; the viewer's frame captions: "
                  + "; ".join(f"{k}: '{v}'" for k, v in fr.items()) + "."
                  + (f" ![fox view]({view['png']}) `{view['png']}` (heat map of the query)." if view.get("png") else ""),
                  ""]
    prof = p.get("lift_profile") or {}
    if prof:
        lines += [f"Profile of the lift (cProfile of the same `rh3dgs lift`, {f(prof['total_s'], 1)} s under the "
                  "profiler; cumulative time of each stage's functions):", "",
                  "| stage | functions | calls | seconds | share |", "|---|---|---|---|---|"]
        lines += [f"| {s['stage']} | {', '.join(s['functions']) or '-'} | {s['calls']} | {s['cum_s']:.1f} | "
                  f"{100 * s['cum_s'] / prof['total_s']:.0f} % |" for s in prof["stages"]]
        lines += ["", "Largest own time (rh3dgs functions and native calls):", "", "| function | calls | own (s) |",
                  "|---|---|---|"]
        lines += [f"| `{t['function']}` | {t['calls']} | {t['own_s']:.1f} |" for t in prof["top_own"]]
        lines.append("")
    if p["sheet"]:
        s = p["sheet"]
        lines += [f"![fox sheet]({s['png']}) `{s['png']}`: held-out frames {', '.join(s['frames'])}; columns: "
                  + ", ".join(s["columns"]) + "; PSNR on these frames: "
                  + ", ".join(f"{k} {v:.2f} dB" for k, v in s["psnr_sheet"].items()) + ".", ""]
    return "\n".join(lines)


def main(parts: Tuple[str, ...] = ("splats", "fox")) -> Dict:
    """Run ``parts`` and write results/real.{json,md}; a part not run keeps its previous results."""
    import json as _json

    root = realdata_dir()
    if root is None:
        reason = "skipped: shared/realdata not found (set RH3DGS_REALDATA); the real data is not redistributable"
        print(reason)
        return {"skipped": reason}
    old_file = REPO / "benchmarks" / "results" / "real.json"
    old = _json.loads(old_file.read_text()) if old_file.is_file() else {}
    if old and "splats" not in old and "runs" in old:  # the splats-only layout before the fox part
        md_file = old_file.with_suffix(".md")
        old = {"splats": {**old, "markdown": md_file.read_text().replace("# real splats", "## real splats", 1)
                          if md_file.is_file() else ""}}
    payload = {k: v for k, v in old.items() if k in ("splats", "fox")}
    keep = os.environ.get("RH3DGS_BENCH_FOX_KEEP")
    for part in parts:
        res, md = splats_part(root) if part == "splats" else fox_part(root, Path(keep) if keep else None)
        payload[part] = {**res, "markdown": md}
    md = "# real data on CPU\n\n" + "\n".join(payload[k]["markdown"] for k in ("fox", "splats") if k in payload)
    return write_results("real", {**payload, "machine": machine()}, md)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parts", nargs="*", choices=["splats", "fox"], default=["splats", "fox"])
    main(tuple(ap.parse_args().parts))
