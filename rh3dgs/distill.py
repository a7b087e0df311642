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
  ``info`` reports ``selected_step``, ``fallback_fraction``, ``check_views`` and ``selection``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .cameras import Cameras
from .errors import ConfigError
from .gaussians import Gaussians
from .lifting import LiftConfig, initial_field, pca_decoder
from .method.objective import ObjectiveConfig, SemanticObjective
from .method.selection import CheckViews, apply_decisions, check_view_indices, fit_lift, lift_latents
from .progress import track
from .rendering import FixedViews, fixed_views
from .teachers.maps import TeacherMaps, get_map, prepare_maps, region_fraction

__all__ = ["DistillConfig", "DistillResult", "distill"]


@dataclass
class DistillConfig:
    """Settings of :func:`distill`."""

    steps: int = 200
    """Optimisation steps."""
    views_per_step: int = 2
    """Views rendered per step."""
    latent_dim: int = 16
    """d, the latent dimension."""
    lr: float = 0.002
    """Adam learning rate of the latents."""
    decoder_lr: float = 0.0
    """Adam learning rate of the decoder (0 = keep the initial decoder)."""
    background_lr: float = 0.01
    """Adam learning rate of the background latent."""
    init: str = "lift"
    """"lift" (the training-free lift's latents and decoder) or "pca" (PCA decoder, random latents)."""
    init_scale: float = 0.1
    """Std of random initial latents (init="pca", and Gaussians the lift leaves invalid)."""
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    """The semantic objective (VCD / VFM / LIC switches and their settings)."""
    lift: LiftConfig = field(default_factory=LiftConfig)
    """Settings of the lift used by init="lift" (its latent_dim is overridden by ``latent_dim``)."""
    seed: int = 0
    view_order: Optional[Tuple[int, ...]] = None
    """The views of the steps, in order, ``views_per_step`` at a time (e.g. a training run's camera order, to
    replay it); None: epochs of a permutation drawn from ``seed``."""
    min_weight: float = 1e-6
    """init="pca": Gaussians whose total compositing weight on covered pixels is below this are invalid."""
    tile_size: int = 16

    def __post_init__(self) -> None:
        if self.steps < 0 or self.views_per_step < 1 or self.latent_dim < 1:
            raise ConfigError("DistillConfig: steps >= 0, views_per_step >= 1 and latent_dim >= 1 are required")
        if self.init not in ("pca", "lift"):
            raise ConfigError(f"DistillConfig.init must be 'pca' or 'lift', got {self.init!r}")
        if self.view_order is not None and (len(self.view_order) == 0 or min(self.view_order) < 0):
            raise ConfigError("DistillConfig.view_order must list view indices >= 0")
        if not (self.lr > 0 and self.decoder_lr >= 0 and self.background_lr >= 0):
            raise ConfigError("DistillConfig: lr must be > 0, decoder_lr and background_lr >= 0")

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


def _pca_start(views: FixedViews, teacher_maps: TeacherMaps, cfg: DistillConfig, gen: torch.Generator):
    """init="pca": decoder from the teacher pixels, random latents, validity from the compositing weights."""
    dev = views.alpha.device
    N = len(views.gaussians)
    H, W = views.alpha.shape[1:]
    ones = torch.ones(N, 1, device=dev, requires_grad=True)
    px = []
    for i in range(len(views)):
        z = prepare_maps(teacher_maps, [i], (H, W), dev)
        covered = (views.alpha[i:i + 1] >= 0.5) & (z.norm(dim=-1) > 0.5)
        (views.render(ones, [i])[..., 0] * covered).sum().backward()
        px.append(z[covered])
    px = torch.cat(px)
    if px.shape[0] == 0:
        raise ConfigError("distill: no covered pixel with a teacher feature in any view")
    if px.shape[0] > 200_000:
        px = px[torch.randperm(px.shape[0], generator=gen)[:200_000].to(dev)]
    d = min(cfg.latent_dim, px.shape[1])
    decoder, _ = pca_decoder(px, torch.ones(px.shape[0], device=dev), d)
    latents = torch.randn(N, d, generator=gen).to(dev) * cfg.init_scale
    return latents, decoder, ones.grad[:, 0].detach() >= cfg.min_weight


def _check_views(objective: SemanticObjective, views: FixedViews, teacher_maps: TeacherMaps, B: int,
                 size: Tuple[int, int]) -> Optional[CheckViews]:
    """The run's check views (:mod:`rh3dgs.method.selection`), or None when the selection is off."""
    ids = check_view_indices(B, objective.cfg.selection.check_fraction)
    if not ids:
        return None
    dev = views.alpha.device
    teacher = [torch.as_tensor(get_map(teacher_maps, i)).to(dev).float() for i in ids]
    regions = [region_fraction(t, size) for t in teacher] if objective.uses_regions else None
    return CheckViews(objective, lambda: views, ids, teacher, regions)


