"""VFM: Visibility-weighted Frechet Mean distillation (Riemannian Huber loss).

With ``d`` the geodesic distance on the unit sphere and ``rho_delta`` the Huber function::

    L_pix  = sum_u w(u) rho_delta(d(z_hat(u), z(u))) / sum_u w(u)
    mu_t   = argmin_mu sum_u w(u) rho_delta(d(z(u), mu))          (teacher, no gradient)
    mu_s   = argmin_mu sum_u w(u) rho_delta(d(z_hat(u), mu))      (rendered, differentiable)
    L_mean = mean over segments of d(mu_s, mu_t)^2   (or rho_delta(d(mu_s, mu_t)))
    L_VFM  = L_pix + lambda_mean * L_mean

A segment is a view (default) or, with a region id map, a (view, region) pair. ``delta``
is annealed from ``delta_start`` to ``delta_end`` over ``anneal_steps``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from ..errors import ConfigError, NonFiniteError, ShapeError
from ..ranges import Range, check_fields
from .sphere import geodesic_distance, huber, robust_frechet_mean

__all__ = ["VFMConfig", "delta_at", "pixel_loss", "mean_loss", "kept_segments", "vfm_loss"]

Tensor = torch.Tensor


@dataclass
class VFMConfig:
    """Settings of the VFM loss (docs/method.md, section 3)."""

    delta_start: Annotated[float, Range(gt=0, finite=False)] = 1.0
    """Huber threshold in radians at step 0 (1 rad ~ 57 degrees: nearly every pixel in the quadratic zone)."""
    delta_end: Annotated[float, Range(gt=0, finite=False)] = 0.25
    """Huber threshold in radians after annealing (~14 degrees; beyond it a pixel's pull is capped)."""
    anneal_steps: Annotated[int, Range(ge=0)] = 10000
    """Steps over which the threshold goes from delta_start to delta_end."""
    schedule: str = "cosine"
    """cosine, linear or constant (constant: delta_start throughout)."""
    lambda_mean: Annotated[float, Range(ge=0)] = 0.1
    """Weight of the mean term L_mean, >= 0 (0: skipped)."""
    mean_loss: str = "squared"
    """squared: d(mu_s, mu_t)^2; huber: rho_delta(d(mu_s, mu_t))."""
    mean_iters: Annotated[int, Range(ge=1)] = 20
    """IRLS iterations of the robust Frechet means."""
    mean_tol: Annotated[float, Range(ge=0)] = 1e-6
    """Step tolerance (radians) of the robust Frechet means."""
    region_wise: bool = False
    """Use (view, region) segments when a region map is given (off: whole views)."""
    min_region_pixels: Annotated[int, Range(ge=0)] = 16
    """Segments with fewer pixels (or zero total weight) are left out of L_mean."""

    def __post_init__(self) -> None:
        check_fields(self)  # every numeric field against its declared Range (rh3dgs.ranges)
        if self.schedule not in ("cosine", "linear", "constant"):
            raise ConfigError(f"VFMConfig.schedule must be 'cosine', 'linear' or 'constant', got {self.schedule!r}")
        if self.mean_loss not in ("squared", "huber"):
            raise ConfigError(f"VFMConfig.mean_loss must be 'squared' or 'huber', got {self.mean_loss!r}")
        if self.min_region_pixels < 1:
            raise ConfigError(f"VFMConfig.min_region_pixels must be >= 1, got {self.min_region_pixels}")


def delta_at(step: int, cfg: VFMConfig) -> float:
    """Huber threshold at a training step.

    ``t = clamp(step / anneal_steps, 0, 1)`` (``t = 1`` when ``anneal_steps == 0``);
    cosine: ``end + (start - end) (1 + cos(pi t)) / 2``; linear: ``start + (end - start) t``;
    constant: ``start``.
    """
    if cfg.schedule == "constant":
        return float(cfg.delta_start)
    t = 1.0 if cfg.anneal_steps <= 0 else min(max(step / cfg.anneal_steps, 0.0), 1.0)
    s, e = float(cfg.delta_start), float(cfg.delta_end)
    if math.isinf(s) or math.isinf(e):
        return s if t < 1.0 else e
    if cfg.schedule == "linear":
        return s + (e - s) * t
    return e + (s - e) * 0.5 * (1.0 + math.cos(math.pi * t))


def _flatten(rendered: Tensor, teacher: Tensor, weights: Optional[Tensor], fn: str) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> rendered [P, D], teacher [P, D], weights [P], view ids [P]."""
    if rendered.shape != teacher.shape:
        raise ShapeError(f"{fn}: rendered {list(rendered.shape)} and teacher {list(teacher.shape)} must match")
    if rendered.dim() == 4:
        B, H, W, D = rendered.shape
        view = torch.arange(B, device=rendered.device).repeat_interleave(H * W)
        lead = (B, H, W)
    elif rendered.dim() == 2:
        view = torch.zeros(rendered.shape[0], dtype=torch.long, device=rendered.device)
        lead = (rendered.shape[0],)
    else:
        raise ShapeError(f"{fn}: features must be [B, H, W, D] or [P, D], got {list(rendered.shape)}")
    D = rendered.shape[-1]
    if weights is None:
        w = torch.ones(lead, dtype=rendered.dtype, device=rendered.device)
    else:
        if tuple(weights.shape) != lead:
            raise ShapeError(f"{fn}: weights must be {list(lead)}, got {list(weights.shape)}")
        w = weights
    w = w.detach().reshape(-1).to(rendered.dtype)
    if not torch.isfinite(w).all():
        raise NonFiniteError(f"{fn}: weights contain NaN/Inf")
    if (w < 0).any():
        raise ConfigError(f"{fn}: weights must be >= 0")
    return rendered.reshape(-1, D), teacher.reshape(-1, D), w, view


def pixel_loss(rendered: Tensor, teacher: Tensor, weights: Optional[Tensor], delta: float,
               total: Optional[Tensor] = None) -> Tensor:
    """Weighted Riemannian Huber loss ``sum w rho_delta(d(z_hat, z)) / sum w``.

    Args:
        rendered: [B, H, W, D] or [P, D] rendered features (normalised here).
        teacher: same shape, teacher features (normalised here, no gradient).
        weights: [B, H, W] or [P] non-negative weights (e.g. VCD ``w_bar``; detached) or None.
        delta: Huber threshold in rad (``math.inf`` = squared geodesic loss / 2).
        total: the denominator ``sum w`` of a batch these pixels are part of (its other views on other
            processes), instead of theirs: the losses of the parts then add up to the batch's.
    Returns:
        scalar; 0 (keeping the graph) when the weights sum to 0.
    """
    zs, zt, w, _ = _flatten(rendered, teacher, weights, "pixel_loss")
    zs = F.normalize(zs, dim=-1)
    zt = F.normalize(zt.detach(), dim=-1)
    rho = huber(geodesic_distance(zs, zt), delta)
    wsum = w.sum() if total is None else total.to(w)
    if float(wsum) <= 0.0:
        return (rho * w).sum()
    return (rho * w).sum() / wsum


def _segments(view: Tensor, regions: Optional[Tensor], P: int) -> Tuple[Tensor, int, Tensor]:
    """-> segment id per pixel [P] (-1 = ignored), number of segments S, view of each segment [S]."""
    if regions is None:
        S = int(view.max().item()) + 1 if P > 0 else 0
        return view, S, torch.arange(S, device=view.device)
    reg = regions.reshape(-1).to(view.device).long()
    if reg.shape[0] != P:
        raise ShapeError(f"mean_loss: regions must have one id per pixel ({P}), got {list(regions.shape)}")
    keep = reg >= 0
    stride = int(reg.max().item()) + 1 if P > 0 else 1
    uniq, inv = torch.unique(view[keep] * stride + reg[keep], return_inverse=True)
    seg = torch.full((P,), -1, dtype=torch.long, device=view.device)
    seg[keep] = inv
    return seg, int(uniq.shape[0]), torch.div(uniq, stride, rounding_mode="floor")


def mean_loss(
    rendered: Tensor,
    teacher: Tensor,
    weights: Optional[Tensor],
    delta: float,
    regions: Optional[Tensor] = None,
    cfg: Optional[VFMConfig] = None,
    return_parts: bool = False,
    total: Optional[Tensor] = None,
) -> Union[Tensor, Tuple[Tensor, Dict[str, Tensor]]]:
    """Distance between the robust Frechet means of rendered and teacher features.

    Args:
        rendered: [B, H, W, D] or [P, D] (one view) rendered features.
        teacher: same shape, teacher features (no gradient).
        weights: [B, H, W] / [P] non-negative weights or None.
        delta: Huber threshold (rad) of the Frechet means (and of a 'huber' mean loss).
        regions: optional long [B, H, W] / [P] region ids (< 0 = ignore); used when
            ``cfg.region_wise`` is True, each (view, region) pair is then a segment.
        cfg: :class:`VFMConfig`.
        return_parts: also return a dict of intermediate values.
        total: the number of kept segments of a batch these views are part of (:func:`kept_segments` summed over
            its views on every process), instead of theirs: the parts' losses then add up to the batch's.
    Returns:
        loss: the mean over kept segments of d(mu_s, mu_t)^2 (or the Huber of it), 0
        keeping the graph when no segment is kept. With ``return_parts``: ``(loss, parts)``,
        parts has ``mu_s``,
        ``mu_t`` [S, D], ``dist`` [S], ``kept`` [S] bool and ``segment_view`` [S].
    """
    cfg = cfg or VFMConfig()
    zs, zt, w, view = _flatten(rendered, teacher, weights, "mean_loss")
    P = zs.shape[0]
    seg, S, seg_view = _segments(view, regions if cfg.region_wise else None, P)
    use = seg >= 0
    zs_u, zt_u, w_u, seg_u = zs[use], zt[use].detach(), w[use], seg[use]
    kept = _kept(seg_u, w_u, S, cfg)
    common = dict(segment_ids=seg_u, num_segments=S, delta=delta, max_iters=cfg.mean_iters, tol=cfg.mean_tol)
    mu_t, _ = robust_frechet_mean(zt_u, w_u, differentiable=False, **common)
    mu_s, _ = robust_frechet_mean(zs_u, w_u, differentiable=True, init=mu_t, **common)  # from the teacher's
    dist = geodesic_distance(mu_s, mu_t.detach())
    per = dist * dist if cfg.mean_loss == "squared" else huber(dist, delta)
    n_kept = int(kept.sum().item()) if total is None else int(round(float(total)))
    if n_kept == 0:
        loss = (per * 0.0).sum() if S > 0 else zs.sum() * 0.0
    else:
        loss = per[kept].sum() / n_kept
    if not return_parts:
        return loss
    parts = {"mu_s": mu_s, "mu_t": mu_t, "dist": dist.detach(), "kept": kept, "segment_view": seg_view}
    return loss, parts


def _kept(seg: Tensor, w: Tensor, S: int, cfg: VFMConfig) -> Tensor:
    """[S] bool: the segments (ids ``seg`` per pixel, weights ``w``) with enough pixels and some weight."""
    with torch.no_grad():
        count = torch.zeros(S, device=w.device).index_add_(0, seg, torch.ones_like(w, dtype=torch.float32))
        wsum = torch.zeros(S, device=w.device, dtype=w.dtype).index_add_(0, seg, w)
        return (count >= cfg.min_region_pixels) & (wsum > 0)


def kept_segments(weights: Tensor, regions: Optional[Tensor] = None, cfg: Optional[VFMConfig] = None) -> int:
    """How many segments of a ``[B, H, W]`` batch of pixel ``weights`` the mean term averages over: its views (or,
    with ``cfg.region_wise``, each view's ``regions``) with at least ``min_region_pixels`` pixels and some weight.

    >>> kept_segments(torch.ones(2, 8, 8)), kept_segments(torch.cat([torch.ones(1, 8, 8), torch.zeros(1, 8, 8)]))
    (2, 1)
    """
    cfg = cfg or VFMConfig()
    B = int(weights.shape[0])
    P = int(weights.numel())
    view = torch.arange(B, device=weights.device).repeat_interleave(P // max(B, 1))
    seg, S, _ = _segments(view, regions if cfg.region_wise else None, P)
    use = seg >= 0
    return int(_kept(seg[use], weights.detach().reshape(-1)[use], S, cfg).sum())


def vfm_loss(
    rendered: Tensor,
    teacher: Tensor,
    weights: Optional[Tensor],
    step: int,
    cfg: Optional[VFMConfig] = None,
    regions: Optional[Tensor] = None,
    delta: Optional[float] = None,
    totals: Optional[Tuple[Tensor, Tensor]] = None,
) -> Tuple[Tensor, Dict[str, Tensor]]:
    """``L_VFM = L_pix + lambda_mean * L_mean`` at a training step.

    Args:
        rendered, teacher: [B, H, W, D] or [P, D]; weights: [B, H, W] / [P] or None.
        step: training step (sets delta via :func:`delta_at`) unless ``delta`` is given.
        cfg: :class:`VFMConfig`; regions: optional region ids for region-wise means.
        totals: (the pixel weights' sum, the kept segments) of a batch these views are part of, as
            :func:`pixel_loss` / :func:`mean_loss` take them (a batch split over processes).
    Returns:
        ``(total, parts)`` with parts ``pix``, ``mean`` (detached scalars) and ``delta``.
        The mean term is skipped (0) when ``lambda_mean == 0``.
    """
    cfg = cfg or VFMConfig()
    d = delta_at(step, cfg) if delta is None else float(delta)
    l_pix = pixel_loss(rendered, teacher, weights, d, total=None if totals is None else totals[0])
    if cfg.lambda_mean > 0:
        l_mean = mean_loss(rendered, teacher, weights, d, regions=regions, cfg=cfg,
                           total=None if totals is None else totals[1])
    else:
        l_mean = torch.zeros((), dtype=l_pix.dtype, device=l_pix.device)
    total = l_pix + cfg.lambda_mean * l_mean
    parts = {
        "pix": l_pix.detach(),
        "mean": l_mean.detach(),
        "delta": torch.tensor(d, dtype=l_pix.dtype),
    }
    return total, parts
