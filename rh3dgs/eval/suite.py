"""The synthetic ground-truth suite: every method on the same scenes and teacher draws, paired.

A suite run is a list of *pairs* (:class:`rh3dgs.eval.families.SuitePair`: a scene family's draw, a teacher
family's draw, a training-view budget, a seed). :func:`run_suite` takes each pair through named steps:

1. :func:`build_pair_scene`: the synthetic scene (:mod:`rh3dgs.data.synthetic`) rendered into a labelled
   dataset with the pair's training views and ``heldout_views`` held-out views;
2. :func:`simulate_teacher_maps`: the teacher family's maps of the training views (at the teacher's own
   resolution, as a cache of real CLIP features holds them) and its text table;
3. :func:`run_row`: each row of the run (:data:`rh3dgs.eval.rows.SUITE_ROWS`: training-free lifts and trained
   fields) on the training views only;
4. :func:`score_row`: scored on the **held-out** views and per Gaussian (:mod:`rh3dgs.eval.scoring`); the
   held-out argmax maps are kept for the pixel transitions of :mod:`rh3dgs.eval.report`;
5. the record saved under ``runs/`` as it is made (a rerun with the same settings resumes: a record whose
   fingerprint matches is read back, not recomputed), then the reports (:mod:`rh3dgs.eval.report`).

The pairs are either ``part="dev"`` / ``part="test"`` (:mod:`rh3dgs.eval.families`: the widened suite of
issue 46, fixed before any score) or the old design, ``layouts`` x ``teachers`` at one view budget.
The methods never see the ground truth or the simulator's settings: they get the teacher maps, the cameras
and the Gaussians. Each (pair) is shared by all rows, so methods are compared by per-pair differences
(:mod:`rh3dgs.eval.stats`).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from ..errors import ConfigError
from ..method.selection import SelectionConfig
from .families import PARTS, TEACHER_FAMILIES, SuitePair, part_pairs
from .peak import PeakMemory
from .rows import COMPARISONS, LIFT_OURS, PART_ROWS, SUITE_ROWS, TEACHER_PRESETS
from .scoring import evaluate_scene, read_gt_dataset, scene_report_markdown, score_gaussians, score_views

__all__ = ["SuiteConfig", "SUITE_ROWS", "TEACHER_PRESETS", "COMPARISONS", "run_suite", "evaluate_scene",
           "read_gt_dataset", "scene_report_markdown", "PeakMemory", "simulate_teacher_maps", "PairScene",
           "build_pair_scene", "run_row", "score_row", "row_settings"]

PathLike = Union[str, Path]
Row = Tuple[str, str, dict]


@dataclass
class SuiteConfig:
    """Settings of :func:`run_suite` (defaults: the old design's full suite; :meth:`quick` for tests and CI;
    ``part="dev"`` / ``"test"``: a part of the widened suite, :mod:`rh3dgs.eval.families`)."""

    layouts: Tuple[Union[int, str], ...] = (0, 1, 2, 3, 4)
    """The old design: scene layouts (:data:`rh3dgs.data.synthetic.LAYOUTS` index or name); unused with ``part``."""
    teachers: Tuple[str, ...] = ("clip-moderate", "clip-strong", "sam-moderate", "sam-strong")
    """The old design: teacher families (:data:`rh3dgs.eval.families.TEACHER_FAMILIES`); unused with ``part``."""
    seed: int = 0
    """The old design: layout ``l`` (the i-th of ``layouts``) uses seed ``seed + l`` (its index for a name)."""
    part: Optional[str] = None
    """"dev" or "test": the pairs of :func:`rh3dgs.eval.families.part_pairs` (None: layouts x teachers)."""
    pairs: Optional[Tuple[int, ...]] = None
    """Indices of the pairs to run (None: all)."""
    image_size: int = 128
    num_views: int = 24
    """The old design's training views (a part's pairs carry their own)."""
    heldout_views: int = 8
    gaussians_per_unit_area: float = 2000.0
    orbit_radius: float = 2.5
    orbit_heights: Tuple[float, ...] = (0.8, 1.4, 2.0)
    heldout_heights: Tuple[float, ...] = (1.1, 1.7)
    distill_steps: int = 150
    distill: Dict[str, object] = field(default_factory=dict)
    """DistillConfig overrides common to every trained row."""
    rows: Optional[Tuple[str, ...]] = None
    """Row names to run (None: every row of :data:`SUITE_ROWS` for the old design, :data:`PART_ROWS` for a part)."""
    qualitative: Optional[Tuple[Tuple[Union[int, str], str], ...]] = ((0, "clip-moderate"), (1, "sam-moderate"))
    """(scene layout or family, teacher) pairs drawn as qualitative sheets (None: the first pair of each teacher)."""
    save_scenes: str = "first"
    """Semantic scene folders written under ``work``: "first" (the first pair's rows), "all" or "none"."""
    threads: int = 0
    """torch threads (0 = leave as is)."""
    heldout_radius: Optional[float] = None
    """Study knob (not a family): the held-out cameras' orbit radius (None: ``orbit_radius``)."""
    gaussian_style: str = "surfel"
    """Study knob: :attr:`rh3dgs.data.synthetic.SceneConfig.gaussian_style` of every scene."""
    geometry_noise: float = 0.0
    """Study knob: the methods get a *reconstruction* of the scene instead of its Gaussians: every mean moved by
    ``N(0, (geometry_noise x its disk's width)^2)`` per axis and every opacity scaled by U(0.6, 1), while the images,
    masks and teacher come from the true scene (0: the true Gaussians)."""
    extra_teachers: Dict[str, Tuple[str, Dict[str, object]]] = field(default_factory=dict)
    """Study knob: more teachers by name, (kind, simulator settings) as :data:`rh3dgs.eval.rows.TEACHER_PRESETS`
    (e.g. one corruption at a time), usable in ``teachers``."""

    def __post_init__(self) -> None:
        unknown = [t for t in self.teachers if t not in TEACHER_PRESETS and t not in self.extra_teachers]
        if unknown:
            raise ConfigError(f"unknown suite teachers {unknown}; known: {list(TEACHER_PRESETS)}")
        if self.save_scenes not in ("first", "all", "none"):
            raise ConfigError(f"SuiteConfig.save_scenes must be 'first', 'all' or 'none', got {self.save_scenes!r}")
        if self.part is not None and self.part not in PARTS:
            raise ConfigError(f"SuiteConfig.part must be one of {list(PARTS)} or None, got {self.part!r}")

    @classmethod
    def quick(cls, **overrides) -> "SuiteConfig":
        """One small scene x the two moderate teachers (a few minutes on 2 cores): the CI run."""
        base = dict(layouts=(0,), teachers=("clip-moderate", "sam-moderate"), image_size=64, num_views=10,
                    heldout_views=4, gaussians_per_unit_area=700.0, distill_steps=40,
                    qualitative=((0, "clip-moderate"),))
        base.update(overrides)
        return cls(**base)

    def suite_pairs(self) -> List[SuitePair]:
        """The pairs this run covers (all of them; ``pairs`` selects among them in :func:`run_suite`)."""
        from ..data.synthetic import LAYOUTS

        if self.part is not None:
            return part_pairs(self.part)
        out = []
        for lay in self.layouts:
            name = LAYOUTS[lay][0] if isinstance(lay, int) else str(lay)
            offset = lay if isinstance(lay, int) else self.layouts.index(lay)
            for t in self.teachers:
                out.append(SuitePair("synthetic", len(out), name, t, self.num_views, self.seed + offset))
        return out

    def row_list(self) -> List[Row]:
        """The rows this run covers, in report order."""
        from .rows import ALL_ROWS

        names = self.rows if self.rows is not None else tuple(
            r[0] for r in (PART_ROWS if self.part is not None else SUITE_ROWS))
        known = {r[0]: r for r in ALL_ROWS}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConfigError(f"unknown suite rows {sorted(unknown)}; known: {list(known)}")
        return [known[n] for n in names]


@dataclass
class PairScene:
    """Step 1's output: one pair's scene, its labelled dataset and what the steps after it read."""

    pair: SuitePair
    scene: object
    data_dir: Path
    train_names: List[str]
    test_names: List[str]
    classes: torch.Tensor
    depths: torch.Tensor
    instances: torch.Tensor
    gt_test: List[np.ndarray]
    gt3d: np.ndarray
    test_views: object
    _train_views: object = None

    @property
    def num_classes(self) -> int:
        return len(self.scene.class_names)

    @property
    def train_views(self):
        """:func:`rh3dgs.rendering.fixed_views` of the training cameras (made on first use: trained rows only)."""
        from ..rendering import fixed_views

        if self._train_views is None:
            self._train_views = fixed_views(self.scene.gaussians, self.scene.cameras)
        return self._train_views


def build_pair_scene(pair: SuitePair, cfg: SuiteConfig, work: Path) -> PairScene:
    """Step 1: the pair's synthetic scene, written as a labelled dataset under ``work/<pair key>/data``."""
    from ..data.labelled import LabelledDataset
    from ..data.synthetic import SceneConfig, make_scene, write_dataset
    from ..rendering import fixed_views

    scfg = SceneConfig(seed=pair.seed, layout=pair.scene, image_size=cfg.image_size, num_views=pair.views,
                       heldout_views=cfg.heldout_views, gaussians_per_unit_area=cfg.gaussians_per_unit_area,
                       orbit_radius=cfg.orbit_radius, orbit_heights=cfg.orbit_heights,
                       heldout_heights=cfg.heldout_heights, heldout_radius=cfg.heldout_radius,
                       gaussian_style=cfg.gaussian_style)
    scene = make_scene(scfg)
    data_dir = work / _scene_dir(pair) / "data"
    write_dataset(scene, data_dir, progress=False)
    ds = LabelledDataset.open(data_dir)
    train_names, test_names = scene.cameras.names, scene.heldout_cameras.names
    cls_tr, dep_tr = ds.arrays(train_names)
    if cfg.geometry_noise > 0:  # the methods see a reconstruction; images, masks and teacher the true scene
        scene = replace(scene, gaussians=reconstruction(scene.gaussians, cfg.geometry_noise, pair.seed))
    return PairScene(pair, scene, data_dir, train_names, test_names, cls_tr, dep_tr, ds.instances(train_names),
                     [ds.mask(n) for n in test_names], scene.class_ids.numpy(),
                     fixed_views(scene.gaussians, scene.heldout_cameras))


def reconstruction(gaussians, noise: float, seed: int):
    """A stand-in for reconstructed geometry: means moved by ``N(0, (noise x disk width)^2)`` per axis, opacities
    scaled by U(0.6, 1) (the same Gaussians otherwise, so per-Gaussian ground truth still applies)."""
    from ..gaussians import Gaussians

    g = torch.Generator().manual_seed(int(seed) + 99991)
    width = gaussians.activated_scales[:, :2].mean(-1, keepdim=True)
    means = gaussians.means + noise * width * torch.randn(gaussians.means.shape, generator=g)
    opac = gaussians.activated_opacities * (0.6 + 0.4 * torch.rand(len(gaussians), generator=g))
    return Gaussians.from_activated(means, gaussians.activated_scales, gaussians.quats, opac, gaussians.base_colors)


def simulate_teacher_maps(preset: str, seed: int, classes: torch.Tensor, instances: torch.Tensor,
                          depths: torch.Tensor, num_classes: int, azimuths: Optional[List[float]] = None,
                          presets: Optional[Dict[str, Tuple[str, Dict[str, object]]]] = None):
    """Step 2: the training views' maps of a teacher family (at the teacher's resolution) and its text table
    ``(maps, text [K, D], {negative: [D]})``. ``azimuths``: the views' camera azimuths (view-correlated failures);
    ``presets``: teachers beyond :data:`TEACHER_PRESETS` (``SuiteConfig.extra_teachers``)."""
    from ..data.teacher_sim import TeacherSimConfig, make_prototypes, simulate_feature_maps
    from ..data.teacher_sim_masks import MaskTeacherSimConfig, simulate_mask_feature_maps

    kind, over = {**TEACHER_PRESETS, **(presets or {})}[preset]
    if kind == "clip":
        tcfg = TeacherSimConfig(**{**over, "seed": seed})
        maps = simulate_feature_maps(classes, depths, tcfg, num_classes=num_classes, view_azimuths=azimuths)
        protos = make_prototypes(num_classes, tcfg)
    else:
        mcfg = MaskTeacherSimConfig(**{**over, "seed": seed})
        maps = simulate_mask_feature_maps(instances, classes, mcfg, num_classes=num_classes, view_azimuths=azimuths)
        protos = make_prototypes(num_classes, mcfg.prototype_config())
    text = torch.from_numpy(protos.text).float()
    negatives = {n: torch.from_numpy(v).float() for n, v in protos.negatives.items()}
    return maps, text, negatives


def row_settings(row: Row, cfg: SuiteConfig):
    """The resolved settings a row runs with: a :class:`~rh3dgs.lifting.LiftConfig` ("lift" rows) or a
    :class:`~rh3dgs.distill.DistillConfig` ("distill" rows: ``settings["distill"]`` overrides DistillConfig's
    fields, every other key is an :class:`~rh3dgs.method.objective.ObjectiveConfig` field)."""
    from ..distill import DistillConfig
    from ..lifting import LiftConfig
    from ..method.objective import ObjectiveConfig

    _, kind, kw = row
    if kind == "lift":
        return LiftConfig(**kw)
    obj = {k: v for k, v in kw.items() if k != "distill"}
    return DistillConfig(**{"steps": cfg.distill_steps, **cfg.distill, **kw.get("distill", {}),
                            "objective": ObjectiveConfig(**obj)})


def run_row(row: Row, ps: PairScene, maps, cfg: SuiteConfig, lifts: Dict[str, object], progress: bool = False):
    """Step 3: one row on the pair's training views -> (its result: ``.field()`` gives the semantic field,
    seconds, peak bytes). Trained rows start from the pair's :data:`LIFT_OURS` lift (made here if no row made it)."""
    from ..distill import distill
    from ..lifting import LiftConfig, lift

    name, kind, _ = row
    settings = row_settings(row, cfg)
    g, cams = ps.scene.gaussians, ps.scene.cameras
    with PeakMemory(g.device) as pm:
        t0 = time.perf_counter()
        if kind == "lift":
            res = lifts[name] = lift(g, cams, maps, settings, progress=progress)
        else:
            if LIFT_OURS not in lifts:
                lifts[LIFT_OURS] = lift(g, cams, maps, LiftConfig(), progress=progress)
            res = distill(g, cams, maps, settings, init_lift=lifts[LIFT_OURS], views=ps.train_views, progress=progress)
        seconds = time.perf_counter() - t0
    return res, seconds, pm.peak_bytes


def score_row(fld, ps: PairScene, text: torch.Tensor, negatives: torch.Tensor) -> Dict[str, object]:
    """Step 4: held-out 2D scores, 3D scores and ``maps`` (per held-out view: argmax, relevancy)."""
    with torch.no_grad():
        lat = ps.test_views.render(fld.latents, range(len(ps.test_views)))
    ev = score_views(fld, list(lat), list(ps.test_views.alpha), ps.gt_test, text, negatives, return_maps=True)
    ev.update(score_gaussians(fld, text, ps.gt3d, ps.scene.gaussians.activated_opacities))
    return ev


def _pair_dir(pair) -> str:
    """The folder of a pair (a :class:`SuitePair` or a run record) under ``runs/`` and the work folder."""
    get = pair.get if isinstance(pair, dict) else lambda k: getattr(pair, k)
    key = get("pair") if isinstance(pair, dict) else pair.key
    return f"{key}_{get('scene').replace(' ', '_')}_{get('teacher')}_{get('views')}v"


def _scene_dir(pair: SuitePair) -> str:
    """The work folder of a pair's scene draw (shared by the pairs of one scene, seed and view budget)."""
    return f"{pair.scene.replace(' ', '_')}_seed{pair.seed}_{pair.views}v"


def _row_dir_name(name: str) -> str:
    return (name.split(" (")[0].split(":")[0].replace(" ", "_").replace("+", "plus").replace(",", "")
            .replace("/", "-"))


#: Settings fields added after records were made, at the value that reproduces those records: a field at that value
#: is left out of the fingerprint, so adding a field (at its neutral value) keeps earlier records valid. Any other
#: value, or a changed default of an older field, changes the fingerprint.
NEUTRAL_SETTINGS: Dict[str, object] = {"selection": SelectionConfig(), "checkpoint_every": 50}


def _canonical(obj):
    """Settings as plain data, the fields of :data:`NEUTRAL_SETTINGS` at their neutral value left out."""
    if hasattr(obj, "__dataclass_fields__"):
        return {k: _canonical(getattr(obj, k)) for k in obj.__dataclass_fields__
                if not (k in NEUTRAL_SETTINGS and getattr(obj, k) == NEUTRAL_SETTINGS[k])}
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    return obj if isinstance(obj, (int, float, str, bool, type(None))) else repr(obj)


def _fingerprint(pair: SuitePair, row: Row, cfg: SuiteConfig) -> str:
    """What a record depends on: the pair, the row's resolved settings and the suite's scene settings."""
    scene = {k: getattr(cfg, k) for k in ("image_size", "heldout_views", "gaussians_per_unit_area", "orbit_radius",
                                          "orbit_heights", "heldout_heights")}
    scene.update({k: getattr(cfg, k) for k in ("heldout_radius", "gaussian_style", "geometry_noise")
                  if getattr(cfg, k) != SuiteConfig.__dataclass_fields__[k].default})
    if pair.teacher in cfg.extra_teachers:
        scene["teacher"] = cfg.extra_teachers[pair.teacher]
    text = json.dumps([asdict(pair), row[0], _canonical(row_settings(row, cfg)), scene], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _Records:
    """The run records under ``out/runs/<pair>/``: one JSON per (pair, row) and its held-out argmax maps (npz),
    written as each is made; read back by a rerun whose fingerprint matches (resume)."""

    def __init__(self, out: Path):
        self.root = out / "runs"

    def _paths(self, pair, row: str) -> Tuple[Path, Path]:
        d = self.root / _pair_dir(pair)
        return d / f"{_row_dir_name(row)}.json", d / f"{_row_dir_name(row)}.npz"

    def load(self, pair: SuitePair, row: str, fingerprint: str) -> Optional[dict]:
        path, _ = self._paths(pair, row)
        if not path.is_file():
            return None
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return rec if rec.get("fingerprint") == fingerprint else None

    def predictions(self, pair, row: str) -> Optional[np.ndarray]:
        """[V, H, W] int held-out argmax maps (-1 = background) of a saved record, or None."""
        _, path = self._paths(pair, row)
        if not path.is_file():
            return None
        with np.load(path) as z:
            return z["pred"].astype(np.int64) - 1

    def save_ground_truth(self, pair: SuitePair, masks: List[np.ndarray]) -> None:
        """The pair's held-out class masks (for the transitions of :func:`rh3dgs.eval.report.transitions`)."""
        from ..io.atomic import atomic_save_npz

        path = self.root / _pair_dir(pair) / "ground_truth.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_save_npz(path, {"masks": np.stack(masks).astype(np.uint8)}, compressed=True)

    def transition_inputs(self, record: dict, method: str, baseline: str):
        """(method's, baseline's held-out argmax maps, ground truth) [V, H, W] of a record's pair, -1 = background;
        None when one is missing."""
        from ..data.labelled import BACKGROUND

        gt_path = self.root / _pair_dir(record) / "ground_truth.npz"
        pm, pb = self.predictions(record, method), self.predictions(record, baseline)
        if pm is None or pb is None or not gt_path.is_file():
            return None
        with np.load(gt_path) as z:
            gt = z["masks"].astype(np.int64)
        return pm, pb, np.where(gt == BACKGROUND, -1, gt)

    def save(self, pair: SuitePair, row: str, rec: dict, pred: np.ndarray) -> None:
        from ..io.atomic import atomic_save_json, atomic_save_npz

        path, npz = self._paths(pair, row)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_save_npz(npz, {"pred": (pred + 1).astype(np.uint8)}, compressed=True)
        atomic_save_json(path, _jsonable(rec))


def _jsonable(obj):
    import math

    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return obj


def _save_row_scene(ps: PairScene, name: str, fld, text: torch.Tensor, negatives: Dict[str, torch.Tensor],
                    work: Path) -> None:
    """A row's semantic scene folder (loadable with ``rh3dgs.load``), the held-out views recorded."""
    from ..data.synthetic import all_cameras
    from ..io.scene import save_scene

    table = {n: text[k] for k, n in enumerate(ps.scene.class_names)}
    table.update(negatives)
    cams = all_cameras(ps.scene)
    pair = ps.pair
    save_scene(work / _scene_dir(pair) / pair.teacher / _row_dir_name(name), ps.scene.gaussians, fld, cams,
               image_paths=[ps.data_dir / "images" / f"{n}.png" for n in cams.names], text_embeddings=table,
               info={"row": name, "pair": asdict(pair), "heldout_views": list(range(pair.views, len(cams)))})


def _draw_sheet(out: Path, ps: PairScene, qual: List[Tuple[str, np.ndarray, np.ndarray]]) -> str:
    """A qualitative sheet of the pair's first held-out view (:func:`rh3dgs.eval.report.qualitative_sheet`)."""
    from PIL import Image

    from . import report

    pair = ps.pair
    rgb = np.array(Image.open(ps.data_dir / "images" / f"{ps.test_names[0]}.png").convert("RGB"))
    name = f"qualitative_{pair.key}_{pair.scene.replace(' ', '_')}_{pair.teacher}.png"
    return report.qualitative_sheet(out / name, rgb, ps.gt_test[0], qual, ps.scene.class_names,
                                    title=f"{pair.key}: {pair.scene}, teacher {pair.teacher}, {pair.views} training "
                                          f"views, held-out view {ps.test_names[0]}")


def _wants_sheet(cfg: SuiteConfig, pair: SuitePair, pairs: List[SuitePair]) -> bool:
    from ..data.synthetic import LAYOUTS

    if cfg.qualitative is None:
        return pair == next(p for p in pairs if p.teacher == pair.teacher)
    named = {(LAYOUTS[s][0] if isinstance(s, int) else s, t) for s, t in cfg.qualitative}
    return (pair.scene, pair.teacher) in named


def run_suite(out_dir: PathLike, cfg: Optional[SuiteConfig] = None, work_dir: Optional[PathLike] = None,
              progress: bool = True, quick: bool = False, log: Callable[[str], None] = print,
              markdown_path: Optional[PathLike] = None) -> Dict[str, object]:
    """Run the suite; write ``results.json``, ``results.md``, plots and PNG sheets to ``out_dir``.

    ``markdown_path``: also write the Markdown report there (image links relative to it).
    ``work_dir`` (default ``out_dir/work``) receives the synthetic datasets and (``save_scenes``) the
    rows' semantic scene folders (loadable with ``rh3dgs.load``). Records already under ``out_dir/runs`` with
    the same settings are reused (an interrupted run resumes).
    """
    from ..data.synthetic import camera_azimuths
    from ..progress import track
    from . import report

    cfg = cfg or SuiteConfig()
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    t_start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(work_dir) if work_dir is not None else out / "work"
    rows = cfg.row_list()
    all_pairs = cfg.suite_pairs()
    pairs = [p for p in all_pairs if cfg.pairs is None or p.index in cfg.pairs]
    records = _Records(out)
    runs: List[dict] = []
    sheets: List[str] = []
    summary: Dict[str, object] = {}
    ps: Optional[PairScene] = None
    for pi, pair in enumerate(track(pairs, description=f"suite {cfg.part or ''}".strip(), disable=not progress)):
        prints = {r[0]: _fingerprint(pair, r, cfg) for r in rows}
        done = {r[0]: records.load(pair, r[0], prints[r[0]]) for r in rows}
        sheet = [s for s in _sheets(out) if f"_{pair.key}_" in s]
        need_sheet = _wants_sheet(cfg, pair, all_pairs) and not sheet
        sheets += sheet
        if all(done.values()) and not need_sheet:  # resumed: nothing to compute for this pair
            runs += [done[r[0]] for r in rows]
            continue
        save = cfg.save_scenes == "all" or (cfg.save_scenes == "first" and pi == 0)
        if ps is None or _scene_dir(ps.pair) != _scene_dir(pair):  # the old design: one scene for its teachers
            ps = build_pair_scene(pair, cfg, work)
        ps.pair = pair
        records.save_ground_truth(pair, ps.gt_test)
        maps, text, negatives = simulate_teacher_maps(pair.teacher, pair.seed, ps.classes, ps.instances, ps.depths,
                                                      ps.num_classes, camera_azimuths(ps.scene.cameras),
                                                      cfg.extra_teachers)
        lifts: Dict[str, object] = {}
        qual: List[Tuple[str, np.ndarray, np.ndarray]] = []
        for row in rows:
            rec = done[row[0]]
            if rec is None or need_sheet:
                rec = _compute_row(row, ps, maps, text, negatives, cfg, lifts, records, prints[row[0]], rec,
                                   qual if need_sheet else None, work if save else None)
                if progress:
                    log(f"{pair.key} {pair.scene} / {pair.teacher} / {pair.views} views / {row[0]}: mIoU "
                        f"{100 * rec['miou']:.2f}  mBIoU {100 * rec['mbiou']:.2f}  3D {100 * rec['miou_3d']:.2f}  "
                        f"({rec['seconds']:.1f} s)")
            runs.append(rec)
        if qual:
            sheets.append(_draw_sheet(out, ps, qual))
        summary = report.write_summary(out, cfg, [r[0] for r in rows], runs, sheets, quick,
                                       time.perf_counter() - t_start, markdown_path, records)
    if not summary or len(summary.get("runs", [])) != len(runs):
        summary = report.write_summary(out, cfg, [r[0] for r in rows], runs, sheets, quick,
                                       time.perf_counter() - t_start, markdown_path, records)
    return summary


def _compute_row(row: Row, ps: PairScene, maps, text: torch.Tensor, negatives: Dict[str, torch.Tensor],
                 cfg: SuiteConfig, lifts: Dict[str, object], records: "_Records", fingerprint: str,
                 rec: Optional[dict], qual: Optional[list], save_to: Optional[Path]) -> dict:
    """Steps 3-5 for one row: run, score, record (unless ``rec``, a saved record, is given), and add its first
    held-out view to ``qual`` / save its scene folder under ``save_to`` when asked."""
    name = row[0]
    res, seconds, peak = run_row(row, ps, maps, cfg, lifts)
    fld = res.field()
    ev = score_row(fld, ps, text, torch.stack(list(negatives.values())))
    view_maps = ev.pop("maps")
    if qual is not None:
        qual.append((name, view_maps[0][0], view_maps[0][1]))
    if save_to is not None:
        _save_row_scene(ps, name, fld, text, negatives, save_to)
    if rec is not None:
        return rec
    pair = ps.pair
    rec = {"row": name, "pair": pair.key, "part": pair.part, "scene": pair.scene, "teacher": pair.teacher,
           "views": pair.views, "seed": pair.seed, "fingerprint": fingerprint, "seconds": seconds, "peak_bytes": peak,
           "classes": list(ps.scene.class_names), **ev, "info": _row_info(res)}
    records.save(pair, name, rec, np.stack([m[0] for m in view_maps]))
    return rec


def _sheets(out: Path) -> List[str]:
    return sorted(p.name for p in out.glob("qualitative_*.png"))


def _row_info(res) -> Dict[str, object]:
    """What a row reports about itself beyond the scores (a trained row's selection, when it makes one)."""
    info = getattr(res, "info", None) or {}
    keep = ("selected_step", "fallback_fraction", "check_views", "selection")
    return {k: info[k] for k in keep if k in info}
