"""Semantic distillation on FIXED Gaussian geometry (no nerfstudio, no RGB loss).

Optimises per-Gaussian latents ``f [N, d]`` (and optionally the linear decoder ``Dec [D, d]``)
with the semantic objective of :mod:`rh3dgs.method.objective` - the same one ``ns-train rh3dgs``
trains - on renders of fixed Gaussians: the semantic half of the paper's
``L_rgb + lambda_sem L_VFM + lambda_con L_LIC`` with ``L_rgb`` dropped.

**Choices** (the paper is silent; each is a config field):

* *Initialisation* ``init="lift"`` (default): latents and decoder from the training-free lift
  (:func:`rh3dgs.lifting.initial_field`), so training refines what the lift gives; Gaussians the
  lift leaves without a feature stay at zero (no gradient). ``init="pca"``: decoder = uncentred PCA basis of the
  teacher pixels, random latents ``~ N(0, init_scale^2)``.
* *Fixed geometry* => every view's compositing weights are computed once and re-used by every
  step (:func:`rh3dgs.rendering.fixed_views`: a render of the latents is a sparse product on CPU).
* *Optimiser*: Adam on the latents at ``lr = 2e-3`` (a refinement of a good start: Adam normalises
  each parameter's step, so the latents of Gaussians that few pixels constrain move as far as the
  well-constrained ones; the objective's ray-consistency term keeps them from drifting along mixes
  that only fit the composites. Development draws of the suite, 150 steps: 2e-3 +2.1 mIoU over the
  lift, 1e-3 +1.6, 3e-3 +1.6); the decoder is kept as the lift's orthonormal basis unless
  ``decoder_lr > 0``.
* *Views*: ``views_per_step`` per step, drawn without replacement per epoch from a seeded
  generator; the whole run is deterministic for a given ``seed`` on CPU.
* *Validity*: with ``init="lift"`` the lift's ``valid`` (observed) mask; with ``init="pca"`` a
  Gaussian is valid when its total compositing weight over covered pixels is ``>= min_weight``.
* *Selection* (``objective.selection``, :mod:`rh3dgs.method.selection`; ``init="lift"`` only): the check views'
  maps are held out of the run, which starts from the lift of the other views; the field of the step with the
  lowest check loss is compared with that lift, as a whole and per Gaussian, and (``refit``) a second run from
  the lift of every view on every view, as long as the first took to its selected step, gets those decisions.
  ``info`` reports ``selected_step``, ``fallback_fraction``, ``check_views`` and ``selection``. One process, no
  ``checkpoint`` (refused otherwise).

**Past one process** (inside a ``torch.distributed`` group of K ranks, e.g. ``torchrun --nproc_per_node=K -m
rh3dgs.cli distill ...``; collectives in :mod:`rh3dgs.distributed`): rank r keeps the fixed views of its
contiguous share of the cameras (``B / K``: their compositing weights are the memory that grows with the views);
the latents, decoder and optimiser are replicated. Every rank draws the same order of views, so a step's batch is
the single process's batch, and rank r renders the batch's views it holds (none, some or all of them: a batch of
``views_per_step`` views is spread as the order puts it). Its loss is its share of the batch's loss: the objective's
normalisers (the pixel weights' sum, the covered pixels, the kept segments: fixed per view, gathered once,
:meth:`rh3dgs.method.objective.SemanticObjective.totals`) are the whole batch's. LIC, a function of the latents
only, is evaluated once, on rank 0, whose graph is the only one built. One ``all_reduce`` per step sums the
gradients ((N d + D d + d) floats), so every rank's Adam takes the same step, and the result is the single
process's with the same order (``view_order``, or the seeded permutation) up to the order of float sums.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .cameras import Cameras
from .distributed import DistInfo, all_gather_object, all_gather_rows, all_reduce, current, shard
from .errors import ConfigError
from .ranges import Range, check_fields
from .gaussians import Gaussians
from .io.atomic import atomic_write
from .lifting import LiftConfig, initial_field, pca_decoder
from .lifting.checkpoint import ResumeFolder, fingerprint
from .method.objective import ObjectiveConfig, SemanticObjective
from .method.selection import CheckViews, apply_decisions, check_view_indices, fit_lift, lift_latents
from .progress import track
from .rendering import FixedViews, fixed_views
from .teachers.maps import TeacherMaps, get_map, prepare_maps, region_fraction

__all__ = ["DistillConfig", "DistillResult", "distill"]


@dataclass
class DistillConfig:
    """Settings of :func:`distill`."""

    steps: Annotated[int, Range(ge=0)] = 200
    """Optimisation steps."""
    views_per_step: Annotated[int, Range(ge=1)] = 2
    """Views rendered per step."""
    latent_dim: Annotated[int, Range(ge=1)] = 16
    """d, the latent dimension."""
    lr: Annotated[float, Range(gt=0)] = 0.002
    """Adam learning rate of the latents."""
    decoder_lr: Annotated[float, Range(ge=0)] = 0.0
    """Adam learning rate of the decoder (0 = keep the initial decoder)."""
    background_lr: Annotated[float, Range(ge=0)] = 0.01
    """Adam learning rate of the background latent."""
    init: str = "lift"
    """lift (the training-free lift's latents and decoder) or pca (PCA decoder, random latents)."""
    init_scale: Annotated[float, Range(gt=0)] = 0.1
    """Std of random initial latents (init pca, and Gaussians the lift leaves invalid)."""
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    """The semantic objective (VCD / VFM / LIC switches and their settings)."""
    lift: LiftConfig = field(default_factory=LiftConfig)
    """Settings of the lift of init lift (its latent_dim is latent_dim's)."""
    seed: int = 0
    """Seed of the view order, the random initial latents and LIC's sampling."""
    view_order: Optional[Annotated[Tuple[int, ...], Range(ge=0, min_len=1)]] = None
    """The views of the steps, views_per_step at a time (None: epochs of a permutation drawn from seed)."""
    min_weight: Annotated[float, Range(ge=0)] = 1e-6
    """init="pca": Gaussians whose total compositing weight on covered pixels is below this are invalid."""
    tile_size: Annotated[int, Range(ge=1)] = 16
    """Rasterizer tile side in pixels."""
    checkpoint_every: Annotated[int, Range(ge=0)] = 50
    """Steps between checkpoints of distill(checkpoint=FOLDER) (rh3dgs distill gives one); 0: only after the start."""

    def __post_init__(self) -> None:
        check_fields(self)  # every numeric field against its declared Range (rh3dgs.ranges)
        if self.init not in ("pca", "lift"):
            raise ConfigError(f"DistillConfig.init must be 'pca' or 'lift', got {self.init!r}")

    @property
    def label(self) -> str:
        return f"distill ({self.objective.label})"


@dataclass
class DistillResult:
    """latents [N, d] (as rendered), decoder [D, d], features [N, D] (unit decoded latents), valid [N] bool,
    history (per step: loss, sem, lic, ...), info (timings, settings), lift (the initial lift's result or None)."""

    latents: Tensor
    decoder: Tensor
    features: Tensor
    valid: Tensor
    history: List[Dict[str, float]]
    info: Dict[str, object]
    lift: Optional[object] = None

    def field(self):
        """The distilled :class:`rh3dgs.field.SemanticField`."""
        from .field import SemanticField

        return SemanticField(self.latents, self.decoder, self.valid)


def _pca_start(views: FixedViews, teacher_maps: TeacherMaps, cfg: DistillConfig, gen: torch.Generator,
               ranks: "_Ranks"):
    """init="pca": decoder from the teacher pixels, random latents, validity from the compositing weights (in a
    process group: every rank's covered pixels, in view order, and the weights summed over the ranks)."""
    dev = views.alpha.device
    N = len(views.gaussians)
    H, W = views.alpha.shape[1:]
    ones = torch.ones(N, 1, device=dev, requires_grad=True)
    px = []
    for i in ranks.own:
        j = ranks.rows([i])[0]  # the view's row in this process's FixedViews (i itself in one process)
        z = prepare_maps(teacher_maps, [i], (H, W), dev)
        covered = (views.alpha[j:j + 1] >= 0.5) & (z.norm(dim=-1) > 0.5)
        (views.render(ones, [j])[..., 0] * covered).sum().backward()
        px.append(z[covered])
    px = ranks.gather(torch.cat(px))
    if px.shape[0] == 0:
        raise ConfigError("distill: no covered pixel with a teacher feature in any view")
    if px.shape[0] > 200_000:
        px = px[torch.randperm(px.shape[0], generator=gen)[:200_000].to(dev)]
    d = min(cfg.latent_dim, px.shape[1])
    decoder, _ = pca_decoder(px, torch.ones(px.shape[0], device=dev), d)
    latents = torch.randn(N, d, generator=gen).to(dev) * cfg.init_scale
    return latents, decoder, ranks.total(ones.grad[:, 0].detach()) >= cfg.min_weight


def _start(gaussians: Gaussians, cameras: Cameras, teacher_maps: TeacherMaps, cfg: DistillConfig, init_lift,
           views: FixedViews, gen: torch.Generator, ranks: "_Ranks", lift_checkpoint: Optional[Path]):
    """The initial latents, decoder, validity and lift result (None with init="pca") of :func:`distill`."""
    dev = gaussians.device
    if cfg.init == "pca":
        return (*_pca_start(views, teacher_maps, cfg, gen, ranks), None)
    if init_lift is None:
        latents0, decoder0, lift_res = initial_field(gaussians, cameras, teacher_maps, cfg.latent_dim, cfg.lift,
                                                     distributed=ranks.group is not None, checkpoint=lift_checkpoint)
    else:
        lift_res = init_lift
        latents0, decoder0 = lift_res.latents, lift_res.decoder
    return latents0.to(dev), decoder0, lift_res.valid.to(dev), lift_res


def _pixel_loss(step: int, idx: List[int], lat: Tensor, decoder: Tensor, objective: SemanticObjective,
                views: FixedViews, teacher_maps: TeacherMaps, regions: Dict[int, Tensor], ranks: "_Ranks",
                size: Tuple[int, int]) -> Tuple[Tensor, Dict[str, float]]:
    """One step's pixel term (the objective on the step's views ``idx`` this process renders; 0 without any) and
    its parts; the teacher's regions are read once per view into ``regions``."""
    mine = ranks.mine(idx)  # the step's views this process renders (all of them in one process)
    if not mine:
        return lat.new_zeros(()), {}
    teacher = torch.stack([torch.as_tensor(get_map(teacher_maps, i)).to(lat.device).float() for i in mine])
    if objective.uses_regions:
        for i, t in zip(mine, teacher):
            if i not in regions:
                regions[i] = region_fraction(t, size)
    rows = ranks.rows(mine)
    return objective(step, views.render(lat, rows), views.alpha[rows], views.d1[rows], views.d2[rows], decoder,
                     teacher, torch.stack([regions[i] for i in mine]) if objective.uses_regions else None,
                     totals=ranks.totals(idx))


class _Selection:
    """distill()'s check views (:mod:`rh3dgs.method.selection`): the start from the lift of the other views, the
    check loss after the steps it is due and, at the end, the field chosen (and refitted on every view)."""

    def __init__(self, checks: CheckViews, fit: List[int], reference: Tensor, lift_all: Tensor):
        self.checks, self.fit, self.reference, self.lift_all = checks, fit, reference, lift_all

    @staticmethod
    def check(cfg: DistillConfig, ranks: "_Ranks", checkpoint) -> None:
        """Before any work: the check run's best step is no part of a checkpoint, its views no rank's share."""
        if cfg.init == "lift" and cfg.objective.selection.on and (ranks.group is not None or checkpoint is not None):
            raise ConfigError("distill: objective.selection (check views) runs in one process without checkpoints; "
                              "turn it off (check_fraction=0) for a distributed or checkpointed run")

    @classmethod
    def start(cls, cfg: DistillConfig, objective: SemanticObjective, views: FixedViews, teacher_maps: TeacherMaps,
              gaussians: Gaussians, cameras: Cameras, raw: Tensor, live: Tensor, decoder: Tensor
              ) -> Optional["_Selection"]:
        """None when the selection is off (or ``init="pca"``); else the check views, and ``raw`` set to the lift of
        the other views (neither the start nor training sees a check view)."""
        ids = check_view_indices(len(cameras), cfg.objective.selection.check_fraction) if cfg.init == "lift" else []
        if not ids:
            return None
        dev = views.alpha.device
        teacher = [torch.as_tensor(get_map(teacher_maps, i)).to(dev).float() for i in ids]
        size = (int(cameras.height), int(cameras.width))
        regions = [region_fraction(t, size) for t in teacher] if objective.uses_regions else None
        lift_all = objective.gaussian_latents(raw.detach()) * live
        fit_res = fit_lift(gaussians, cameras, teacher_maps, ids, replace(cfg.lift, latent_dim=cfg.latent_dim))
        reference = torch.where(fit_res.valid.to(dev)[:, None], lift_latents(fit_res, decoder.detach()), lift_all)
        with torch.no_grad():
            raw.copy_(reference)
        fit = [v for v in range(len(cameras)) if v not in ids]
        return cls(CheckViews(objective, lambda: views, ids, teacher, regions), fit, reference, lift_all)

    @torch.no_grad()
    def after_step(self, step: int, steps: int, objective: SemanticObjective, raw: Tensor, live: Tensor,
                   decoder: Tensor) -> None:
        if self.checks.due(step, steps):
            self.checks.measure(step, objective.gaussian_latents(raw) * live, objective.background, decoder)

    def finish(self, lat: Tensor, objective: SemanticObjective, dec: Tensor, gaussians, cameras, teacher_maps,
               cfg: DistillConfig, lift_res, views) -> Tuple[Tensor, Dict[str, object]]:
        """The field chosen and what was decided; with ``refit``, trained again from the lift on every view for the
        selected number of steps (none when the lift won) with the check run's decisions applied."""
        lat, sel = self.checks.finish(self.reference, lat, objective.background, dec, self.lift_all)
        sel["check_views"] = self.checks.ids
        if not cfg.objective.selection.refit:
            return lat, sel
        steps = 0 if sel["choice"] == "lift" else int(sel["selected_step"] or cfg.steps)
        if steps == 0:
            return self.lift_all, sel
        objective_cfg = replace(cfg.objective, selection=replace(cfg.objective.selection, check_fraction=0.0))
        with torch.enable_grad():  # called where the first run's result is read, under no_grad
            again = distill(gaussians, cameras, teacher_maps, replace(cfg, steps=steps, objective=objective_cfg,
                                                                      view_order=None), init_lift=lift_res, views=views)
        return apply_decisions(sel, again.latents, self.lift_all), sel


def _selection_info(sel: Dict[str, object]) -> Dict[str, object]:
    """What the suite reports of a run's selection (:func:`rh3dgs.method.selection.select_field`)."""
    if not sel:
        return {}
    return {"selected_step": sel["selected_step"], "fallback_fraction": sel["fallback_fraction"],
            "check_views": sel["check_views"], "selection": {k: sel[k] for k in ("choice", "check_loss", "check_history")}}


def distill(
    gaussians: Gaussians,
    cameras: Cameras,
    teacher_maps: TeacherMaps,
    cfg: Optional[DistillConfig] = None,
    progress: bool = False,
    init_lift=None,
    views: Optional[FixedViews] = None,
    checkpoint: Optional[Union[str, Path]] = None,
    distributed: Optional[bool] = None,
) -> DistillResult:
    """Distil teacher feature maps into per-Gaussian latents + a linear decoder (geometry fixed).

    Args:
        gaussians: the scene (its parameters are not modified).
        cameras: B training views (their resolution is the training resolution).
        teacher_maps: [B, h, w, D], a sequence of [h, w, D] or a callable ``i -> [h, w, D]``, as the
            teacher gives them (any resolution; see :class:`rh3dgs.method.objective.ObjectiveConfig.resolution`).
        cfg: :class:`DistillConfig`.
        init_lift: a :class:`rh3dgs.lifting.LiftResult` of these views to start from (init="lift"),
            instead of running the lift again (the suite shares one lift between its rows).
        views: :func:`rh3dgs.rendering.fixed_views` of these Gaussians and cameras, if already made.
        checkpoint: a folder for the state every ``cfg.checkpoint_every`` steps (and the initial lift's passes): a
            rerun with the same inputs and settings resumes from the last one, bit for bit where it would have gone.
        distributed: inside an initialised ``torch.distributed`` group of K > 1 processes (None: whenever there is
            one), every rank calls ``distill`` alike and renders its share of the views (module docstring); every
            rank gets the same result.
    """
    cfg = cfg or DistillConfig()
    t0 = time.perf_counter()
    dev = gaussians.device
    B, N = len(cameras), len(gaussians)
    gen = torch.Generator().manual_seed(int(cfg.seed))
    if cfg.view_order is not None and max(cfg.view_order) >= B:
        raise ConfigError(f"DistillConfig.view_order names view {max(cfg.view_order)}, there are {B}")
    ranks = _Ranks(current() if distributed is not False else None, B)
    _Selection.check(cfg, ranks, checkpoint)
    views = ranks.fixed_views(views, gaussians, cameras, cfg.tile_size)  # this process's views
    saved = None if checkpoint is None else _Checkpoints.of(Path(checkpoint), gaussians, cameras, cfg, init_lift, ranks)
    state = saved.load(dev) if saved is not None else None
    if state is not None:
        latents0, decoder0, valid, lift_res = state["raw"], state["decoder"], state["valid"], None
    else:
        latents0, decoder0, valid, lift_res = _start(gaussians, cameras, teacher_maps, cfg, init_lift, views, gen,
                                                     ranks, None if checkpoint is None else Path(checkpoint) / "lift")
    t_init = time.perf_counter() - t0

    d = latents0.shape[1]
    objective = SemanticObjective(cfg.objective, d, cfg.steps, seed=cfg.seed).to(dev)
    raw = latents0.clone().requires_grad_(True)
    decoder = decoder0.clone().to(dev).requires_grad_(cfg.decoder_lr > 0)
    groups = [{"params": [raw], "lr": cfg.lr}]
    if cfg.decoder_lr > 0:
        groups.append({"params": [decoder], "lr": cfg.decoder_lr})
    if objective.background.requires_grad and cfg.background_lr > 0:
        groups.append({"params": [objective.background], "lr": cfg.background_lr})
    opt = torch.optim.Adam(groups)
    valid_idx = torch.nonzero(valid).flatten()
    live = valid[:, None].to(raw.dtype)  # Gaussians without a feature stay at 0 and get no gradient
    sel = _Selection.start(cfg, objective, views, teacher_maps, gaussians, cameras, raw, live, decoder)
    fit = sel.fit if sel is not None else list(range(B))  # the views the semantic loss reads
    means = gaussians.means.detach()
    colors = gaussians.base_colors  # LIC's appearance positives
    order: List[int] = []
    history: List[Dict[str, float]] = []
    regions: Dict[int, Tensor] = {}
    H, W = int(cameras.height), int(cameras.width)
    first = 0
    if state is not None:  # resumed: where the checkpoint's run was
        first, order, history = state["step"], state["order"], state["history"]
        _restore(state, objective, opt, gen)
    elif saved is not None:
        saved.save(0, raw, decoder, valid, objective, opt, gen, order, history, ranks)
    ranks.prepare(objective, views, teacher_maps, regions)
    local: List[Dict[str, float]] = []  # this process's share of the steps' history since the last checkpoint
    for step in track(range(first, cfg.steps), description=f"distill: {cfg.objective.label}",
                      disable=not progress or not ranks.is_main):
        if len(order) < cfg.views_per_step:
            order += list(cfg.view_order) if cfg.view_order is not None else [
                fit[k] for k in torch.randperm(len(fit), generator=gen).tolist()]
        idx, order = order[:cfg.views_per_step], order[cfg.views_per_step:]
        idx = [i for i in idx if i in fit]  # a replayed order's check views: LIC only, as ns-train's steps on them
        opt.zero_grad(set_to_none=True)
        lat = objective.gaussian_latents(raw) * live
        loss, parts = _pixel_loss(step, idx, lat, decoder, objective, views, teacher_maps, regions, ranks, (H, W))
        l_sem = float(loss.detach())
        lc = objective.lic_loss(step, lat, decoder, means, subset=valid_idx, colors=colors) if ranks.is_main else \
            lat.new_zeros(())  # LIC reads the latents only (every rank has them): counted once, on rank 0
        loss = loss + lc
        if loss.requires_grad:
            loss.backward()
        ranks.sum_gradients(opt)  # the step's gradient over the whole batch: one all_reduce (none in one process)
        opt.step()
        local.append({"step": step, "loss": float(loss.detach()), "sem": l_sem, "lic": float(lc.detach()), **parts})
        if sel is not None:
            sel.after_step(step, cfg.steps, objective, raw, live, decoder)
        if saved is not None and saved.due(step + 1, cfg.steps):
            history += ranks.merge(local)
            local = []
            saved.save(step + 1, raw, decoder, valid, objective, opt, gen, order, history, ranks)
    history += ranks.merge(local)

    with torch.no_grad():
        lat = objective.gaussian_latents(raw.detach()) * live
        dec = decoder.detach()
        selection = {}
        if sel is not None:
            lat, selection = sel.finish(lat, objective, dec, gaussians, cameras, teacher_maps, cfg, lift_res, views)
        feats = F.normalize(lat @ dec.T, dim=-1)
    info = {"label": cfg.label, "steps": cfg.steps, "views": B, "gaussians": N, "valid": int(valid.sum()),
            "seconds": time.perf_counter() - t0, "seconds_init": t_init, "init": cfg.init,
            "final_loss": history[-1]["loss"] if history else math.nan, **ranks.info(lift_res),
            **_selection_info(selection)}
    if state is not None:
        info["resumed_at_step"] = int(first)
    return DistillResult(lat, dec, feats, valid, history, info, lift_res)


class _Ranks:
    """distill()'s share of the views in a ``torch.distributed`` group (the module docstring); in one process every
    view and nothing to combine (each method then gives back what it is given)."""

    def __init__(self, group: Optional[DistInfo], views: int):
        self.group = group
        K, r = (1, 0) if group is None else (group.world_size, group.rank)
        if group is not None and views < K:
            raise ConfigError(f"distill over {K} processes needs at least {K} views, there are {views}: run it on at "
                              f"most {views} processes")
        self.start, self.end = shard(views, K, r)
        self.own = list(range(self.start, self.end))
        self.counts = [b - a for a, b in (shard(views, K, q) for q in range(K))]
        self.offset = self.start  # a view's row in this process's FixedViews: view - offset
        self.table: Optional[Tensor] = None  # [B, 3] every view's objective totals

    @property
    def is_main(self) -> bool:
        return self.group is None or self.group.is_main

    def fixed_views(self, views: Optional[FixedViews], gaussians: Gaussians, cameras: Cameras,
                    tile_size: int) -> FixedViews:
        """The caller's ``views`` of every camera (a view's row is then its index), else this process's own."""
        B, N = len(cameras), len(gaussians)
        if views is None:
            return fixed_views(gaussians, cameras if self.group is None else cameras[self.own], tile_size)
        if len(views) != B or len(views.gaussians) != N:
            raise ConfigError(f"distill: views= holds {len(views)} views of {len(views.gaussians)} Gaussians, "
                              f"not {B} x {N}")
        self.offset = 0
        return views

    def mine(self, idx: List[int]) -> List[int]:
        return idx if self.group is None else [i for i in idx if self.start <= i < self.end]

    def rows(self, mine: List[int]) -> List[int]:
        return mine if self.offset == 0 else [i - self.offset for i in mine]

    def totals(self, idx: List[int]) -> Optional[Tensor]:
        """The objective's normalisers over the whole step's batch (None in one process: its own)."""
        return None if self.table is None else self.table[idx].sum(0)

    def gather(self, t: Tensor) -> Tensor:
        """Every rank's rows of ``t``, in rank (view) order."""
        if self.group is None:
            return t
        counts = all_gather_rows(torch.tensor([t.shape[0]], device=t.device), [1] * self.group.world_size)
        return all_gather_rows(t, counts.tolist())

    def total(self, t: Tensor) -> Tensor:
        return t if self.group is None else all_reduce(t)

    def prepare(self, objective: SemanticObjective, views: FixedViews, teacher_maps: TeacherMaps,
                regions: Dict[int, Tensor]) -> None:
        """Every view's :meth:`SemanticObjective.totals` (each rank its own views', then gathered)."""
        if self.group is None:
            return
        H, W = views.alpha.shape[1:]
        dev = views.alpha.device
        rows = []
        for i in self.own:
            j = i - self.offset
            t = torch.as_tensor(get_map(teacher_maps, i)).to(dev).float()
            if objective.uses_regions and i not in regions:
                regions[i] = region_fraction(t, (H, W))
            rows.append(objective.totals(views.alpha[j:j + 1], views.d1[j:j + 1], views.d2[j:j + 1], t[None],
                                         regions[i][None] if objective.uses_regions else None))
        self.table = all_gather_rows(torch.stack(rows).to(dev), self.counts).cpu()

    def sum_gradients(self, opt: torch.optim.Optimizer) -> None:
        """Each parameter's gradient summed over the ranks (one all_reduce of them all; zero where a rank had none)."""
        if self.group is None:
            return
        params = [p for g in opt.param_groups for p in g["params"]]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        all_reduce(flat)
        at = 0
        for p in params:
            p.grad = flat[at:at + p.numel()].view_as(p)
            at += p.numel()

    def merge(self, history: List[Dict[str, float]]) -> List[Dict[str, float]]:
        """The ranks' shares of each step's history added up (the batch's loss and its terms; "delta", a setting,
        taken as it is)."""
        if self.group is None:
            return history
        shares = all_gather_object(history)
        out = []
        for entries in zip(*shares):
            merged: Dict[str, float] = {"step": entries[0]["step"]}
            for e in entries:
                for k, v in e.items():
                    if k != "step":
                        merged[k] = v if k == "delta" else merged.get(k, 0.0) + v
            out.append(merged)
        return out

    def info(self, lift_res) -> Dict[str, object]:
        if self.group is None:
            return {}
        out: Dict[str, object] = {"world_size": self.group.world_size, "views_by_rank": self.counts}
        if lift_res is not None:
            out.update(owned_by_rank=lift_res.info["owned_by_rank"], seen_by_rank=lift_res.info["seen_by_rank"])
        return out


class _Checkpoints:
    """distill()'s checkpoints: ``step-000050.pt`` every ``every`` steps, written by rank 0 (the parameters, the
    optimiser, the generators and LIC's graph are the same on every rank), read by every rank."""

    def __init__(self, folder: Path, key: str, group: Optional[DistInfo], every: int):
        self.store = ResumeFolder(folder, key, group)
        self.every = int(every)

    @classmethod
    def of(cls, folder: Path, gaussians: Gaussians, cameras: Cameras, cfg: DistillConfig, init_lift,
           ranks: _Ranks) -> "_Checkpoints":
        """The checkpoints of this job (its inputs' and settings' fingerprint) in ``folder / "distill"``."""
        key = fingerprint(gaussians.means, gaussians.quats, gaussians.scales, gaussians.opacities, gaussians.sh0,
                          cameras.viewmats, cameras.Ks, (cameras.width, cameras.height), len(cameras), repr(cfg),
                          None if init_lift is None else init_lift.latents)
        return cls(folder / "distill", key, ranks.group, cfg.checkpoint_every)

    def due(self, step: int, steps: int) -> bool:
        return self.every > 0 and step < steps and step % self.every == 0

    def load(self, device: torch.device) -> Optional[dict]:
        files = sorted(self.store.folder.glob("step-*.pt"))
        state = None
        if files:
            try:
                state = torch.load(files[-1], map_location=device, weights_only=True)
            except (OSError, RuntimeError, EOFError, ValueError):
                state = None
        return state if self.store.agree(state is not None) else None

    def save(self, step: int, raw: Tensor, decoder: Tensor, valid: Tensor, objective: SemanticObjective,
             opt: torch.optim.Optimizer, gen: torch.Generator, order: List[int], history: list, ranks: _Ranks) -> None:
        if not ranks.is_main:
            return
        state = {"step": step, "raw": raw.detach(), "decoder": decoder.detach(), "valid": valid,
                 "background": objective.background.detach(), "optimizer": opt.state_dict(),
                 "generator": gen.get_state(), "order": list(order), "history": history,
                 "lic": None if objective.lic is None else objective.lic.state_dict()}
        path = self.store.folder / f"step-{step:06d}.pt"
        with atomic_write(path) as f:
            torch.save(state, f)
        for old in self.store.folder.glob("step-*.pt"):
            if old.name < path.name:
                old.unlink(missing_ok=True)


def _restore(state: dict, objective: SemanticObjective, opt: torch.optim.Optimizer, gen: torch.Generator) -> None:
    """A checkpoint's optimiser, background latent, generators and LIC state (the parameters are already in place)."""
    with torch.no_grad():
        objective.background.copy_(state["background"])
    opt.load_state_dict(state["optimizer"])
    gen.set_state(state["generator"])
    if objective.lic is not None and state["lic"] is not None:
        objective.lic.load_state_dict(state["lic"])
