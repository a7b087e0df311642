"""VCD: Visibility-Calibrated Distillation weights.

Per-pixel reliability weights computed (under stop-gradient) from the rasterizer's
statistics: accumulated opacity ``A = sum_i w_i``, depth moments ``D1 = sum_i w_i z_i`` and
``D2 = sum_i w_i z_i^2``, and optionally a feature map (the teacher's)::

    Dbar   = D1 / (A + eps)                      expected depth
    Var    = max(D2 / (A + eps) - Dbar^2, 0)     ray depth variance
    W_op   = clamp(A / a0, 0, 1) ** p
    W_var  = exp(-(Var / (Dbar^2 + eps)) / s_var)
    W_edge = exp(-g_depth / s_depth - g_feat / s_feat)
    W_fp   = purity(u) ** p_fp                   (footprint purity, when ``footprint`` > 1 px)
    W_seg  = (frac(u) / min_v frac(v)) ** -gamma   (mask specificity, when a region map is given)
    w      = max(W_op * W_var * W_edge * W_fp * W_seg, min_weight)      (on valid pixels, 0 elsewhere)
    w_bar  = w / mean_valid(w)                            per view

with the edge strengths (both scale-free, computed over the 4-neighbourhood and dilated
by a ``(2 r + 1)^2`` max filter)::

    g_depth(u) = max_{v in N4(u)} |Dbar(u) - Dbar(v)| / (max(Dbar(u), Dbar(v)) + eps)   in [0, 1]
    g_feat(u)  = max_{v in N4(u)} 1 - cos(f(u), f(v))                                   in [0, 2]

For small depth steps ``g_depth ~ |grad Dbar| / Dbar`` (relative depth gradient); the
symmetric normaliser marks both sides of an occlusion boundary equally.

``frac(u)`` is the share of the view covered by the teacher region pixel u lies in
(:func:`rh3dgs.teachers.maps.region_fraction`: a mask teacher's mask; every cell of a dense
patch-token map is its own region, so the term is constant there and drops out in the
normalisation). A mask teacher describes all of a mask with one embedding, of the crop of the
whole mask: the larger the mask, the less that embedding is about the pixel's own object (SAM
under-segments: an object merged with what it touches gets the union's embedding, mostly the
larger member's). Per Gaussian, the views that isolate its object in a small mask then count
more than the views that merged it into a large one. See
``docs/method.md`` for the choices made where the paper is silent.
"""
from __future__ import annotations

import functools

import math
from dataclasses import dataclass, replace
from typing import Annotated, Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from ..errors import ConfigError, NonFiniteError, ShapeError
from ..ranges import Range, check_fields

__all__ = ["VCDConfig", "reliability_weights", "pixel_weights", "teacher_footprint", "footprint_purity", "render_depth_stats"]

Tensor = torch.Tensor


