"""The synthetic ground-truth suite: every method on the same scenes and teacher draws, paired.

:func:`run_suite` builds ``len(layouts)`` synthetic scenes (:data:`rh3dgs.data.synthetic.LAYOUTS`:
thin parts, small objects, objects on / inside / under others, occlusion), renders each into a
labelled dataset with ``num_views`` training views and ``heldout_views`` held-out views, simulates
every teacher of ``teachers`` (:data:`rh3dgs.eval.rows.TEACHER_PRESETS`: a patch-pooled CLIP-like teacher and a
SAM-mask-like teacher, each at two corruption strengths) on the training views, runs every row of
:data:`rh3dgs.eval.rows.SUITE_ROWS` (training-free lifts and trained fields) on the training views only, and scores
each on the **held-out** views (:mod:`rh3dgs.eval.scoring`). Every (scene, teacher draw) is one
*pair* shared by all rows, so a method is compared with its baseline by the per-pair differences
(:mod:`rh3dgs.eval.stats`, :data:`rh3dgs.eval.rows.COMPARISONS`); ``results.json``, ``results.md``, plots and
qualitative sheets are written by :mod:`rh3dgs.eval.report`.

The methods never see the ground truth or the simulator's settings: they get the teacher maps at
the teacher's own resolution (as a cache of real CLIP features holds them), the cameras and the
Gaussians. The teacher presets were fixed before any method was scored with them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from ..errors import ConfigError
from .peak import PeakMemory
from .rows import COMPARISONS, LIFT_OURS, SUITE_ROWS, TEACHER_PRESETS
from .scoring import evaluate_scene, read_gt_dataset, scene_report_markdown, score_gaussians, score_views

__all__ = ["SuiteConfig", "SUITE_ROWS", "TEACHER_PRESETS", "COMPARISONS", "run_suite", "evaluate_scene",
           "read_gt_dataset", "scene_report_markdown", "PeakMemory", "simulate_teacher_maps"]

PathLike = Union[str, Path]

@dataclass
class SuiteConfig:
    """Settings of :func:`run_suite` (defaults: the full suite; :meth:`quick` for tests and CI)."""

    layouts: Tuple[int, ...] = (0, 1, 2, 3, 4)
    teachers: Tuple[str, ...] = ("clip-moderate", "clip-strong", "sam-moderate", "sam-strong")
    seed: int = 0
    """Scene ``l`` uses SceneConfig seed ``seed + l`` and its teachers seed ``seed + l`` (other seeds: other draws)."""
    image_size: int = 128
    num_views: int = 24
    heldout_views: int = 8
    gaussians_per_unit_area: float = 2000.0
    orbit_radius: float = 2.5
    orbit_heights: Tuple[float, ...] = (0.8, 1.4, 2.0)
    heldout_heights: Tuple[float, ...] = (1.1, 1.7)
    distill_steps: int = 150
    distill: Dict[str, object] = field(default_factory=dict)
    """DistillConfig overrides common to every trained row."""
    rows: Optional[Tuple[str, ...]] = None
    """Row names to run (None = all of :data:`SUITE_ROWS`)."""
    qualitative: Tuple[Tuple[int, str], ...] = ((0, "clip-moderate"), (1, "sam-moderate"))
    """(layout, teacher) pairs drawn as qualitative sheets."""
    save_scenes: str = "first"
    """Semantic scene folders written under ``work``: "first" (the first pair's rows), "all" or "none"."""
    threads: int = 0
    """torch threads (0 = leave as is)."""

    def __post_init__(self) -> None:
        unknown = [t for t in self.teachers if t not in TEACHER_PRESETS]
        if unknown:
            raise ConfigError(f"unknown suite teachers {unknown}; known: {list(TEACHER_PRESETS)}")
        if self.save_scenes not in ("first", "all", "none"):
            raise ConfigError(f"SuiteConfig.save_scenes must be 'first', 'all' or 'none', got {self.save_scenes!r}")

    @classmethod
    def quick(cls, **overrides) -> "SuiteConfig":
        """One small scene x the two moderate teachers (a few minutes on 2 cores): the CI run."""
        base = dict(layouts=(0,), teachers=("clip-moderate", "sam-moderate"), image_size=64, num_views=10,
                    heldout_views=4, gaussians_per_unit_area=700.0, distill_steps=40,
                    qualitative=((0, "clip-moderate"),))
        base.update(overrides)
        return cls(**base)


def simulate_teacher_maps(preset: str, seed: int, classes: torch.Tensor, instances: torch.Tensor,
                          depths: torch.Tensor, num_classes: int):
    """The training views' maps of a teacher preset (at the teacher's resolution) and its text table."""
    from ..data.teacher_sim import TeacherSimConfig, make_prototypes, simulate_feature_maps
    from ..data.teacher_sim_masks import MaskTeacherSimConfig, simulate_mask_feature_maps

    kind, over = TEACHER_PRESETS[preset]
    if kind == "clip":
        tcfg = TeacherSimConfig(**{**over, "seed": seed})
        maps = simulate_feature_maps(classes, depths, tcfg, num_classes=num_classes)
        protos = make_prototypes(num_classes, tcfg)
    else:
        mcfg = MaskTeacherSimConfig(**{**over, "seed": seed})
        maps = simulate_mask_feature_maps(instances, classes, mcfg, num_classes=num_classes)
        protos = make_prototypes(num_classes, mcfg.prototype_config())
    text = torch.from_numpy(protos.text).float()
    negatives = {n: torch.from_numpy(v).float() for n, v in protos.negatives.items()}
    return maps, text, negatives


def _row_dir_name(name: str) -> str:
    return name.split(" (")[0].split(":")[0].replace(" ", "_").replace("+", "plus").replace(",", "")


def run_suite(out_dir: PathLike, cfg: Optional[SuiteConfig] = None, work_dir: Optional[PathLike] = None,
              progress: bool = True, quick: bool = False, log: Callable[[str], None] = print,
              markdown_path: Optional[PathLike] = None) -> Dict[str, object]:
    """Run the suite; write ``results.json``, ``results.md``, plots and PNG sheets to ``out_dir``.

    ``markdown_path``: also write the Markdown report there (image links relative to it).
    ``work_dir`` (default ``out_dir/work``) receives the synthetic datasets and (``save_scenes``) the
    rows' semantic scene folders (loadable with ``rh3dgs.load``).
    """
    from ..data.labelled import LabelledDataset
    from ..data.synthetic import LAYOUTS, SceneConfig, all_cameras, make_scene, write_dataset
    from ..distill import DistillConfig, distill
    from ..io.scene import save_scene
    from ..lifting import LiftConfig, lift
    from ..method.objective import ObjectiveConfig
    from ..progress import track
    from ..rendering import fixed_views
    from . import report

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
    sheets: List[str] = []
    pairs = [(lay, t) for lay in cfg.layouts for t in cfg.teachers]
    bar = track(pairs, description="suite", disable=not progress)
    for pi, (layout, preset) in enumerate(bar):
        if pi == 0 or pairs[pi - 1][0] != layout:  # a new scene
            scfg = SceneConfig(seed=cfg.seed + layout, layout=layout, image_size=cfg.image_size,
                               num_views=cfg.num_views, heldout_views=cfg.heldout_views,
                               gaussians_per_unit_area=cfg.gaussians_per_unit_area, orbit_radius=cfg.orbit_radius,
                               orbit_heights=cfg.orbit_heights, heldout_heights=cfg.heldout_heights)
            scene = make_scene(scfg)
            data_dir = work / f"layout{layout}" / "data"
            write_dataset(scene, data_dir, progress=False)
            ds = LabelledDataset.open(data_dir)
            train_names, test_names = scene.cameras.names, scene.heldout_cameras.names
            cls_tr, dep_tr = ds.arrays(train_names)
            inst_tr = ds.instances(train_names)
            gt_test = [ds.mask(n) for n in test_names]
            K = len(scene.class_names)
            train_views = fixed_views(scene.gaussians, scene.cameras)
            test_views = fixed_views(scene.gaussians, scene.heldout_cameras)
            gt3d = scene.class_ids.numpy()
            opac = scene.gaussians.activated_opacities
        tseed = cfg.seed + layout
        maps, text, negatives = simulate_teacher_maps(preset, tseed, cls_tr, inst_tr, dep_tr, K)
        neg = torch.stack(list(negatives.values()))
        lifts: Dict[str, object] = {}
        qual: List[Tuple[str, np.ndarray, np.ndarray]] = []
        draw = (layout, preset) in cfg.qualitative
        for name, kind, kw in rows:
            with PeakMemory(scene.gaussians.device) as pm:
                t0 = time.perf_counter()
                if kind == "lift":
                    res = lift(scene.gaussians, scene.cameras, maps, LiftConfig(**kw), progress=progress)
                    lifts[name] = res
                else:
                    if LIFT_OURS not in lifts:
                        lifts[LIFT_OURS] = lift(scene.gaussians, scene.cameras, maps, LiftConfig(),
                                                progress=progress)
                    dcfg = DistillConfig(**{"steps": cfg.distill_steps, **cfg.distill,
                                            "objective": ObjectiveConfig(**kw)})
                    res = distill(scene.gaussians, scene.cameras, maps, dcfg, init_lift=lifts[LIFT_OURS],
                                  views=train_views, progress=progress)
                seconds = time.perf_counter() - t0
            fld = res.field()
            with torch.no_grad():
                lat = test_views.render(fld.latents, range(len(test_views)))
            ev = score_views(fld, list(lat), list(test_views.alpha), gt_test, text, neg, return_maps=draw)
            ev.update(score_gaussians(fld, text, gt3d, opac))
            rec = {"row": name, "layout": layout, "teacher": preset, "seconds": seconds, "peak_bytes": pm.peak_bytes,
                   "classes": list(scene.class_names), **{k: v for k, v in ev.items() if k != "maps"}}
            runs.append(rec)
            if draw:
                qual.append((name, ev["maps"][0][0], ev["maps"][0][1]))
            if cfg.save_scenes == "all" or (cfg.save_scenes == "first" and pi == 0):
                table = {n: text[k] for k, n in enumerate(scene.class_names)}
                table.update(negatives)
                cams = all_cameras(scene)
                save_scene(work / f"layout{layout}" / preset / _row_dir_name(name), scene.gaussians, fld, cams,
                           image_paths=[data_dir / "images" / f"{n}.png" for n in cams.names],
                           text_embeddings=table, info={"row": name, "layout": layout, "teacher": preset,
                                                        "heldout_views": list(range(cfg.num_views, len(cams)))})
            if progress:
                log(f"layout {layout} / {preset} / {name}: mIoU {100 * rec['miou']:.2f}  mBIoU "
                    f"{100 * rec['mbiou']:.2f}  3D {100 * rec['miou_3d']:.2f}  ({seconds:.1f} s)")
        if qual:
            from PIL import Image

            rgb = np.array(Image.open(data_dir / "images" / f"{test_names[0]}.png").convert("RGB"))
            sheets.append(report.qualitative_sheet(out / f"qualitative_layout{layout}_{preset}.png", rgb,
                                                   gt_test[0], qual, scene.class_names,
                                                   title=f"layout {layout} ({LAYOUTS[layout][0]}), teacher "
                                                         f"{preset}, held-out view {test_names[0]}"))
        summary = report.write_summary(out, cfg, [r[0] for r in rows], runs, sheets, quick,
                                       time.perf_counter() - t_start, markdown_path)
    return summary

