"""A simulated CLIP-like teacher: per-view feature maps with the failures of real dense CLIP.

For a labelled dataset (a synthetic scene written by :func:`rh3dgs.data.synthetic.write_dataset`,
or any folder with ``masks/``, ``depth/`` and ``classes.txt`` in that layout) this writes a
*precomputed* teacher: one L2-normalised ``D``-dimensional feature map per view at patch
resolution, plus "text embeddings" of every class name and of LERF's canonical negatives.
Because the ground truth is exact, any lifting / distillation method can be scored against
the clean prototypes, and each corruption can be switched on alone to measure what a module
(VCD, VFM's Huber loss, LIC) buys against it.

Corruptions and the failure of real CLIP each one models
--------------------------------------------------------
Prototypes in a cone (``cone_cos``)
    CLIP image/text embeddings are not spread over the sphere: they occupy a narrow cone
    around a common direction (the "modality gap" / anisotropy of CLIP), so unrelated
    concepts still have cosine ~0.6-0.8 and small angular errors flip argmax decisions.
    Class prototypes are ``sqrt(cone_cos) c + sqrt(1 - cone_cos) t_k`` with ``c`` the cone
    centre and ``t_k`` random unit tangents, so the mean inter-class cosine is ``cone_cos``
    (pairs vary around it by ~``(1 - cone_cos) / sqrt(D)``, as real class names do).
Canonical negatives near the cone centre (``negative_cos``)
    LERF's relevancy compares a query with "object", "things", "stuff", "texture": generic
    words whose embeddings sit near the centre of CLIP's cone and are moderately similar
    to everything. They are drawn at cosine ``negative_cos`` to the centre.
Background prototype
    Pixels that see no surface (sky, void, black background) still get a CLIP feature;
    it is another direction in the cone, not a zero vector.
Patch resolution + area mixing (``patch_size``, ``bleed``, ``context_sigma``)
    Dense CLIP features come from ViT patch tokens (or crops), i.e. one feature per
    ``patch_size`` x ``patch_size`` block that describes *everything* in the block. Each
    patch feature is the area-weighted (spherically normalised) mix of the features of
    its pixels (``bleed = 1``); ``bleed = 0`` gives the majority class of the patch
    instead (an ideal, boundary-snapping teacher). Consumers upsample the grid
    bilinearly to image resolution (:func:`upsample_feature_map`), so features bleed
    across object boundaries over about one patch - exactly where and how much real
    patch-based CLIP features bleed. ``context_sigma`` (patches) additionally blurs the
    patch grid with a Gaussian: the global context that self-attention / multi-scale
    crops mix into every token.
Occlusion contamination (``occlusion_contamination``, ``occlusion_band_px``, ``depth_edge_rel``)
    Next to an occluding contour, pixels of the *occluded* (far) surface are described by
    CLIP as the occluder: the occluder dominates the patch / crop, and its semantics
    leak onto whatever lies just behind it. (The near side keeps its identity: the
    occluder is the salient object.) From the depth maps, a pixel is on the far side of
    a depth edge when a pixel within ``occlusion_band_px`` pixels is nearer by more than
    ``depth_edge_rel`` (relative); background (depth 0) counts as infinitely far. Its
    feature becomes ``normalize((1 - w) own + w occluder)`` with
    ``w = occlusion_contamination * (1 - (dist - 1) / band)`` (``dist`` the Euclidean
    pixel distance to the nearest near-side edge pixel, which also supplies the
    occluder's feature). This is the "mixed depth" failure that VCD's W_var / W_edge
    terms target.
View failures (``view_failure_rate``, ``view_failure_strength``)
    CLIP is not view-consistent: from some viewpoints an object is confidently called
    something else (a mug seen from above is "a bowl"). Per view, each class present is,
    with probability ``view_failure_rate``, rendered with a *confuser* class's
    prototype (uniform over the other classes; the floor class takes part too) mixed in
    with weight ``view_failure_strength`` (1 = full replacement). These are whole-object,
    consistent-within-the-view errors that pixel-level robust losses cannot see but the
    multi-view (Frechet-mean) aggregation should out-vote. With ``view_failure_mode="azimuth"``
    the failures are correlated between views instead, as real ones are (an object looks like
    something else from one side): each class has one arc of camera azimuth, of width
    ``view_failure_rate`` x 360 degrees at a random centre, and one confuser; every view whose
    camera azimuth (around the vertical axis, ``view_azimuths``) lies in the arc shows the class with
    the confuser's prototype. Nearby views then fail together, which a per-view vote cannot out-vote
    as easily.
Heavy-tailed angular noise (``noise_deg``, ``noise_dof``, ``outlier_fraction``)
    Real patch features scatter around the concept direction with a heavy tail (texture,
    lighting, ViT "register" artefacts): every patch feature is rotated by an angle
    ``noise_deg * |t|`` (``t`` Student-t with ``noise_dof`` degrees of freedom; ``inf``
    gives a half-normal) towards a uniformly random tangent direction, clipped at 180
    degrees, and a fraction ``outlier_fraction`` of patches is replaced by uniformly
    random unit vectors (the high-norm "artefact tokens" of large ViTs). This is what a
    Huber (VFM) loss is robust to and a squared loss is not.
Text jitter (``text_jitter_deg``)
    Text and image embeddings of the same concept are not identical. With
    ``text_jitter_deg > 0`` each class's text embedding is its prototype rotated by that
    angle in a random tangent direction (default 0: text = image prototype).

Order inside a view: view failures (which prototype each class shows) -> per-pixel
features with occlusion contamination -> patch pooling (bleed, context blur) ->
normalise -> angular noise -> outliers.

Determinism: everything is a function of ``seed``, the config and the inputs. Random
streams are separate per purpose and per view (numpy ``SeedSequence([seed, purpose,
view])``), so switching one corruption on or off does not change the others' draws, and a
view's features do not depend on which other views are simulated. Prototypes are drawn
sequentially (centre, background, negatives, class 0, 1, ...), so class ``k``'s prototype
does not depend on the number of classes.

Output layout (``simulate_teacher``)::

    <dataset>/features/<stem>.npy              float16 [h, w, D], unit rows, h = ceil(H / patch_size)
    <dataset>/features/text_embeddings.npz     float32 [D] per key: every class name + the negatives
    <dataset>/features/teacher_sim.json        config, layout, prototype statistics, failure log

``teacher_sim.json`` is written last: its presence means the set is complete. Every file is
written atomically.
"""
from __future__ import annotations

