"""A simulated SAM + CLIP teacher: one embedding per mask, with the failures of real mask pipelines.

LangSplat, OpenGaussian, Gaussian Grouping and most 2025-26 methods do not use dense CLIP
patch tokens: they segment each image with SAM and give every mask the CLIP embedding of its
crop. The features are then *sharp* (constant per mask, edges at the mask boundaries, full
image resolution) but wrong in other ways, which this module models on a labelled dataset
(per-pixel instance and class ids, as :func:`rh3dgs.data.synthetic.write_dataset` writes them):

Masks (``min_mask_px``, ``edge_jitter_px``)
    Each connected visible region of an instance is one mask (an object cut in two by an
    occluder gives two masks). SAM boundaries do not follow the true contour exactly: the label
    map is resampled through a smooth random displacement field of amplitude ``edge_jitter_px``
    pixels before the masks are taken. Regions smaller than ``min_mask_px`` get no mask.
Merged masks (``merge_rate``)
    SAM's automatic mode often returns an object together with what it touches (a mug with the
    table, a ball with the bowl it lies in). With probability ``merge_rate`` a mask is merged
    with one of the masks adjacent to it in the image; the union gets ONE embedding, the
    area-weighted spherical mix of its members' prototypes (CLIP of the union crop).
Split masks (``split_rate``)
    ... or returns an object in parts: with probability ``split_rate`` a mask is cut in two by a
    random line through its centroid, and each part gets its own embedding draw (noise, failure).
Missed masks (``miss_rate``)
    Pixels no mask covers get no feature (zero vectors, "ignore" for every consumer), as in
    LangSplat's preprocessing.
Per-mask recognition failures (``failure_rate``, ``failure_strength``)
    CLIP on a crop misnames the object now and then (a mug seen from above is "a bowl"): the
    mask's embedding becomes a confuser class's prototype (mixed with ``failure_strength``).
View-correlated failures (``failure_mode="azimuth"``)
    ... or, instead of independent draws per mask, per class one arc of camera azimuth of width
    ``failure_rate`` x 360 degrees and one confuser: every mask of the class in a view whose camera
    azimuth lies in the arc is misrecognised (an object seen from one side looks like something else;
    :func:`rh3dgs.data.teacher_sim.azimuth_arcs`).
Multi-level masks (``level_probs``)
    SAM answers at three granularities (subpart / part, whole object, group). With ``level_probs =
    (p_part, p_object, p_group)`` each view takes one level: at the part level every mask of at least
    2 x ``min_mask_px`` is cut by 1-2 random lines through its centroid (up to 4 parts), each part's
    embedding is ``normalize(0.7 own + 0.3 cone centre)`` (a part's crop looks generic) and is
    misrecognised at twice ``failure_rate``; at the group level every mask is also merged with an adjacent
    one with probability 0.6 (besides ``merge_rate``); the object level is the default behaviour.
Crop context (``context``)
    A crop is a bounding box, not the mask: the embedding is ``normalize((1 - c) own + c ctx)``
    with ``ctx`` the area-weighted mix of every pixel's prototype in the mask's bounding box
    enlarged by 25 % (what surrounds the object leaks into its embedding).
Angular noise (``noise_deg``)
    Each mask's embedding is rotated by ``noise_deg * |t|`` (t standard normal) towards a random
    tangent direction.

Pixels without a surface form one background mask (background prototype), subject to the same
failures. Prototypes (classes, background, canonical negatives, text) are those of
:func:`rh3dgs.data.teacher_sim.make_prototypes` with the same ``dim`` / ``cone_cos`` /
``negative_cos``, so both simulated teachers answer the same text queries.

Determinism: everything is a function of ``seed``, the config and the inputs; random streams
are separate per purpose and per view (``SeedSequence([seed, 100 + purpose, view])``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..errors import ConfigError, ShapeError
from ..ranges import Range, check_fields
from .teacher_sim import (BACKGROUND, Prototypes, TeacherSimConfig, _check_azimuths, _random_tangent, _rotate, _unit,
                          azimuth_arcs, in_arc, make_prototypes)

__all__ = ["MaskTeacherSimConfig", "simulate_mask_feature_maps"]

_S_JITTER, _S_MERGE, _S_SPLIT, _S_MISS, _S_FAIL, _S_NOISE, _S_LEVEL, _S_PART, _S_GROUP, _S_ARC = range(100, 110)
_PART_MIX, _GROUP_MERGE = 0.3, 0.6  # a part's share of the cone centre; the group level's extra merge rate


@dataclass
class MaskTeacherSimConfig:
    """Settings of the simulated SAM + CLIP teacher (see the module docstring)."""

    dim: int = 64
    """Feature dimension D."""
    cone_cos: float = 0.7
    """Mean cosine between two class prototypes (as :class:`TeacherSimConfig`)."""
    negative_cos: float = 0.93
    """Cosine of the canonical negatives to the cone centre."""
    merge_rate: Annotated[float, Range(ge=0, le=1)] = 0.1
    """Probability that a mask is merged with an adjacent one."""
    split_rate: Annotated[float, Range(ge=0, le=1)] = 0.1
    """Probability that a mask is split in two."""
    miss_rate: Annotated[float, Range(ge=0, le=1)] = 0.05
    """Probability that a mask is missed (its pixels get no feature)."""
    failure_rate: Annotated[float, Range(ge=0, le=1)] = 0.08
    """Probability that a mask's embedding is a confuser class's."""
    failure_strength: Annotated[float, Range(ge=0, le=1)] = 1.0
    """Weight of the confuser prototype in a failed mask (1 = full replacement)."""
    context: Annotated[float, Range(ge=0, le=1)] = 0.15
    """Weight of the crop's context in a mask's embedding."""
    noise_deg: Annotated[float, Range(ge=0)] = 5.0
    """Scale of the per-mask angular noise (degrees)."""
    edge_jitter_px: Annotated[float, Range(ge=0)] = 1.0
    """Amplitude of the smooth displacement of mask boundaries (pixels)."""
    min_mask_px: Annotated[int, Range(ge=1)] = 4
    """Regions smaller than this get no mask."""
    failure_mode: str = "independent"
    """"independent": each mask is misrecognised alone; "azimuth": per class one arc of camera azimuth of width
    ``failure_rate`` x 360 degrees in which its masks are (needs the views' azimuths)."""
    level_probs: Optional[Tuple[float, float, float]] = None
    """Per-view probabilities of the part, object and group levels (None: the object level everywhere)."""
    seed: Annotated[int, Range(ge=0)] = 0

    def __post_init__(self) -> None:
        check_fields(self)  # every numeric field against its declared Range (rh3dgs.ranges)
        if int(self.seed) != self.seed:
            raise ConfigError(f"MaskTeacherSimConfig.seed={self.seed!r}: must be an integer")
        if self.failure_mode not in ("independent", "azimuth"):
            raise ConfigError(f"MaskTeacherSimConfig.failure_mode={self.failure_mode!r}: must be 'independent' or 'azimuth'")
        if self.level_probs is not None:
            p = [float(v) for v in self.level_probs]
            if len(p) != 3 or min(p) < 0 or abs(sum(p) - 1.0) > 1e-6:
                raise ConfigError(f"MaskTeacherSimConfig.level_probs={self.level_probs!r}: three probabilities "
                                  "(part, object, group) that sum to 1")
            self.level_probs = tuple(p)
        self.prototype_config()  # validates dim / cone_cos / negative_cos

    def prototype_config(self) -> TeacherSimConfig:
        return TeacherSimConfig(dim=self.dim, cone_cos=self.cone_cos, negative_cos=self.negative_cos, seed=self.seed)


def _rng(cfg: MaskTeacherSimConfig, purpose: int, view: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([cfg.seed, purpose, int(view)]))


def _jitter_labels(lab: np.ndarray, amp: float, rng: np.random.Generator) -> np.ndarray:
    """Resample a label map through a smooth random displacement field (nearest neighbour)."""
    if amp <= 0:
        return lab
    from scipy.ndimage import gaussian_filter, map_coordinates

    H, W = lab.shape
    d = rng.standard_normal((2, H, W))
    d = np.stack([gaussian_filter(x, sigma=3.0, mode="wrap") for x in d])
    d *= amp / max(float(d.std()), 1e-12)
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float64)
    coords = np.stack([np.clip(yy + d[0], 0, H - 1), np.clip(xx + d[1], 0, W - 1)])
    return map_coordinates(lab, coords, order=0, mode="nearest").astype(lab.dtype)