@dataclass
class VCDConfig:
    """Settings of the VCD reliability weights: each term has an on/off switch (docs/method.md, section 2)."""

    use_opacity: bool = True
    """Opacity term W_op (thin coverage weighs less)."""
    use_edge: bool = True
    """Edge term W_edge (discontinuities weigh less)."""
    use_variance: bool = True
    """Mixed-depth term W_var (mixed rays weigh less)."""
    eps: Annotated[float, Range(gt=0)] = 1e-6
    """Guard in A + eps, Dbar^2 + eps and the depth edges."""
    opacity_ref: Annotated[float, Range(gt=0)] = 0.9
    """a0: accumulated opacity at which W_op reaches 1."""
    opacity_power: Annotated[float, Range(gt=0)] = 2.0
    """p in W_op = clamp(A / a0, 0, 1) ** p, > 0."""
    variance_scale: Annotated[float, Range(gt=0)] = 0.05
    """s_var in W_var = exp(-Var / Dbar^2 / s_var), > 0."""
    edge_depth: bool = True
    """Depth discontinuities in W_edge."""
    edge_depth_scale: Annotated[float, Range(gt=0)] = 0.1
    """s_depth, > 0 (a 1 % depth step gives W ~ 0.9)."""
    edge_features: bool = True
    """Feature discontinuities in W_edge (with a feature map)."""
    edge_feature_scale: Annotated[float, Range(gt=0)] = 0.1
    """s_feat, > 0, on 1 - cosine between neighbours."""
    edge_radius: Annotated[int, Range(ge=0)] = 1
    """Dilate edges by a (2 r + 1)^2 max filter (0: off)."""
    min_weight: Annotated[float, Range(ge=0, le=1)] = 0.0
    """Floor before the per-view normalisation, in [0, 1]."""
    footprint: Annotated[float, Range(ge=0)] = 0.0
    """Teacher footprint in pixels for W_fp (0: off)."""
    footprint_tol: Annotated[float, Range(gt=0)] = 0.05
    """W_fp: relative depth difference of one surface."""
    footprint_power: Annotated[float, Range(ge=0)] = 1.0
    """W_fp = purity ** footprint_power (0: off)."""
    mixing_coarse_only: bool = False
    """W_op and W_var only against coarser teachers."""
    segment_power: Annotated[float, Range(ge=0)] = 0.0
    """gamma of the mask-specificity term W_seg (0: off)."""

    @property
    def reads_regions(self) -> bool:
        """Whether the weights use the teacher's regions (the mask-specificity term W_seg is on)."""
        return self.segment_power > 0

    @classmethod
    def rh3dgs(cls, **overrides) -> "VCDConfig":
        """The settings the lift and the objective use: opacity, relative depth variance and mask specificity
        (gamma 0.25); no edge terms, no footprint purity (why: docs/method.md, section 2, "The default terms").

        >>> VCDConfig.rh3dgs().segment_power, VCDConfig.rh3dgs(footprint_power=2.0).footprint_power
        (0.25, 2.0)
        """
        base = dict(edge_depth=False, edge_features=False, footprint_power=0.0, segment_power=0.25)
        base.update(overrides)
        return cls(**base)

    def __post_init__(self) -> None:
        check_fields(self)  # every numeric field against its declared Range (rh3dgs.ranges)


def render_depth_stats(alpha: Tensor, depth_m1: Tensor, depth_m2: Tensor, eps: float = 1e-6) -> Tuple[Tensor, Tensor]:
    """Expected depth and ray depth variance from the compositing statistics.

    Args:
        alpha, depth_m1, depth_m2: [...] accumulated opacity A, D1 = sum w z, D2 = sum w z^2.
    Returns:
        ``(Dbar, Var)`` [...]: ``D1 / (A + eps)`` and ``max(D2 / (A + eps) - Dbar^2, 0)``.
    """
    denom = alpha + eps
    dbar = depth_m1 / denom
    var = (depth_m2 / denom - dbar * dbar).clamp_min(0.0)
    return dbar, var


def _neighbour_max(h: Tensor, v: Tensor) -> Tensor:
    """Per pixel, the max of its pairwise values with its 4 neighbours.

    h: [B, H, W-1] value of pair (i, j)-(i, j+1); v: [B, H-1, W] pair (i, j)-(i+1, j).
    Returns [B, H, W] (0 where a pixel has no neighbour on a side).
    """
    hp = F.pad(h, (1, 1))  # [B, H, W+1]: hp[..., j] = pair (j-1, j), hp[..., j+1] = pair (j, j+1)
    vp = F.pad(v, (0, 0, 1, 1))  # [B, H+1, W]
    return torch.maximum(torch.maximum(hp[..., :-1], hp[..., 1:]), torch.maximum(vp[:, :-1], vp[:, 1:]))


def _dilate(g: Tensor, radius: int) -> Tensor:
    if radius <= 0:
        return g
    k = 2 * radius + 1
    return F.max_pool2d(g[:, None], kernel_size=k, stride=1, padding=radius)[:, 0]