import dataclasses
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..errors import ConfigError, InputFileError, ShapeError
from ..query import CANONICAL_NEGATIVES  # the negatives every query compares with: their embeddings are written too
from ..ranges import Range, check_fields
from .labelled import BACKGROUND  # mask value "no surface" (in memory, negative values are background too)

__all__ = [
    "TeacherSimConfig",
    "Prototypes",
    "TeacherSimOutput",
    "CANONICAL_NEGATIVES",
    "make_prototypes",
    "simulate_feature_maps",
    "simulate_teacher",
    "upsample_feature_map",
    "azimuth_arcs",
    "in_arc",
]

# random-stream purposes (second entry of the SeedSequence)
_S_PROTO, _S_FAIL, _S_NOISE, _S_OUTLIER, _S_TEXT, _S_ARC = 0, 1, 2, 3, 4, 5


@dataclass
class TeacherSimConfig:
    """Settings of the simulated teacher. See the module docstring for what each models.

    The defaults are a realistic, moderately hard teacher; :meth:`clean` switches every
    corruption off (features = prototypes, majority class per patch).
    """

    dim: Annotated[int, Range(ge=3)] = 64
    """Feature dimension D."""
    cone_cos: Annotated[float, Range(ge=0, lt=1)] = 0.7
    """Mean cosine between two class prototypes (CLIP-like cone), in (-1/(K-1), 1)."""
    negative_cos: Annotated[float, Range(ge=0, le=1)] = 0.93
    """Cosine of the canonical negatives ("object", ...) to the cone centre."""
    patch_size: Annotated[int, Range(ge=1)] = 8
    """Pixels per feature-map cell along each axis (features are at patch resolution)."""
    bleed: Annotated[float, Range(ge=0, le=1)] = 1.0
    """Area mixing inside a patch: 1 = area-weighted mix of all pixels, 0 = majority class."""
    context_sigma: Annotated[float, Range(ge=0)] = 0.0
    """Extra Gaussian blur of the patch grid, std in patches (0 = off)."""
    occlusion_contamination: Annotated[float, Range(ge=0, le=1)] = 0.5
    """Weight of the occluder's feature on the far side of a depth edge, at distance 1 px."""
    occlusion_band_px: Annotated[int, Range(ge=0)] = 4
    """Width (pixels) of the contaminated band behind an occluding contour; falls off linearly."""
    depth_edge_rel: Annotated[float, Range(ge=0)] = 0.05
    """Relative depth jump that makes a depth edge (z_far > z_near * (1 + depth_edge_rel))."""
    view_failure_rate: Annotated[float, Range(ge=0, le=1)] = 0.05
    """Probability, per (view, class present), that the class shows a confuser's prototype."""
    view_failure_strength: Annotated[float, Range(ge=0, le=1)] = 1.0
    """Weight of the confuser prototype in a failed view (1 = full replacement)."""
    view_failure_mode: str = "independent"
    """"independent": each (view, class) fails alone; "azimuth": each class fails in every view whose camera azimuth
    lies in one arc of ``view_failure_rate`` x 360 degrees (needs the views' azimuths, ``view_azimuths``)."""
    noise_deg: Annotated[float, Range(ge=0)] = 6.0
    """Scale of the per-patch angular noise in degrees (0 = off)."""
    noise_dof: Annotated[float, Range(gt=0, finite=False)] = 3.0
    """Student-t degrees of freedom of the noise angle (inf = half-normal)."""
    outlier_fraction: Annotated[float, Range(ge=0, le=1)] = 0.01
    """Fraction of patches replaced by uniformly random unit vectors."""
    text_jitter_deg: Annotated[float, Range(ge=0, le=90)] = 0.0
    """Angle between a class's text embedding and its image prototype (0 = identical)."""
    seed: Annotated[int, Range(ge=0)] = 0
    """Seed of every random draw."""

    def __post_init__(self) -> None:
        check_fields(self)  # every numeric field against its declared Range (rh3dgs.ranges)
        for name in ("dim", "patch_size", "occlusion_band_px", "seed"):
            if int(getattr(self, name)) != getattr(self, name):
                raise ConfigError(f"TeacherSimConfig.{name}={getattr(self, name)!r}: must be an integer")
        if self.view_failure_mode not in ("independent", "azimuth"):
            raise ConfigError(f"TeacherSimConfig.view_failure_mode={self.view_failure_mode!r}: must be 'independent' "
                              "or 'azimuth'")
        self.dim, self.patch_size, self.occlusion_band_px, self.seed = (
            int(self.dim), int(self.patch_size), int(self.occlusion_band_px), int(self.seed))

    @classmethod
    def clean(cls, **overrides) -> "TeacherSimConfig":
        """A teacher without corruptions (majority class per patch, no noise); ``overrides`` win."""
        base = dict(bleed=0.0, context_sigma=0.0, occlusion_contamination=0.0, view_failure_rate=0.0,
                    noise_deg=0.0, outlier_fraction=0.0, text_jitter_deg=0.0)
        base.update(overrides)
        return cls(**base)