def _components(inst: np.ndarray, min_px: int) -> Tuple[np.ndarray, List[int]]:
    """Connected regions of each instance (background included) -> (mask id map, -1 = none; instance per mask)."""
    from scipy.ndimage import label as cc_label

    out = np.full(inst.shape, -1, dtype=np.int64)
    owner: List[int] = []
    for k in np.unique(inst):
        comp, n = cc_label(inst == k)
        for c in range(1, n + 1):
            sel = comp == c
            if sel.sum() >= min_px:
                out[sel] = len(owner)
                owner.append(int(k))
    return out, owner


def _adjacency(masks: np.ndarray, n: int) -> List[set]:
    adj: List[set] = [set() for _ in range(n)]
    for a, b in ((masks[:, :-1], masks[:, 1:]), (masks[:-1, :], masks[1:, :])):
        sel = (a != b) & (a >= 0) & (b >= 0)
        for i, j in set(zip(a[sel].tolist(), b[sel].tolist())):
            adj[i].add(j)
            adj[j].add(i)
    return adj


def _view_level(cfg: MaskTeacherSimConfig, view: int) -> str:
    """The view's mask granularity: "part", "object" or "group" (``level_probs``; "object" without)."""
    if cfg.level_probs is None:
        return "object"
    u = float(_rng(cfg, _S_LEVEL, view).random())
    p_part, p_obj, _ = cfg.level_probs
    return "part" if u < p_part else ("object" if u < p_part + p_obj else "group")


