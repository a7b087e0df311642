"""Ground-truth evaluation of semantic scenes, and the synthetic ablation suite.

:func:`evaluate_scene` scores one semantic scene folder (``rh3dgs.load``: written by
``rh3dgs lift``, the demo, or :func:`run_suite`) against a labelled dataset folder in the
layout of :func:`rh3dgs.data.synthetic.write_dataset` (``masks/<stem>.png`` class ids with
255 = background, ``classes.txt``, optionally ``scene.ply`` with a per-Gaussian ``class_id``).

Protocols (every view whose stem has a mask; queries = the class names of ``classes.txt``):

``ovs3d`` (default; the 3D-OVS argmax protocol)
    per pixel, argmax over the classes of the cosine between the rendered, decoded feature
    and each class's text embedding (the argmax of LERF relevancy is the same: relevancy
    is monotone in the query cosine for a fixed pixel). **Choice:** only pixels with a
    ground-truth class count (background pixels are ignored, so the silhouette is given:
    every method is scored on semantics, not geometry). ``miou`` = mean IoU over the
    (view, class) pairs where the class occurs in the ground truth or the prediction;
    ``mbiou`` = mean boundary IoU (Cheng et al. 2021, band 2 % of the image diagonal,
    :func:`rh3dgs.eval.metrics.boundary_iou`) over (view, class present in the ground
    truth) of the predicted class mask against the ground-truth mask; ``accuracy`` = pixel
    accuracy over labelled pixels.
``lerf``
    (also computed) LERF-OVS mask protocol per (view, class present): relevancy with the
    canonical negatives -> LangSplat smoothing / normalisation / 0.4 threshold / 7x7
    majority (:func:`rh3dgs.eval.protocols.lerf_ovs_mask`) -> IoU; ``lerf_miou`` is their mean.
3D
    per-Gaussian argmax over the classes of the decoded latents vs the dataset's
    ``class_id`` (``miou_3d``); Gaussians without a valid feature count as "no class".

:func:`run_suite` builds ``len(scene_seeds)`` synthetic scenes x ``len(teacher_seeds)`` simulated
teachers and runs every ablation row (lift and distillation variants) on each, writing
``results.json``, ``results.md`` and qualitative PNGs.
"""
from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..data.labelled import BACKGROUND, LabelledDataset
from ..errors import ConfigError, InputFileError
from .metrics import boundary_iou, iou, miou_3d
from .protocols import lerf_ovs_mask

__all__ = ["evaluate_scene", "SuiteConfig", "SUITE_ROWS", "run_suite", "PeakMemory", "read_gt_dataset"]

PathLike = Union[str, Path]


# ----------------------------------------------------------------------------- memory
class PeakMemory:
    """Peak memory of a block: CUDA ``max_memory_allocated`` on a GPU, else peak RSS growth.

    On CPU a thread samples the process's resident set size (``/proc/self/statm``) every
    ``interval`` seconds; ``peak_bytes`` is the largest RSS seen minus the RSS at entry
    (0 where ``/proc`` is unavailable). Sampling can miss allocations shorter than the interval.
    """

    def __init__(self, device: Union[str, torch.device] = "cpu", interval: float = 0.005):
        self.device = torch.device(device)
        self.interval = interval
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def _rss(self) -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            return 0

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        self._base = self._rss()
        self._max = self._base

        def loop():
            while not self._stop.wait(self.interval):
                self._max = max(self._max, self._rss())

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device) - self._base)
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._max = max(self._max, self._rss())
        self.peak_bytes = int(max(0, self._max - self._base))


# ----------------------------------------------------------------------------- ground truth
def read_gt_dataset(dataset_dir: PathLike) -> Tuple[List[str], Dict[str, np.ndarray], Optional[np.ndarray]]:
    """(class names, {stem: int64 [H, W] mask, 255 = background}, per-Gaussian class ids or None)."""
    ds = LabelledDataset.open(dataset_dir)
    return ds.classes, ds.masks(), ds.class_ids()