def _depth_edges(dbar: Tensor, eps: float) -> Tensor:
    """g_depth [B, H, W] in [0, 1]: symmetric relative depth step to the 4-neighbours."""
    def rel(a: Tensor, b: Tensor) -> Tensor:
        return (a - b).abs() / (torch.maximum(a, b).clamp_min(0.0) + eps)

    h = rel(dbar[..., :, :-1], dbar[..., :, 1:])
    v = rel(dbar[..., :-1, :], dbar[..., 1:, :])
    return _neighbour_max(h, v).clamp(0.0, 1.0)


def footprint_purity(dbar: Tensor, covered: Tensor, footprint: float, tol: float) -> Tensor:
    """[B, H, W] share of a pixel's teacher footprint that shows its own surface.

    A patch-token teacher describes pixel u by the patches around it (bilinear between patch
    centres: a tent of radius ``footprint`` pixels). The purity of u is the tent-weighted share of
    the pixels v in that window that are covered and lie on u's surface,
    ``|Dbar(v) - Dbar(u)| <= tol Dbar(u)``; pixels near an occluding contour, thin parts and small
    objects have a low purity in views where they are small, a high one where they fill the footprint.
    """
    p = float(footprint)
    r = int(math.ceil(p)) - 1
    if r <= 0:
        return torch.ones_like(dbar)
    B, H, W = dbar.shape
    off = torch.arange(-r, r + 1, dtype=dbar.dtype, device=dbar.device)
    tent = (1.0 - off.abs() / p).clamp_min(0.0)
    kern = (tent[:, None] * tent[None, :]).reshape(-1)  # [k*k]
    k = 2 * r + 1
    out = torch.empty_like(dbar)
    for b in range(B):  # one view at a time: the unfolded window is [k*k, H*W]
        d = torch.where(covered[b], dbar[b], torch.full_like(dbar[b], -1.0))
        win = F.unfold(d[None, None], kernel_size=k, padding=r)[0]  # [k*k, H*W], padding 0 = not covered
        same = (win > 0) & ((win - d.reshape(1, -1)).abs() <= tol * d.reshape(1, -1).clamp_min(0.0))
        out[b] = (kern[:, None] * same.to(dbar.dtype)).sum(0).reshape(H, W) / kern.sum()
    return out


def _feature_edges(features: Tensor) -> Tensor:
    """g_feat [B, H, W] in [0, 2]: 1 - cosine to the 4-neighbours (max)."""
    inv = 1.0 / torch.linalg.vector_norm(features, dim=-1).clamp_min(1e-12)  # F.normalize's eps

    def cos(a: Tensor, b: Tensor, ia: Tensor, ib: Tensor) -> Tensor:
        return torch.linalg.vecdot(a, b) * ia * ib  # fused dot: no [B, H, W, D] product temporary

    h = 1.0 - cos(features[:, :, :-1], features[:, :, 1:], inv[:, :, :-1], inv[:, :, 1:])
    v = 1.0 - cos(features[:, :-1], features[:, 1:], inv[:, :-1], inv[:, 1:])
    return _neighbour_max(h, v).clamp(0.0, 2.0)


def _as_views(alpha: Tensor, depth_m1: Tensor, depth_m2: Tensor, features: Optional[Tensor],
              valid_mask: Optional[Tensor], region_fraction: Optional[Tensor]) -> Tuple[Optional[Tensor], ...]:
    """The maps of :func:`reliability_weights` as a batch of views (one ``[H, W]`` view gets a batch axis),
    each checked against ``alpha``'s ``[B, H, W]`` (:class:`ShapeError` naming the map otherwise)."""
    if alpha.dim() == 2:
        alpha, depth_m1, depth_m2 = alpha[None], depth_m1[None], depth_m2[None]
        features, valid_mask, region_fraction = (None if t is None else t[None]
                                                 for t in (features, valid_mask, region_fraction))
    if alpha.dim() != 3:
        raise ShapeError(f"reliability_weights: alpha must be [B, H, W] or [H, W], got {list(alpha.shape)}")
    for name, t in (("depth_m1", depth_m1), ("depth_m2", depth_m2), ("region_fraction", region_fraction),
                    ("valid_mask", valid_mask)):
        if t is not None and t.shape != alpha.shape:
            raise ShapeError(f"reliability_weights: {name} must match alpha {list(alpha.shape)}, got {list(t.shape)}")
    if features is not None and (features.dim() != 4 or features.shape[:3] != alpha.shape):
        raise ShapeError(f"reliability_weights: features must be [B, H, W, D] with [B, H, W]={list(alpha.shape)}, "
                         f"got {list(features.shape)}")
    return alpha, depth_m1, depth_m2, features, valid_mask, region_fraction