def _merged_groups(masks: np.ndarray, n: int, cfg: MaskTeacherSimConfig, view: int, level: str) -> List[List[int]]:
    """Masks merged with an adjacent one (``merge_rate``; at the group level also with probability 0.6): union-find
    over adjacent masks, draws for every mask in order. Returns the groups of mask ids, by their root."""
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    adj = _adjacency(masks, n)
    rng = _rng(cfg, _S_MERGE, view)
    u, pick = rng.random(n), rng.random(n)
    extra = _rng(cfg, _S_GROUP, view).random(n) < _GROUP_MERGE if level == "group" else np.zeros(n, dtype=bool)
    for i in range(n):
        nb = sorted(adj[i])
        if nb and (u[i] < cfg.merge_rate or extra[i]):
            parent[find(i)] = find(nb[int(pick[i] * len(nb))])
    groups: Dict[int, List[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return [groups[root] for root in sorted(groups)]


def _cut(reg: np.ndarray, angle: float) -> Tuple[np.ndarray, np.ndarray]:
    """A region cut in two by the line through its centroid at ``angle``."""
    ys, xs = np.nonzero(reg)
    side = (ys - ys.mean()) * math.cos(angle) - (xs - xs.mean()) * math.sin(angle) > 0
    a = np.zeros_like(reg)
    a[ys[side], xs[side]] = True
    return a, reg & ~a


def _split_regions(regions: List[Tuple[np.ndarray, List[int]]], cfg: MaskTeacherSimConfig, view: int, level: str
                   ) -> List[Tuple[np.ndarray, List[int], bool]]:
    """SAM's split masks (``split_rate``), then at the part level 1-2 more cuts of every large enough region.
    Returns (region, member masks, is a part)."""
    rng = _rng(cfg, _S_SPLIT, view)
    u, ang = rng.random(len(regions)), rng.random(len(regions)) * math.pi
    out: List[Tuple[np.ndarray, List[int], bool]] = []
    for r, (reg, mem) in enumerate(regions):
        if u[r] < cfg.split_rate and reg.sum() >= 2 * cfg.min_mask_px:
            out += [(p, mem, False) for p in _cut(reg, ang[r])]
        else:
            out.append((reg, mem, False))
    if level != "part":
        return out
    prng = _rng(cfg, _S_PART, view)
    parts: List[Tuple[np.ndarray, List[int], bool]] = []
    for reg, mem, _ in out:
        cuts, angles = int(prng.integers(1, 3)), prng.random(2) * math.pi
        pieces = [reg]
        for c in range(cuts):
            pieces = [q for p in pieces for q in (_cut(p, angles[c]) if p.sum() >= 2 * cfg.min_mask_px else (p,))]
        parts += [(p, mem, True) for p in pieces if p.any()]
    return parts


def _simulate_mask_view(inst: np.ndarray, inst_class: Dict[int, int], protos: Prototypes,
                        cfg: MaskTeacherSimConfig, view: int, azimuth: Optional[float] = None) -> np.ndarray:
    """One view: instance map [H, W] (BACKGROUND = no surface) -> features [H, W, D] float64."""
    H, W = inst.shape
    K = len(protos.classes)
    D = protos.classes.shape[1]
    table = np.concatenate([protos.classes, protos.background[None]], 0)  # class K = background

    def proto_of(k: int) -> np.ndarray:
        return table[K if k == BACKGROUND else inst_class[k]]

    level = _view_level(cfg, view)
    lab = _jitter_labels(inst, cfg.edge_jitter_px, _rng(cfg, _S_JITTER, view))
    masks, owner = _components(lab, cfg.min_mask_px)
    groups = _merged_groups(masks, len(owner), cfg, view, level)
    pix_proto = np.zeros((H, W, D))  # per-pixel prototype (for the crop context)
    for k in np.unique(lab):
        pix_proto[lab == k] = proto_of(int(k))
    final = _split_regions([(np.isin(masks, g), g) for g in groups], cfg, view, level)
    m = len(final)
    miss = _rng(cfg, _S_MISS, view).random(m) < cfg.miss_rate
    rng = _rng(cfg, _S_FAIL, view)
    fail_u, fail_off = rng.random(m), rng.integers(1, max(K, 2), size=m)
    arcs = azimuth_arcs(cfg.seed, _S_ARC, K, cfg.failure_rate) if cfg.failure_mode == "azimuth" else None
    rng_noise = _rng(cfg, _S_NOISE, view)
    out = np.zeros((H, W, D))
    for r, (reg, mem, part) in enumerate(final):
        if miss[r] or not reg.any():
            continue
        own = _unit(pix_proto[reg].sum(0))  # area-weighted mix of the members' prototypes
        if part:
            own = _unit((1.0 - _PART_MIX) * own + _PART_MIX * protos.center)
        k0 = inst_class.get(owner[mem[0]], 0) if owner[mem[0]] != BACKGROUND else 0
        if arcs is not None:
            failed, conf = in_arc(float(azimuth), arcs[0][k0], arcs[2]), int((k0 + arcs[1][k0]) % K)
        else:
            failed, conf = fail_u[r] < cfg.failure_rate * (2.0 if part else 1.0), int((k0 + fail_off[r]) % K)
        if failed and K >= 2:
            own = _unit((1.0 - cfg.failure_strength) * own + cfg.failure_strength * protos.classes[conf])
        if cfg.context > 0:
            ys, xs = np.nonzero(reg)
            y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
            py, px = int(math.ceil(0.125 * (y1 - y0))), int(math.ceil(0.125 * (x1 - x0)))
            crop = pix_proto[max(0, y0 - py):y1 + py, max(0, x0 - px):x1 + px]
            ctx = _unit(crop.reshape(-1, D).sum(0))
            own = _unit((1.0 - cfg.context) * own + cfg.context * ctx)
        if cfg.noise_deg > 0:
            t = _random_tangent(rng_noise, own)
            own = _rotate(own, t, min(math.radians(cfg.noise_deg) * abs(float(rng_noise.standard_normal())), math.pi))
        out[reg] = own
    return out


def simulate_mask_feature_maps(instances: torch.Tensor, classes: torch.Tensor, cfg: Optional[MaskTeacherSimConfig] = None,
                               num_classes: Optional[int] = None, view_ids: Optional[Sequence[int]] = None,
                               view_azimuths: Optional[Sequence[float]] = None) -> torch.Tensor:
    """Simulated SAM + CLIP features for a batch of views, in memory.

    Args:
        instances: [B, H, W] integer instance ids, 255 = background.
        classes: [B, H, W] integer class ids (255 = background); an instance's class is the most
            frequent class under it.
        cfg: :class:`MaskTeacherSimConfig`; num_classes: K (default max class id + 1);
        view_ids: per-view ids of the random streams (default 0..B-1);
        view_azimuths: per-view camera azimuths (radians), needed by ``failure_mode="azimuth"``.

    Returns:
        [B, H, W, D] float32: unit vectors, zero rows where no mask covers the pixel.
    """
    cfg = cfg or MaskTeacherSimConfig()
    if instances.ndim != 3 or classes.shape != instances.shape or instances.is_floating_point():
        raise ShapeError(f"simulate_mask_feature_maps: instances and classes must be integer [B, H, W] tensors of one "
                         f"shape, got {list(instances.shape)} and {list(classes.shape)}")
    inst_np = instances.detach().cpu().numpy().astype(np.int64)
    cls_np = classes.detach().cpu().numpy().astype(np.int64)
    if num_classes is None:
        fg = cls_np[cls_np != BACKGROUND]
        num_classes = int(fg.max()) + 1 if fg.size else 1
    B = inst_np.shape[0]
    view_ids = list(range(B)) if view_ids is None else [int(v) for v in view_ids]
    # instance -> class over the whole batch (majority vote)
    inst_class: Dict[int, int] = {}
    fg = (inst_np != BACKGROUND) & (cls_np != BACKGROUND)
    for k in np.unique(inst_np[fg]):
        inst_class[int(k)] = int(np.bincount(cls_np[fg & (inst_np == k)]).argmax())
    azimuths = _check_azimuths(view_azimuths, B, cfg.failure_mode == "azimuth", "simulate_mask_feature_maps")
    protos = make_prototypes(int(num_classes), cfg.prototype_config())
    feats = [_simulate_mask_view(inst_np[i], inst_class, protos, cfg, view_ids[i], azimuths[i]) for i in range(B)]
    return torch.from_numpy(np.stack(feats).astype(np.float32)).to(instances.device)