# ----------------------------------------------------------------------------- one scene
def evaluate_scene(scene, dataset_dir: PathLike, views: Optional[Sequence[int]] = None,
                   gt_class_ids: Optional[np.ndarray] = None, lerf: bool = True,
                   dilation_ratio: float = 0.02, return_maps: bool = False) -> Dict[str, object]:
    """Score a semantic scene (folder path or :class:`rh3dgs.api.Scene`) against a labelled dataset.

    Returns a dict with ``miou``, ``mbiou``, ``accuracy``, ``lerf_miou`` (2D, see the module
    docstring), ``miou_3d`` (when per-Gaussian ground truth is available and matches N),
    ``num_views``, ``classes``, and with ``return_maps`` ``maps``: {view stem: (argmax [H, W],
    scores [K, H, W] cosines)}.
    """
    from ..api import load
    from ..io.transforms import load_transforms

    sc = load(scene) if isinstance(scene, (str, Path)) else scene
    field_ = sc._require_field()
    classes, masks, gt3d = read_gt_dataset(dataset_dir)
    if gt_class_ids is not None:
        gt3d = np.asarray(gt_class_ids).astype(np.int64)
    cams = sc.cameras
    if cams is None:
        tj = Path(dataset_dir) / "transforms.json"
        if not tj.is_file():
            raise ConfigError(f"the scene has no cameras and {tj} does not exist")
        cams, _ = load_transforms(tj, check_images=False)
    names = cams.names or [f"frame_{i:05d}" for i in range(len(cams))]
    pairs = [(i, n) for i, n in enumerate(names) if n in masks]
    if views is not None:
        keep = set(int(v) for v in views)
        pairs = [(i, n) for i, n in pairs if i in keep]
    if not pairs:
        raise ConfigError(f"no camera of the scene has a mask in {Path(dataset_dir) / 'masks'} "
                          f"(camera names {names[:3]}..., masks {sorted(masks)[:3]}...)")
    K = len(classes)
    text = sc.encode(list(classes))  # [K, D]
    neg = sc._negatives(None)
    from ..query import relevancy_from_cosines

    ious, bious, lerf_ious, correct, total = [], [], [], 0, 0
    maps = {}
    for i, stem in pairs:
        gt = masks[stem]
        lat, alpha, _ = sc.render_latents(i)
        if lat.shape[:2] != gt.shape:
            raise InputFileError(Path(dataset_dir) / "masks" / f"{stem}.png",
                                 f"mask size {list(gt.shape)} != rendered size {list(lat.shape[:2])}")
        cos = field_.cosine(lat, text)  # [H, W, K]
        pred = cos.argmax(-1).cpu().numpy()
        fg = gt != BACKGROUND
        pred_fg = np.where(fg, pred, -1)
        correct += int(np.count_nonzero((pred == gt) & fg))
        total += int(np.count_nonzero(fg))
        rel = None
        if lerf:
            ncos = field_.cosine(lat, neg) if len(neg) else lat.new_zeros(*lat.shape[:2], 0)
            rel = (relevancy_from_cosines(cos, ncos, sc.temperature) * (alpha >= 0.1)[..., None]).cpu().numpy()
        for k in range(K):
            g, p = gt == k, pred_fg == k
            if g.any() or p.any():
                ious.append(iou(p, g))
            if g.any():
                bious.append(boundary_iou(p, g, dilation_ratio))
                if rel is not None:
                    lerf_ious.append(iou(lerf_ovs_mask(rel[..., k]), g))
        if return_maps:
            maps[stem] = (pred_fg, cos.permute(2, 0, 1).cpu().numpy(), None if rel is None else np.moveaxis(rel, -1, 0))
    out: Dict[str, object] = {
        "miou": float(np.mean(ious)) if ious else math.nan,
        "mbiou": float(np.mean(bious)) if bious else math.nan,
        "accuracy": correct / total if total else math.nan,
        "lerf_miou": float(np.mean(lerf_ious)) if lerf_ious else math.nan,
        "num_views": len(pairs),
        "classes": classes,
    }
    if gt3d is not None and len(gt3d) == len(sc.gaussians):
        feats = field_.decode()
        pred3d = (feats @ text.T).argmax(-1)
        if field_.valid is not None:
            pred3d[~field_.valid.to(pred3d.device)] = -1
        out["miou_3d"] = miou_3d(pred3d.cpu().numpy(), gt3d, num_classes=K)
    if return_maps:
        out["maps"] = maps
    return out