def _finite_statistics(alpha: Tensor, depth_m1: Tensor, depth_m2: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """A, D1, D2 detached in float32 (float64 kept); :class:`NonFiniteError` naming the map with a NaN / Inf."""
    dtype = torch.float64 if alpha.dtype == torch.float64 else torch.float32
    A, D1, D2 = (t.detach().to(dtype) for t in (alpha, depth_m1, depth_m2))
    # one float64 sum each (finite float32 values cannot overflow it): non-finite only with a NaN/Inf
    if not math.isfinite(sum(float(t.sum(dtype=torch.float64)) for t in (A, D1, D2))):
        for name, t in (("alpha", A), ("depth_m1", D1), ("depth_m2", D2)):
            if not torch.isfinite(t).all():
                raise NonFiniteError(f"reliability_weights: {name} contains NaN/Inf")
    return A, D1, D2


def _edge_strengths(dbar: Tensor, features: Optional[Tensor], cfg: VCDConfig, every: bool) -> Tuple[Tensor, Tensor]:
    """Dilated g_depth and g_feat [B, H, W]: zeros where W_edge does not use them (unless ``every``)."""
    want_depth = every or (cfg.use_edge and cfg.edge_depth)
    want_feat = every or (cfg.use_edge and cfg.edge_features)
    g_depth = _dilate(_depth_edges(dbar, cfg.eps), cfg.edge_radius) if want_depth else torch.zeros_like(dbar)
    if features is None or not want_feat:
        return g_depth, torch.zeros_like(dbar)
    feats = features.detach().to(dbar.dtype)
    if not torch.isfinite(feats).all():
        raise NonFiniteError("reliability_weights: features contain NaN/Inf")
    return g_depth, _dilate(_feature_edges(feats), cfg.edge_radius)


def _edge_term(g_depth: Tensor, g_feat: Tensor, has_features: bool, cfg: VCDConfig) -> Optional[Tensor]:
    """W_edge = exp(-g_depth / s_depth - g_feat / s_feat) over the edge kinds switched on; None when off."""
    if not cfg.use_edge:
        return None
    expo = torch.zeros_like(g_depth)
    if cfg.edge_depth:
        expo = expo + g_depth / cfg.edge_depth_scale
    if cfg.edge_features and has_features:
        expo = expo + g_feat / cfg.edge_feature_scale
    return torch.exp(-expo)


def _segment_term(region_fraction: Tensor, valid: Tensor, dtype: torch.dtype, gamma: float) -> Tensor:
    """W_seg = (frac / the smallest frac of the view's valid pixels) ** -gamma; 0 where a pixel has no region."""
    frac = region_fraction.detach().to(valid.device, dtype).clamp(0.0, 1.0)
    has = frac > 0  # 0: no teacher region (no feature), weight 0
    smallest = torch.where(valid & has, frac, torch.ones_like(frac)).flatten(1).amin(1)[:, None, None]
    return torch.where(has, (frac / smallest).clamp_min(1.0) ** -gamma, torch.zeros_like(frac))


def _normalised_per_view(raw: Tensor, valid: Tensor) -> Tensor:
    """``raw`` divided by its mean over each view's valid pixels (uniform weights where that mean is 0)."""
    vf = valid.to(raw.dtype)
    count = vf.flatten(1).sum(1)
    total = raw.flatten(1).sum(1)
    mean = total / count.clamp_min(1.0)
    degenerate = mean <= torch.finfo(raw.dtype).tiny
    base = torch.where(degenerate[:, None, None], vf, raw)
    mean = torch.where(degenerate, count / count.clamp_min(1.0), mean)
    return base / mean.clamp_min(torch.finfo(raw.dtype).tiny)[:, None, None]


def reliability_weights(
    alpha: Tensor,
    depth_m1: Tensor,
    depth_m2: Tensor,
    features: Optional[Tensor] = None,
    cfg: Optional[VCDConfig] = None,
    valid_mask: Optional[Tensor] = None,
    return_terms: bool = False,
    region_fraction: Optional[Tensor] = None,
) -> Union[Tensor, Tuple[Tensor, Dict[str, Tensor]]]:
    """VCD reliability weights ``w_bar`` (no gradient), normalised to mean 1 per view.

    ``w_bar = max(W_op W_var W_edge W_fp W_seg, min_weight) / mean_valid(...)`` per view (module docstring);
    a term switched off in ``cfg`` is left out of the product.

    Args:
        alpha: [B, H, W] (or [H, W]) accumulated opacity A.
        depth_m1: same shape, D1 = sum_i w_i z_i.
        depth_m2: same shape, D2 = sum_i w_i z_i^2.
        features: optional [B, H, W, D] feature map (e.g. the teacher's) for feature edges.
        cfg: :class:`VCDConfig` (default settings if None).
        valid_mask: optional bool [B, H, W]; pixels outside get weight 0 and do not count
            in the per-view mean.
        return_terms: also return a dict of the individual terms.
        region_fraction: optional [B, H, W] share of the view covered by each pixel's teacher region
            (:func:`rh3dgs.teachers.maps.region_fraction`) for the mask-specificity term W_seg.
    Returns:
        ``w_bar`` [B, H, W] (the input's shape), detached; on every view with a valid pixel
        the mean over valid pixels is 1 (a view whose product is 0 everywhere falls back to
        uniform weights). With ``return_terms``: ``(w_bar, terms)`` where terms has
        ``op``, ``var``, ``edge``, ``footprint``, ``segment`` (the W factors, ones when switched off),
        ``raw`` (the floored product before normalisation), ``weight`` (``w_bar``), ``depth`` (Dbar),
        ``variance`` (Var), ``relvar``, ``edge_depth`` (g_depth) and ``edge_feat`` (g_feat).

    >>> A = torch.tensor([[[1.0, 0.3]]]); D1 = 2.0 * A; D2 = 4.0 * A  # two pixels at depth 2
    >>> reliability_weights(A, D1, D2, cfg=VCDConfig(use_edge=False))  # the thin pixel weighs less
    tensor([[[1.8000, 0.2000]]])
    """
    cfg = cfg or VCDConfig()
    squeeze = alpha.dim() == 2
    alpha, depth_m1, depth_m2, features, valid_mask, region_fraction = _as_views(
        alpha, depth_m1, depth_m2, features, valid_mask, region_fraction)
    with torch.no_grad():
        A, D1, D2 = _finite_statistics(alpha, depth_m1, depth_m2)
        valid = torch.ones_like(A, dtype=torch.bool) if valid_mask is None else valid_mask.to(A.device, torch.bool)
        dbar, var = render_depth_stats(A, D1, D2, cfg.eps)
        relvar = var / (dbar * dbar + cfg.eps)

        mixing = not cfg.mixing_coarse_only or cfg.footprint > 1.0  # the teacher blends a footprint of pixels
        w_op = (A / cfg.opacity_ref).clamp(0.0, 1.0) ** cfg.opacity_power if cfg.use_opacity and mixing else None
        w_var = torch.exp(-relvar / cfg.variance_scale) if cfg.use_variance and mixing else None
        g_depth, g_feat = _edge_strengths(dbar, features, cfg, every=return_terms)
        w_edge = _edge_term(g_depth, g_feat, features is not None, cfg)
        w_fp = (footprint_purity(dbar, valid & (A >= 0.5), cfg.footprint, cfg.footprint_tol) ** cfg.footprint_power
                if cfg.footprint > 1.0 and cfg.footprint_power > 0 else None)
        w_seg = (_segment_term(region_fraction, valid, A.dtype, cfg.segment_power)
                 if region_fraction is not None and cfg.reads_regions else None)

        used = [t for t in (w_op, w_var, w_edge, w_fp, w_seg) if t is not None]  # x * 1 = x exactly: no factor 1
        raw = (functools.reduce(torch.mul, used) if used else torch.ones_like(A)).clamp_min(cfg.min_weight)
        raw = torch.where(valid, raw, torch.zeros_like(raw))
        w_bar = _normalised_per_view(raw, valid)
        if not return_terms:
            return w_bar[0] if squeeze else w_bar
        ones = torch.ones_like(A)
        terms = {"op": w_op, "var": w_var, "edge": w_edge, "footprint": w_fp, "segment": w_seg, "raw": raw,
                 "depth": dbar, "variance": var, "relvar": relvar, "edge_depth": g_depth, "edge_feat": g_feat,
                 "weight": w_bar}
        terms = {k: (ones if t is None else t)[0] if squeeze else (ones if t is None else t) for k, t in terms.items()}
        return terms["weight"], terms


def teacher_footprint(map_size: Tuple[int, int], render_size: Tuple[int, int]) -> float:
    """Pixels of the render each cell of a teacher map describes: ``max(H / h, W / w)`` for a map ``(h, w)`` coarser
    than the render ``(H, W)`` (a patch-token teacher), 0 for a map at (or above) the render's resolution.

    >>> teacher_footprint((16, 16), (128, 128)), teacher_footprint((128, 128), (128, 128))
    (8.0, 0.0)
    """
    (h, w), (H, W) = map_size, render_size
    return max(H / h, W / w) if (h < H or w < W) else 0.0


def pixel_weights(alpha: Tensor, depth_m1: Tensor, depth_m2: Tensor, teacher: Optional[Tensor] = None,
                  use_vcd: bool = True, vcd: Optional[VCDConfig] = None, min_coverage: float = 0.5,
                  footprint: Optional[float] = None, region_fraction: Optional[Tensor] = None) -> Tensor:
    """Per-pixel weights ``[B, H, W]`` (no gradient) of a render against a teacher map.

    A pixel counts when the render covers it (``A >= min_coverage``) and the teacher gives it a
    feature (``|z| > 0.5``; ``teacher`` [B, H, W, D] at the render's resolution, or None = every pixel).
    ``use_vcd``: VCD reliability ``w_bar`` on those pixels (:func:`rh3dgs.method.vcd.reliability_weights`,
    feature edges from ``teacher`` if ``vcd.edge_features``); else 1 on them. ``footprint``: the
    teacher's footprint in pixels (:func:`teacher_footprint`; overrides ``vcd.footprint``) for the footprint-purity
    term and ``vcd.mixing_coarse_only``; the lift and the objective pass it, read off the teacher maps' resolution.
    ``region_fraction``: [B, H, W] share
    of the view covered by each pixel's teacher region, read off the maps as the teacher gives them
    (:func:`rh3dgs.teachers.maps.region_fraction`), for the mask-specificity term.

    The one definition of the pixel weights of the lift, ``distill()`` and ``ns-train rh3dgs``.
    """
    with torch.no_grad():
        valid = alpha >= min_coverage
        if teacher is not None:
            valid = valid & (torch.linalg.vector_norm(teacher, dim=-1) > 0.5)
        if not use_vcd:
            return valid.to(alpha.dtype)
        cfg = vcd or VCDConfig()
        if footprint is not None and footprint != cfg.footprint:
            cfg = replace(cfg, footprint=float(footprint))
        return reliability_weights(alpha, depth_m1, depth_m2, features=teacher, cfg=cfg, valid_mask=valid,
                                   region_fraction=region_fraction)