@dataclass
class Prototypes:
    """The simulated embedding directions (float64 numpy, unit rows).

    classes: [K, D] image prototype of each class (index = class id).
    background: [D] feature of pixels that see no surface.
    negatives: {phrase: [D]} canonical negatives.
    center: [D] the cone centre.
    text: [K, D] text embedding of each class (= ``classes`` unless ``text_jitter_deg`` > 0).
    """

    classes: np.ndarray
    background: np.ndarray
    negatives: Dict[str, np.ndarray]
    center: np.ndarray
    text: np.ndarray


@dataclass
class TeacherSimOutput:
    """What :func:`simulate_teacher` wrote."""

    features_dir: Path
    feature_files: List[Path]
    text_embeddings: Path
    config: Path


# ------------------------------------------------------------------------------ helpers
def _rng(cfg: TeacherSimConfig, purpose: int, view: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([cfg.seed, purpose, int(view)]))


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(n, 1e-300)


def _random_tangent(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    """Uniformly random unit vector(s) orthogonal to the unit vector(s) ``x`` [..., D]."""
    g = rng.standard_normal(x.shape)
    g = g - np.sum(g * x, axis=-1, keepdims=True) * x
    return _unit(g)


def _rotate(x: np.ndarray, t: np.ndarray, angle) -> np.ndarray:
    """Rotate unit ``x`` by ``angle`` (radians) towards unit tangent ``t``."""
    angle = np.asarray(angle, dtype=np.float64)[..., None] if np.ndim(angle) else float(angle)
    return _unit(np.cos(angle) * x + np.sin(angle) * t)


def make_prototypes(num_classes: int, cfg: Optional[TeacherSimConfig] = None) -> Prototypes:
    """Class prototypes in a cone of mean pairwise cosine ``cfg.cone_cos``, background, negatives.

    Drawn sequentially from one stream (centre, background, negatives in
    :data:`CANONICAL_NEGATIVES` order, then classes 0..K-1), so the first K prototypes do
    not depend on ``num_classes``.
    """
    cfg = cfg or TeacherSimConfig()
    if int(num_classes) != num_classes or num_classes < 1:
        raise ConfigError(f"make_prototypes: num_classes must be an integer >= 1, got {num_classes!r}")
    rng = _rng(cfg, _S_PROTO)
    D = cfg.dim
    center = _unit(rng.standard_normal(D))
    a = math.sqrt(cfg.cone_cos)  # cos(prototype, centre); two independent tangents give <p_i, p_j> ~ a^2

    def in_cone(cos_c: float) -> np.ndarray:
        t = _random_tangent(rng, center)
        return _unit(cos_c * center + math.sqrt(max(0.0, 1.0 - cos_c * cos_c)) * t)

    background = in_cone(a)
    negatives = {name: in_cone(cfg.negative_cos) for name in CANONICAL_NEGATIVES}
    classes = np.stack([in_cone(a) for _ in range(int(num_classes))])
    if cfg.text_jitter_deg > 0:
        trng = _rng(cfg, _S_TEXT)
        text = np.stack([_rotate(p, _random_tangent(trng, p), math.radians(cfg.text_jitter_deg)) for p in classes])
    else:
        text = classes.copy()
    return Prototypes(classes=classes, background=background, negatives=negatives, center=center, text=text)


def azimuth_arcs(seed: int, purpose: int, num_classes: int, rate: float) -> Tuple[np.ndarray, np.ndarray, float]:
    """Per class the centre of its failure arc (radians), its confuser offset in 1..K-1, and the arc's half-width
    ``rate * pi``: the view-correlated failures of both simulated teachers (``*failure_mode="azimuth"``)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(purpose), 0]))
    centres = rng.random(num_classes) * 2 * math.pi
    offsets = rng.integers(1, max(num_classes, 2), size=num_classes)
    return centres, offsets, float(rate) * math.pi


def in_arc(azimuth: float, centre: float, half_width: float) -> bool:
    """Whether ``azimuth`` lies within ``half_width`` of ``centre`` on the circle (radians)."""
    return abs((azimuth - centre + math.pi) % (2 * math.pi) - math.pi) <= half_width


def _failure_table(present: np.ndarray, protos: Prototypes, cfg: TeacherSimConfig, view: int,
                   azimuth: Optional[float] = None) -> Tuple[np.ndarray, Dict[int, int]]:
    """Per-view feature of each class (rows 0..K-1) and background (row K); failure log {class: confuser}."""
    K = len(protos.classes)
    table = np.concatenate([protos.classes, protos.background[None]], 0).copy()
    failures: Dict[int, int] = {}
    if cfg.view_failure_rate <= 0 or K < 2:
        return table, failures
    s = cfg.view_failure_strength
    if cfg.view_failure_mode == "azimuth":
        centres, offset, half = azimuth_arcs(cfg.seed, _S_ARC, K, cfg.view_failure_rate)
        fails = [bool(present[k]) and in_arc(float(azimuth), centres[k], half) for k in range(K)]
    else:
        rng = _rng(cfg, _S_FAIL, view)
        u = rng.random(K)  # drawn for every class, present or not: streams do not depend on visibility
        offset = rng.integers(1, K, size=K)
        fails = [bool(present[k]) and u[k] < cfg.view_failure_rate for k in range(K)]
    for k in range(K):
        if fails[k]:
            conf = int((k + offset[k]) % K)
            failures[k] = conf
            table[k] = _unit((1.0 - s) * protos.classes[k] + s * protos.classes[conf])
    return table, failures


def _occlusion_weights(lab: np.ndarray, depth: np.ndarray, background: int, cfg: TeacherSimConfig
                       ) -> Tuple[np.ndarray, np.ndarray]:
    """Per-pixel (occluder label, contamination weight) on the far side of depth edges.

    ``background`` is the label of pixels without a surface (treated as infinitely far).
    """
    H, W = lab.shape
    occ = lab.copy()
    w = np.zeros((H, W), dtype=np.float64)
    k, c = cfg.occlusion_band_px, cfg.occlusion_contamination
    if k < 1 or c <= 0:
        return occ, w
    from scipy.ndimage import distance_transform_edt

    z = np.where((lab == background) | ~(depth > 0) | ~np.isfinite(depth), np.inf, depth.astype(np.float64))
    zp = np.pad(z, 1, mode="edge")
    thr = 1.0 + cfg.depth_edge_rel
    near = np.zeros((H, W), dtype=bool)
    finite = np.isfinite(z)
    for dy, dx in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        nb = zp[1 + dy:1 + dy + H, 1 + dx:1 + dx + W]
        near |= finite & (nb > z * thr)  # a neighbour is farther: this pixel is an occluding contour
    if not near.any():
        return occ, w
    dist, (iy, ix) = distance_transform_edt(~near, return_indices=True)
    z_occ = z[iy, ix]
    far = (dist > 0) & (dist <= k) & (z > z_occ * thr)
    w[far] = c * np.clip(1.0 - (dist[far] - 1.0) / k, 0.0, 1.0)
    occ[far] = lab[iy, ix][far]
    return occ, w


def _simulate_view(lab: np.ndarray, depth: Optional[np.ndarray], protos: Prototypes, cfg: TeacherSimConfig,
                   view: int, azimuth: Optional[float] = None) -> Tuple[np.ndarray, Dict[int, int]]:
    """One view: ``lab`` [H, W] int in 0..K (K = background) -> features [h, w, D] float64."""
    H, W = lab.shape
    K = len(protos.classes)
    K1 = K + 1
    present = np.bincount(lab.ravel(), minlength=K1)[:K] > 0
    table, failures = _failure_table(present, protos, cfg, view, azimuth)

    # per-pixel feature = normalize((1 - w) T[lab] + w T[occ]), kept as weights on <= 2 table rows
    if depth is not None and cfg.occlusion_contamination > 0 and cfg.occlusion_band_px > 0:
        occ, w = _occlusion_weights(lab, depth, K, cfg)
    else:
        occ, w = lab, np.zeros(lab.shape)
    G = table @ table.T
    a, b = 1.0 - w, w
    norm = np.sqrt(np.maximum(a * a + b * b + 2 * a * b * G[lab, occ], 1e-300))
    a, b = a / norm, b / norm

    # patch pooling
    p = cfg.patch_size
    h, wp = -(-H // p), -(-W // p)
    P = h * wp
    ys, xs = np.divmod(np.arange(H * W), W)
    pid = (ys // p) * wp + (xs // p)
    lab_f, occ_f, a_f, b_f = lab.ravel(), occ.ravel(), a.ravel(), b.ravel()
    size = P * K1

    def pooled(sel: Optional[np.ndarray]) -> np.ndarray:
        if sel is None:
            i1, i2, wa, wb = pid * K1 + lab_f, pid * K1 + occ_f, a_f, b_f
        else:
            i1, i2, wa, wb = pid[sel] * K1 + lab_f[sel], pid[sel] * K1 + occ_f[sel], a_f[sel], b_f[sel]
        s = np.bincount(i1, weights=wa, minlength=size) + np.bincount(i2, weights=wb, minlength=size)
        return s.reshape(P, K1)

    hist = np.bincount(pid * K1 + lab_f, minlength=size).reshape(P, K1)
    weights = np.zeros((P, K1))
    if cfg.bleed > 0:
        weights += cfg.bleed * pooled(None) / hist.sum(1, keepdims=True)
    if cfg.bleed < 1:
        mode = hist.argmax(1)  # ties -> lowest label
        sel = lab_f == mode[pid]
        weights += (1.0 - cfg.bleed) * pooled(sel) / hist[np.arange(P), mode][:, None]
    weights = weights.reshape(h, wp, K1)
    if cfg.context_sigma > 0:
        from scipy.ndimage import gaussian_filter

        weights = gaussian_filter(weights, sigma=(cfg.context_sigma, cfg.context_sigma, 0), mode="nearest")
    feat = _unit(weights @ table)  # [h, w, D]

    if cfg.noise_deg > 0:
        rng = _rng(cfg, _S_NOISE, view)
        t = _random_tangent(rng, feat)
        mag = rng.standard_normal((h, wp)) if math.isinf(cfg.noise_dof) else rng.standard_t(cfg.noise_dof, (h, wp))
        ang = np.minimum(math.radians(cfg.noise_deg) * np.abs(mag), math.pi)
        feat = _rotate(feat, t, ang)
    if cfg.outlier_fraction > 0:
        rng = _rng(cfg, _S_OUTLIER, view)
        hit = rng.random((h, wp)) < cfg.outlier_fraction
        rnd = _unit(rng.standard_normal(feat.shape))
        feat = np.where(hit[..., None], rnd, feat)
    return feat, failures


def _check_azimuths(view_azimuths: Optional[Sequence[float]], views: int, needed: bool, where: str) -> List[Optional[float]]:
    """The per-view azimuths as a list (None entries when not given); an error when the failure mode needs them."""
    if view_azimuths is None:
        if needed:
            raise ConfigError(f"{where}: failure mode 'azimuth' needs view_azimuths (each view's camera azimuth)")
        return [None] * views
    if len(view_azimuths) != views:
        raise ShapeError(f"{where}: {len(view_azimuths)} view_azimuths for {views} views")
    return [float(a) for a in view_azimuths]


def _labels(mask: np.ndarray, num_classes: int, where: str) -> np.ndarray:
    """Class mask (255 or negative = background) -> labels 0..K with K = background."""
    m = np.asarray(mask).astype(np.int64)
    bg = (m == BACKGROUND) | (m < 0)
    bad = ~bg & (m >= num_classes)
    if bad.any():
        raise ShapeError(f"{where}: mask value {int(m[bad][0])} is not a class id (num_classes={num_classes}, "
                         f"background = {BACKGROUND} or negative)")
    return np.where(bg, num_classes, m)


# --------------------------------------------------------------------------------- API
def simulate_feature_maps(masks: torch.Tensor, depths: Optional[torch.Tensor] = None,
                          cfg: Optional[TeacherSimConfig] = None, num_classes: Optional[int] = None,
                          view_ids: Optional[Sequence[int]] = None, return_failures: bool = False,
                          view_azimuths: Optional[Sequence[float]] = None):
    """Simulated teacher features for a batch of views, in memory.

    Args:
        masks: [B, H, W] integer class ids, 255 (or any negative value) = background.
        depths: [B, H, W] depth (0 / non-finite = background); needed only for occlusion
            contamination (``None`` switches it off).
        cfg: simulator settings (default :class:`TeacherSimConfig`).
        num_classes: K; default ``max class id + 1``. Prototypes do not depend on it.
        view_ids: per-view ids of the random streams (default ``0..B-1``); view ``i`` of
            :func:`simulate_teacher` uses id ``i`` (sorted mask file order).
        return_failures: also return, per view, ``{class id: confuser class id}``.
        view_azimuths: per-view camera azimuth around the vertical axis (radians), needed by
            ``view_failure_mode="azimuth"`` (e.g. :func:`rh3dgs.data.synthetic.camera_azimuths`).

    Returns:
        features [B, h, w, D] float32 unit vectors, h = ceil(H / patch_size), on the device
        of ``masks`` (and the failure log if ``return_failures``).
    """
    cfg = cfg or TeacherSimConfig()
    if not isinstance(masks, torch.Tensor) or masks.ndim != 3 or masks.is_floating_point():
        raise ShapeError(f"simulate_feature_maps: masks must be an integer tensor [B, H, W], got "
                         f"{type(masks).__name__} {list(getattr(masks, 'shape', []))}")
    B, H, W = masks.shape
    if depths is not None and tuple(depths.shape) != (B, H, W):
        raise ShapeError(f"simulate_feature_maps: depths must be [B, H, W] = {[B, H, W]}, got {list(depths.shape)}")
    m_np = masks.detach().cpu().numpy().astype(np.int64)
    if num_classes is None:
        fg = m_np[(m_np != BACKGROUND) & (m_np >= 0)]
        num_classes = int(fg.max()) + 1 if fg.size else 1
    view_ids = list(range(B)) if view_ids is None else [int(v) for v in view_ids]
    if len(view_ids) != B:
        raise ShapeError(f"simulate_feature_maps: {len(view_ids)} view_ids for {B} views")
    azimuths = _check_azimuths(view_azimuths, B, cfg.view_failure_mode == "azimuth", "simulate_feature_maps")
    protos = make_prototypes(num_classes, cfg)
    d_np = None if depths is None else depths.detach().cpu().double().numpy()
    feats, fails = [], []
    for i in range(B):
        lab = _labels(m_np[i], num_classes, f"simulate_feature_maps: masks[{i}]")
        f, fl = _simulate_view(lab, None if d_np is None else d_np[i], protos, cfg, view_ids[i], azimuths[i])
        feats.append(f)
        fails.append(fl)
    out = torch.from_numpy(np.stack(feats).astype(np.float32)).to(masks.device)
    return (out, fails) if return_failures else out


def upsample_feature_map(features: torch.Tensor, height: int, width: int, patch_size: int) -> torch.Tensor:
    """Patch-resolution features [..., h, w, D] -> [..., height, width, D], bilinear, renormalised.

    The grid is upsampled by ``patch_size`` (``align_corners=False``: cell centres at
    ``(i + 0.5) * patch_size``), cropped to ``height`` x ``width`` (when the image size is
    not a multiple of the patch) and L2-normalised per pixel.
    """
    if features.ndim < 3:
        raise ShapeError(f"upsample_feature_map: features must be [..., h, w, D], got {list(features.shape)}")
    lead = features.shape[:-3]
    h, w, D = features.shape[-3:]
    if h * patch_size < height or w * patch_size < width:
        raise ShapeError(f"upsample_feature_map: a {h}x{w} grid of {patch_size}-px patches does not cover "
                         f"{height}x{width}")
    x = features.reshape(-1, h, w, D).permute(0, 3, 1, 2).float()
    x = torch.nn.functional.interpolate(x, size=(h * patch_size, w * patch_size), mode="bilinear",
                                        align_corners=False)[:, :, :height, :width]
    x = torch.nn.functional.normalize(x.permute(0, 2, 3, 1), dim=-1)
    return x.reshape(*lead, height, width, D)


def _npy_bytes(arr: np.ndarray) -> bytes:
    bio = io.BytesIO()
    np.save(bio, arr, allow_pickle=False)
    return bio.getvalue()


def simulate_teacher(dataset_dir, cfg: Optional[TeacherSimConfig] = None, progress: bool = True) -> TeacherSimOutput:
    """Write a precomputed simulated teacher into ``<dataset_dir>/features/`` (layout: module docstring).

    Reads ``classes.txt``, ``masks/*.png`` (class index, 255 = background) and, when
    occlusion contamination is on, ``depth/<stem>.npy`` (0 = background). Views are
    processed in sorted mask-file order; view ``i`` uses random stream ``i``.
    """
    from ..io.atomic import atomic_save_bytes, atomic_save_json, atomic_save_npz
    from ..progress import track
    from .labelled import LabelledDataset

    cfg = cfg or TeacherSimConfig()
    if cfg.view_failure_mode != "independent":
        raise ConfigError("simulate_teacher: view_failure_mode='azimuth' needs the cameras' azimuths: use "
                          "simulate_feature_maps(..., view_azimuths=...)")
    root = Path(dataset_dir)
    classes_txt = root / "classes.txt"
    dataset = LabelledDataset.open(root)
    class_names = dataset.classes
    clash = sorted(set(class_names) & set(CANONICAL_NEGATIVES))
    if clash:
        raise InputFileError(classes_txt, f"class names {clash} collide with the canonical negatives "
                                          f"{list(CANONICAL_NEGATIVES)} in text_embeddings.npz")
    mask_files = dataset.mask_files
    need_depth = cfg.occlusion_contamination > 0 and cfg.occlusion_band_px > 0
    K = len(class_names)
    protos = make_prototypes(K, cfg)
    out_dir = root / "features"
    files: List[Path] = []
    failure_log: Dict[str, Dict[str, str]] = {}
    shape_hw = None
    for i, mf in enumerate(track(mask_files, description="simulating teacher features", disable=not progress)):
        mask = dataset.mask(mf.stem)
        depth = None
        if need_depth:
            depth = dataset.depth(mf.stem, mask.shape, why="needed for occlusion contamination; set "
                                                            "occlusion_contamination=0 to simulate without depth")
        try:
            lab = _labels(mask, K, str(mf))
        except ShapeError as exc:
            raise InputFileError(mf, str(exc)) from exc
        feat, fails = _simulate_view(lab, depth, protos, cfg, i)
        shape_hw = list(mask.shape)
        path = out_dir / f"{mf.stem}.npy"
        atomic_save_bytes(path, _npy_bytes(feat.astype(np.float16)))
        files.append(path)
        if fails:
            failure_log[mf.stem] = {class_names[k]: class_names[c] for k, c in sorted(fails.items())}

    emb = {name: protos.text[k].astype(np.float32) for k, name in enumerate(class_names)}
    emb.update({name: v.astype(np.float32) for name, v in protos.negatives.items()})
    text_path = atomic_save_npz(out_dir / "text_embeddings.npz", emb)

    C = protos.classes
    pair = C @ C.T
    iu = np.triu_indices(K, 1)
    meta = {
        "format": "rh3dgs precomputed teacher (simulated)",
        "config": dataclasses.asdict(cfg),
        "classes": class_names,
        "canonical_negatives": list(CANONICAL_NEGATIVES),
        "feature_layout": {
            "files": "features/<image stem>.npy", "dtype": "float16", "shape": "[h, w, D]",
            "dim": cfg.dim, "patch_size": cfg.patch_size, "image_hw": shape_hw,
            "grid_hw": None if shape_hw is None else [-(-shape_hw[0] // cfg.patch_size), -(-shape_hw[1] // cfg.patch_size)],
            "normalised": True,
            "upsampling": "bilinear, align_corners=False, to (h*patch, w*patch), crop to (H, W), renormalise",
        },
        "prototype_stats": {
            "mean_pairwise_cos": float(pair[iu].mean()) if K > 1 else None,
            "min_pairwise_cos": float(pair[iu].min()) if K > 1 else None,
            "max_pairwise_cos": float(pair[iu].max()) if K > 1 else None,
            "background_cos_to_classes": [float(v) for v in C @ protos.background],
        },
        "view_failures": failure_log,
        "views": [f.stem for f in mask_files],
    }
    cfg_path = atomic_save_json(out_dir / "teacher_sim.json", meta)
    return TeacherSimOutput(features_dir=out_dir, feature_files=files, text_embeddings=text_path, config=cfg_path)