def scene_report_markdown(result: Dict[str, object], title: str = "Evaluation") -> str:
    keys = [("miou", "mIoU (3D-OVS argmax)"), ("mbiou", "mBIoU"), ("accuracy", "pixel accuracy"),
            ("lerf_miou", "mIoU (LERF-OVS threshold)"), ("miou_3d", "3D mIoU (per Gaussian)")]
    lines = [f"# {title}", "", "| metric | value |", "| --- | --- |"]
    for k, label in keys:
        if k in result:
            lines.append(f"| {label} | {100 * float(result[k]):.2f} |")
    lines += ["", f"{result['num_views']} views, classes: {', '.join(result['classes'])}", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the suite
#: (row name, kind, settings) of the ablation table; "lift" rows take LiftConfig kwargs,
#: "distill" rows DistillConfig kwargs.
SUITE_ROWS: List[Tuple[str, str, dict]] = [
    ("Euclidean lift (LUDVIG-style)", "lift", dict(method="euclidean", use_vcd=False)),
    ("robust lift, no VCD", "lift", dict(method="robust", use_vcd=False)),
    ("robust lift + VCD (ours, training-free)", "lift", dict()),
    ("distill: cosine (baseline)", "distill", dict()),
    ("distill: + VCD", "distill", dict(use_vcd=True)),
    ("distill: + VCD + VFM", "distill", dict(use_vcd=True, use_vfm=True)),
    ("distill: full (VCD + VFM + LIC)", "distill", dict(use_vcd=True, use_vfm=True, use_lic=True)),
]


@dataclass
class SuiteConfig:
    """Settings of :func:`run_suite` (defaults: the full suite; :meth:`quick` for tests)."""

    scene_seeds: Tuple[int, ...] = (0, 1, 2, 3)
    teacher_seeds: Tuple[int, ...] = (0, 1)
    image_size: int = 48
    num_views: int = 12
    gaussians_per_unit_area: float = 700.0
    teacher: Dict[str, object] = field(default_factory=dict)
    """TeacherSimConfig overrides (besides ``seed``); default: the simulator's defaults."""
    distill_steps: int = 150
    distill: Dict[str, object] = field(default_factory=dict)
    """DistillConfig overrides common to every distillation row."""
    rows: Optional[Tuple[str, ...]] = None
    """Row names to run (None = all of :data:`SUITE_ROWS`)."""
    qualitative_view: int = 1
    qualitative_query: str = "purple ball"
    threads: int = 0
    """torch threads (0 = leave as is)."""

    @classmethod
    def quick(cls, **overrides) -> "SuiteConfig":
        base = dict(scene_seeds=(0,), teacher_seeds=(0,), image_size=48, num_views=8, gaussians_per_unit_area=500.0,
                    distill_steps=60)
        base.update(overrides)
        return cls(**base)


def _load_dataset_arrays(data_dir: Path, names: Sequence[str]):
    return LabelledDataset.open(data_dir).arrays(names)


def _label_colors(K: int) -> np.ndarray:
    base = np.array([[140, 130, 115], [216, 31, 26], [31, 64, 216], [38, 178, 51], [235, 209, 26], [200, 200, 196],
                     [140, 51, 178], [90, 90, 90], [255, 128, 0], [0, 200, 200]], dtype=np.uint8)
    reps = int(math.ceil(K / len(base)))
    return np.concatenate([base] * reps)[:K]


def _label_image(lab: np.ndarray, K: int) -> np.ndarray:
    col = _label_colors(K)
    out = np.zeros(lab.shape + (3,), np.uint8)
    ok = (lab >= 0) & (lab < K)
    out[ok] = col[lab[ok]]
    return out


def _grid_png(path: Path, tiles: List[Tuple[str, np.ndarray]], cols: int, scale: int = 3) -> None:
    from PIL import Image, ImageDraw

    from ..io.atomic import atomic_save_png

    h, w = tiles[0][1].shape[:2]
    th, tw, pad = h * scale, w * scale, 14
    rows = int(math.ceil(len(tiles) / cols))
    canvas = Image.new("RGB", (cols * tw, rows * (th + pad)), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for k, (label, img) in enumerate(tiles):
        r, c = divmod(k, cols)
        im = Image.fromarray(img).resize((tw, th), Image.NEAREST)
        canvas.paste(im, (c * tw, r * (th + pad) + pad))
        draw.text((c * tw + 2, r * (th + pad) + 1), label[: max(8, tw // 6)], fill=(0, 0, 0))
    atomic_save_png(path, np.array(canvas))


def _fmt(vals: List[float], scale: float = 100.0, digits: int = 2) -> str:
    v = [x for x in vals if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not v:
        return "-"
    m = scale * float(np.mean(v))
    if len(v) == 1:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {scale * float(np.std(v)):.{digits}f}"


def suite_markdown(summary: Dict[str, object], image_prefix: str = "") -> str:
    cfg = summary["config"]
    rows = summary["rows"]
    runs = summary["runs"]
    lines = [
        "# Ground-truth ablation on synthetic scenes",
        "",
        f"Generated by `rh3dgs eval --suite synthetic{' --quick' if summary.get('quick') else ''}` "
        f"({summary['seconds']:.0f} s on {summary['device']}, {summary['threads']} torch threads). "
        f"{len(cfg['scene_seeds'])} scenes (`SceneConfig.seed` in {list(cfg['scene_seeds'])}, "
        f"{cfg['image_size']}x{cfg['image_size']} px, {cfg['num_views']} views, "
        f"{cfg['gaussians_per_unit_area']:g} Gaussians/m^2) x {len(cfg['teacher_seeds'])} simulated teachers "
        f"(`TeacherSimConfig` defaults{(' + ' + str(cfg['teacher'])) if cfg['teacher'] else ''}, seeds "
        f"{list(cfg['teacher_seeds'])}); distillation {cfg['distill_steps']} Adam steps on fixed geometry. "
        "Values: mean ± std over the scene x teacher runs, in percent.",
        "",
        *([] if summary.get("complete", True) else
          [f"**PARTIAL: {summary['runs_done']} of {summary['runs_total']} runs finished when this was written.**", ""]),
        "| row | mIoU | mBIoU | 3D mIoU | LERF-OVS mIoU | time (s) | peak mem (MB) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in rows:
        rs = [r for r in runs if r["row"] == name]
        lines.append("| " + " | ".join([
            name, _fmt([r["miou"] for r in rs]), _fmt([r["mbiou"] for r in rs]),
            _fmt([r.get("miou_3d", math.nan) for r in rs]), _fmt([r["lerf_miou"] for r in rs]),
            _fmt([r["seconds"] for r in rs], 1.0, 1), _fmt([r["peak_bytes"] / 2 ** 20 for r in rs], 1.0, 0)]) + " |")
    lines += ["", "## What the table shows (computed from the numbers above)", ""]
    lines += summary["verdict"]
    lines += ["", "## Qualitative maps", ""]
    for p in summary.get("pngs", []):
        lines.append(f"![{Path(p).stem}]({image_prefix}{p})")
    lines += ["", "Each figure: RGB and ground-truth classes, then per row the per-pixel argmax class "
              f"(background masked with the ground truth) and the relevancy of \"{cfg['qualitative_query']}\".", ""]
    lines += ["## Protocol", "", (__doc__ or "").split("Protocols", 1)[1].split(":func:`run_suite`")[0].strip()
              .replace("(every view", "Protocols (every view", 1), ""]
    return "\n".join(lines)


def _verdict(rows: List[str], runs: List[dict]) -> List[str]:
    def mean(name, key):
        v = [r[key] for r in runs if r["row"] == name and key in r and not math.isnan(r[key])]
        return 100 * float(np.mean(v)) if v else math.nan

    out = []
    full = "distill: full (VCD + VFM + LIC)"
    ours_lift = "robust lift + VCD (ours, training-free)"
    for key, label in (("miou", "mIoU"), ("mbiou", "mBIoU"), ("miou_3d", "3D mIoU")):
        vals = {n: mean(n, key) for n in rows}
        if full in vals and "distill: cosine (baseline)" in vals:
            d = vals[full] - vals["distill: cosine (baseline)"]
            out.append(f"- {label}: full Rh-3DGS distillation {vals[full]:.2f} vs the cosine distillation baseline "
                       f"{vals['distill: cosine (baseline)']:.2f} ({d:+.2f} points).")
        if ours_lift in vals and "Euclidean lift (LUDVIG-style)" in vals:
            d = vals[ours_lift] - vals["Euclidean lift (LUDVIG-style)"]
            out.append(f"- {label}: robust lift + VCD {vals[ours_lift]:.2f} vs Euclidean lift "
                       f"{vals['Euclidean lift (LUDVIG-style)']:.2f} ({d:+.2f} points).")
        base = [n for n in rows if n not in (full, ours_lift) and not math.isnan(vals.get(n, math.nan))]
        ours = [n for n in (full, ours_lift) if n in vals and not math.isnan(vals[n])]
        if base and ours:
            best_b = max(base, key=lambda n: vals[n])
            best_o = max(ours, key=lambda n: vals[n])
            margin = vals[best_o] - vals[best_b]
            claim = "reproduces" if margin >= 5 else "does NOT reproduce"
            out.append(f"- {label}: best of ours ({best_o}, {vals[best_o]:.2f}) minus best other row ({best_b}, "
                       f"{vals[best_b]:.2f}) = {margin:+.2f} points: this {claim} the paper's >= 5-point margin "
                       "on this benchmark.")
    return out


def _write_summary(out: Path, cfg: SuiteConfig, rows, runs, pngs, quick: bool, t_start: float,
                   markdown_path: Optional[PathLike]) -> Dict[str, object]:
    from ..io.atomic import atomic_save_bytes, atomic_save_json

    row_names = [r[0] for r in rows]
    n_total = len(cfg.scene_seeds) * len(cfg.teacher_seeds) * len(rows)
    summary = {
        "config": asdict(cfg), "quick": quick, "rows": row_names, "runs": runs, "pngs": pngs,
        "complete": len(runs) == n_total, "runs_done": len(runs), "runs_total": n_total,
        "seconds": time.perf_counter() - t_start, "threads": torch.get_num_threads(),
        "device": "CPU" if runs and runs[0].get("device", "cpu") == "cpu" else "GPU",
    }
    summary["verdict"] = _verdict(row_names, runs)
    atomic_save_json(out / "results.json", summary)
    atomic_save_bytes(out / "results.md", suite_markdown(summary).encode())
    if markdown_path is not None:
        mp = Path(markdown_path)
        prefix = os.path.relpath(out.resolve(), mp.resolve().parent).replace(os.sep, "/") + "/"
        atomic_save_bytes(mp, suite_markdown(summary, "" if prefix == "./" else prefix).encode())
    return summary


def run_suite(out_dir: PathLike, cfg: Optional[SuiteConfig] = None, work_dir: Optional[PathLike] = None,
              progress: bool = True, quick: bool = False, log: Callable[[str], None] = print,
              markdown_path: Optional[PathLike] = None) -> Dict[str, object]:
    """Run the ablation suite; write ``results.json``, ``results.md`` and PNGs to ``out_dir``.

    ``markdown_path``: also write the Markdown report there (image links relative to it).

    ``work_dir`` (default ``out_dir/work``) receives the synthetic datasets and every row's
    semantic scene folder (loadable with ``rh3dgs.load``).
    """
    from ..api import save_scene
    from ..data.synthetic import SceneConfig, make_scene, write_dataset
    from ..data.teacher_sim import TeacherSimConfig, make_prototypes, simulate_feature_maps, upsample_feature_map
    from ..distill import DistillConfig, distill
    from ..field import SemanticField
    from ..lifting import LiftConfig, lift

    cfg = cfg or SuiteConfig()
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    t_start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(work_dir) if work_dir is not None else out / "work"
    rows = [r for r in SUITE_ROWS if cfg.rows is None or r[0] in cfg.rows]
    if cfg.rows is not None and len(rows) != len(cfg.rows):
        unknown = set(cfg.rows) - {r[0] for r in SUITE_ROWS}
        raise ConfigError(f"unknown suite rows {sorted(unknown)}; known: {[r[0] for r in SUITE_ROWS]}")
    runs: List[dict] = []
    pngs: List[str] = []
    for s_seed in cfg.scene_seeds:
        scfg = SceneConfig(seed=int(s_seed), image_size=cfg.image_size, num_views=cfg.num_views,
                           gaussians_per_unit_area=cfg.gaussians_per_unit_area)
        scene = make_scene(scfg)
        data_dir = work / f"scene{s_seed}" / "data"
        write_dataset(scene, data_dir, progress=False)
        names = scene.cameras.names
        masks, depths = _load_dataset_arrays(data_dir, names)
        K = len(scene.class_names)
        H = W = cfg.image_size
        for t_seed in cfg.teacher_seeds:
            tcfg = TeacherSimConfig(**{**cfg.teacher, "seed": int(t_seed)})
            grid = simulate_feature_maps(masks, depths, tcfg, num_classes=K)
            maps = upsample_feature_map(grid, H, W, tcfg.patch_size)
            protos = make_prototypes(K, tcfg)
            table = {n: torch.from_numpy(protos.text[k]).float() for k, n in enumerate(scene.class_names)}
            table.update({n: torch.from_numpy(v).float() for n, v in protos.negatives.items()})
            qual_tiles: List[Tuple[str, np.ndarray]] = []
            for name, kind, kw in rows:
                tag = f"scene {s_seed} / teacher {t_seed} / {name}"
                with PeakMemory(scene.gaussians.device) as pm:
                    t0 = time.perf_counter()
                    if kind == "lift":
                        res = lift(scene.gaussians, scene.cameras, maps, LiftConfig(**kw), progress=False)
                    else:
                        dkw = {"steps": cfg.distill_steps, **cfg.distill, **kw}
                        res = distill(scene.gaussians, scene.cameras, maps, DistillConfig(**dkw), progress=False)
                    seconds = time.perf_counter() - t0
                fld = SemanticField(res.latents, res.decoder, res.valid)
                row_dir = work / f"scene{s_seed}" / f"teacher{t_seed}" / name.split(" (")[0].replace(" ", "_")\
                    .replace(":", "").replace("+", "plus").replace(",", "")
                save_scene(row_dir, scene.gaussians, fld, scene.cameras,
                           image_paths=[data_dir / "images" / f"{n}.png" for n in names], text_embeddings=table,
                           info={"row": name, "scene_seed": int(s_seed), "teacher_seed": int(t_seed)})
                ev = evaluate_scene(row_dir, data_dir, gt_class_ids=scene.class_ids.numpy(),
                                    return_maps=(s_seed == cfg.scene_seeds[0] and t_seed == cfg.teacher_seeds[0]))
                rec = {"row": name, "scene_seed": int(s_seed), "teacher_seed": int(t_seed), "seconds": seconds,
                       "peak_bytes": pm.peak_bytes, **{k: v for k, v in ev.items() if k not in ("maps", "classes")}}
                runs.append(rec)
                if progress:
                    log(f"{tag}: mIoU {100 * rec['miou']:.2f}  mBIoU {100 * rec['mbiou']:.2f}  "
                        f"3D {100 * rec.get('miou_3d', math.nan):.2f}  ({seconds:.1f} s)")
                if "maps" in ev:
                    v = min(cfg.qualitative_view, len(names) - 1)
                    stem = names[v]
                    pred, _, rel = ev["maps"][stem]
                    if not qual_tiles:
                        from PIL import Image

                        rgb = np.array(Image.open(data_dir / "images" / f"{stem}.png").convert("RGB"))
                        qual_tiles += [("RGB", rgb), ("GT classes", _label_image(np.where(masks[v].numpy() == 255, -1,
                                                                                         masks[v].numpy()), K))]
                    from ..viz import colorize

                    q = cfg.qualitative_query if cfg.qualitative_query in scene.class_names else scene.class_names[-1]
                    short = name.replace("distill: ", "D: ").replace(" (ours, training-free)", "").replace(
                        " (LUDVIG-style)", "").replace(" (baseline)", "")
                    qual_tiles += [(short, _label_image(pred, K)),
                                   (f"rel {q}", colorize(torch.from_numpy(rel[scene.class_names.index(q)]), vmin=0.0,
                                                         vmax=1.0))]
            if qual_tiles:
                png = out / f"qualitative_scene{s_seed}_teacher{t_seed}.png"
                _grid_png(png, qual_tiles, cols=4)
                pngs.append(png.name)
            # results so far (a long suite can be inspected, or reported partially, while it runs)
            summary = _write_summary(out, cfg, rows, runs, pngs, quick, t_start, markdown_path)
    return summary