def _refit(gaussians, cameras, teacher_maps, cfg: DistillConfig, lift_res, views, selection: Dict[str, object],
           lift_all: Tensor) -> Tensor:
    """The selection's refit (:mod:`rh3dgs.method.selection`): trained again from the lift on every view for the
    selected number of steps (none when the lift won), the check run's decisions applied."""
    steps = 0 if selection["choice"] == "lift" else int(selection["selected_step"] or cfg.steps)
    if steps == 0:
        return lift_all
    objective = replace(cfg.objective, selection=replace(cfg.objective.selection, check_fraction=0.0))
    with torch.enable_grad():  # called where the first run's result is read, under no_grad
        again = distill(gaussians, cameras, teacher_maps, replace(cfg, steps=steps, objective=objective,
                                                                  view_order=None), init_lift=lift_res, views=views)
    return apply_decisions(selection, again.latents, lift_all)


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
    """
    cfg = cfg or DistillConfig()
    t0 = time.perf_counter()
    dev = gaussians.device
    B, N = len(cameras), len(gaussians)
    gen = torch.Generator().manual_seed(int(cfg.seed))
    if cfg.view_order is not None and max(cfg.view_order) >= B:
        raise ConfigError(f"DistillConfig.view_order names view {max(cfg.view_order)}, there are {B}")
    if views is None:
        views = fixed_views(gaussians, cameras, cfg.tile_size)
    elif len(views) != B or len(views.gaussians) != N:
        raise ConfigError(f"distill: views= holds {len(views)} views of {len(views.gaussians)} Gaussians, "
                          f"not {B} x {N}")
    lift_res = None
    if cfg.init == "lift":
        if init_lift is None:
            latents0, decoder0, lift_res = initial_field(gaussians, cameras, teacher_maps, cfg.latent_dim, cfg.lift)
        else:
            lift_res = init_lift
            latents0, decoder0 = lift_res.latents, lift_res.decoder
        valid = lift_res.valid.to(dev)
        latents0 = latents0.to(dev)
    else:
        latents0, decoder0, valid = _pca_start(views, teacher_maps, cfg, gen)
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
    checks = None if cfg.init != "lift" else _check_views(objective, views, teacher_maps, B,
                                                         (int(cameras.height), int(cameras.width)))
    fit = [v for v in range(B) if checks is None or v not in checks.ids]  # the views the semantic loss reads
    if checks is not None:  # start from the lift of the fit views: neither start nor training sees a check view
        lift_all = objective.gaussian_latents(raw.detach()) * live
        fit_res = fit_lift(gaussians, cameras, teacher_maps, checks.ids, replace(cfg.lift, latent_dim=cfg.latent_dim))
        reference = torch.where(fit_res.valid.to(dev)[:, None], lift_latents(fit_res, decoder.detach()), lift_all)
        with torch.no_grad():
            raw.copy_(reference)
    means = gaussians.means.detach()
    colors = gaussians.base_colors  # LIC's appearance positives
    order: List[int] = []
    history: List[Dict[str, float]] = []
    regions: Dict[int, Tensor] = {}
    H, W = int(cameras.height), int(cameras.width)
    for step in track(range(cfg.steps), description=f"distill: {cfg.objective.label}", disable=not progress):
        if len(order) < cfg.views_per_step:
            order += list(cfg.view_order) if cfg.view_order is not None else [
                fit[k] for k in torch.randperm(len(fit), generator=gen).tolist()]
        idx, order = order[:cfg.views_per_step], order[cfg.views_per_step:]
        idx = [i for i in idx if i in fit]  # a replayed order's check views: LIC only, as ns-train's steps on them
        opt.zero_grad(set_to_none=True)
        lat = objective.gaussian_latents(raw) * live
        loss, parts = lat.sum() * 0.0, {}
        if idx:
            teacher = torch.stack([torch.as_tensor(get_map(teacher_maps, i)).to(dev).float() for i in idx])
            if objective.uses_regions:  # the teacher's regions, read once per view
                for i, t in zip(idx, teacher):
                    if i not in regions:
                        regions[i] = region_fraction(t, (H, W))
            loss, parts = objective(step, views.render(lat, idx), views.alpha[idx], views.d1[idx], views.d2[idx], decoder,
                                    teacher, torch.stack([regions[i] for i in idx]) if objective.uses_regions else None)
        l_sem = float(loss.detach())
        lc = objective.contrast(step, lat, decoder, means, subset=valid_idx, colors=colors)
        loss = loss + lc
        loss.backward()
        opt.step()
        history.append({"step": step, "loss": float(loss.detach()), "sem": l_sem, "lic": float(lc.detach()), **parts})
        if checks is not None and checks.due(step, cfg.steps):
            with torch.no_grad():
                checks.measure(step, objective.gaussian_latents(raw) * live, objective.background, decoder)

    with torch.no_grad():
        lat = objective.gaussian_latents(raw.detach()) * live
        dec = decoder.detach()
        selection = {}
        if checks is not None:
            lat, selection = checks.finish(reference, lat, objective.background, dec, lift_all)
            selection["check_views"] = checks.ids
            if cfg.objective.selection.refit:
                lat = _refit(gaussians, cameras, teacher_maps, cfg, lift_res, views, selection, lift_all)
        feats = F.normalize(lat @ dec.T, dim=-1)
    info = {"label": cfg.label, "steps": cfg.steps, "views": B, "gaussians": N, "valid": int(valid.sum()),
            "seconds": time.perf_counter() - t0, "seconds_init": t_init, "init": cfg.init,
            "final_loss": history[-1]["loss"] if history else math.nan, **_selection_info(selection)}
    return DistillResult(lat, dec, feats, valid, history, info, lift_res)
