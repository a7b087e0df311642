"""Training-free lift: per-Gaussian robust, reliability-weighted spherical Frechet means.

For Gaussian i, over every (view v, pixel u) it contributes to with compositing weight
alpha_i T_i(u) and VCD reliability w_bar_v(u), the lifted feature is

    mu_i = argmin_mu  sum_{v,u} alpha_i T_i(u) w_bar_v(u) rho_delta( d(mu, z_v(u)) )

The algorithm (:func:`lift`):

0. **Order**: the scene is lifted in Z-order (:func:`rh3dgs.gaussians.morton_order`), so the passes' reads
   and writes of per-Gaussian rows (means, sums) that one tile visits share cache lines and pages (the
   benchmark's passes 17-25 % faster than in the scene's own order); the results are returned in the
   scene's order. **Subspace** (teachers with D > ``LiftConfig.subspace``, e.g. CLIP's 512): the maps are seen through
   their top principal directions P [D, k] (z -> P^T z, renormalised); the means below are taken on the
   sphere of that subspace and mapped back, mu <- P mu.
1. **Initial pass**: the normalised weighted Euclidean mean, ``mu_i = normalize(sum w z)``, with per Gaussian
   its total weight and its mean transmittance where it composites (``visibility``).
2. **Validity**: Gaussians with too little weight, or seen only through the surfaces in front of them
   (visibility < ``min_visibility``), get no feature from the views.
3. **IRLS passes** (method "robust": Huber ``delta``; "karcher": delta = inf): each pass accumulates
   sum omega and sum omega Log_mu(z), omega = w min(1, delta / d(mu, z)), and steps
   mu <- Exp_mu(sum omega Log / sum omega), ``iters`` passes (default 1: the one-step estimator) or until
   the 99th percentile of the step angles is below ``tol``.
   A Gaussian's step depends on its own mean only, so one whose step fell below ``tol`` stops there and
   the later passes replay only the contributions of those still moving. Every second pass extrapolates
   each Gaussian's step to the end of its linear convergence (Aitken, :func:`aitken_factor`;
   ``LiftConfig.extrapolate``).
4. **Filling**: Gaussians without a feature take their observed 3D neighbours'
   (:func:`rh3dgs.fill.fill_from_neighbours`).
5. **Decoder**: uncentred weighted PCA of the features (:func:`pca_decoder`): latents and a linear decoder.

Each pass is one call of :meth:`rh3dgs.lift_views.LiftViews.aggregate`, which streams the views (teacher
maps at any resolution, upsampled guided by the render's colours (``LiftConfig.guided``), renders,
VCD pixel weights) and keeps what fits between passes; nothing is
stored per (pixel, Gaussian) pair beyond those caches.

Ablation baselines behind the same call (``LiftConfig.method``): "robust" (ours), "karcher" (delta =
inf, same weights), "euclidean" (weighted Euclidean mean, then normalise: LUDVIG / gradient
back-projection); ``use_vcd=False`` gives uniform pixel weights (no VCD).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional

import torch
from torch import Tensor

from .cameras import Cameras
from .errors import ConfigError
from .fill import fill_from_neighbours
from .gaussians import Gaussians, morton_order
from .lift_views import LiftViews
from .sphere import sphere_exp_
from .teachers.maps import ProjectedMaps, TeacherMaps, map_dim, principal_basis
from .vcd import VCDConfig

__all__ = ["LiftConfig", "LiftResult", "lift", "pca_decoder", "aitken_factor", "fill_from_neighbours"]

@dataclass
class LiftConfig:
    """Settings of :func:`lift`."""

    method: str = "robust"
    """"robust" (Huber-IRLS), "karcher" (delta = inf) or "euclidean" (normalised weighted mean)."""
    use_vcd: bool = True
    """Weight pixels by VCD reliability (False: uniform weights on covered pixels)."""
    vcd: VCDConfig = field(default_factory=VCDConfig.rh3dgs)
    """VCD settings (feature edges use the teacher map of the view)."""
    delta: float = 0.2
    """Huber threshold in radians (~11 degrees): residuals beyond it count linearly. On development draws
    0.35 suited patch-token teachers (their samples are blends, not outliers) and 0.1-0.15 mask teachers
    (whose errors are whole-mask outliers) best; 0.2 is within ~0.5 mIoU of the best for both."""
    iters: int = 1
    """Maximum IRLS passes over all views after the initial Euclidean pass; each costs about one render of
    the views with D channels (a replay of the recorded contributions where they are kept). 1: one Huber-IRLS
    step from the weighted Euclidean mean, the one-step M-estimator (Bickel 1975: from a consistent start,
    one Newton-type step has the iterated estimator's first-order behaviour). On 40 development pairs (seeds
    1000 and 1001, all four teacher presets; paired difference, 95 % interval) one step against three
    extrapolated ones (which end within ~1e-3 rad of the converged robust mean): held-out mIoU +0.02
    [-0.13, +0.17], mBIoU -0.14 [-0.28, +0.01], 3D mIoU +0.51 [+0.25, +0.77] (mask teachers +0.6 to +1.6,
    patch teachers -0.1), for two replays fewer. More passes iterate on towards the robust mean itself
    (``extrapolate``, ``tol``; docs/method.md, "One step")."""
    extrapolate: bool = True
    """Every second IRLS pass, lengthen each Gaussian's step by Aitken's factor 1 / (1 - r), r = |step| /
    |previous step| (its rate of linear convergence, clipped to ``max_rate``; :func:`aitken_factor`). The
    Huber IRLS converges linearly, slowly where a Gaussian's samples disagree (r ~ 0.6 on random maps),
    and the extrapolation jumps to where the geometric series of its steps ends. False: plain IRLS. Acts from
    the second pass on: not with the default one step (``iters`` 1)."""
    max_rate: float = 0.8
    """Largest rate r the extrapolation trusts (a factor of at most 1 / (1 - max_rate) = 5)."""
    tol: float = 5e-3
    """Stop when the ``tol_quantile`` quantile of the per-Gaussian step angles (radians) is below this; a
    Gaussian whose own step is below it stops moving before that (the later passes skip it). 5e-3
    (0.3 degrees) against 1e-3 on the 20 development pairs: held-out mIoU / mBIoU / 3D mIoU within
    0.16 points of each other per pair (means +0.00 / -0.00 / +0.01), the lift 12 % faster on the
    benchmark scene (more Gaussians stop after the second and third passes)."""
    tol_quantile: float = 0.99
    """Quantile of the step angles tested against ``tol`` (1.0 = the largest step). A few
    Gaussians seen by two disagreeing pixels converge slowly under Huber IRLS; they should
    not hold up the whole scene."""
    min_coverage: float = 0.5
    """Pixels with accumulated opacity below this get weight 0 (background / holes)."""
    guided: bool = True
    """Upsample maps coarser than the render by joint bilateral upsampling guided by the render's own
    colours (:func:`rh3dgs.teachers.maps.guided_upsample`) instead of bilinearly (False). A patch-token
    teacher's cell describes its whole footprint; guided, a pixel takes the neighbouring cell whose
    colour it shares, so an object's feature no longer bleeds onto its surroundings. Development draws
    (seed 1000, layouts 0-1, paired): +7.6 to +17.3 mIoU, +11 to +21 mBIoU on the CLIP-like teachers;
    no change for mask teachers (their maps are at the image's resolution)."""
    guide_sigma_color: float = 0.05
    """Colour scale of the guided upsampling (RGB in [0, 1]); 0.05 beat 0.1 by 2 mIoU on the development
    draws of the CLIP-like teachers."""
    min_weight: float = 1e-6
    """Gaussians whose total contribution weight is below this are marked invalid."""
    min_visibility: float = 0.01
    """Gaussians whose mean transmittance where they composite, sum alpha T w_bar / sum alpha w_bar
    over all their (view, pixel) contributions, is below this are marked invalid: the views see them
    only through the surfaces in front (the floor under an object, the far side of a closed surface),
    so every sample they get is the occluder's feature and their lifted feature would be the
    occluder's. 0 keeps every Gaussian with weight >= min_weight."""
    fill: bool = True
    """Give the Gaussians the views do not see (invalid ones) the feature of their observed 3D neighbours
    (:func:`fill_from_neighbours`), marked in ``LiftResult.filled``: the inside and underside of an object
    then answer its query like the rest of it."""
    fill_neighbors: int = 512
    """Observed neighbours a filled Gaussian's feature is taken from (many: colour picks among them)."""
    fill_color_sigma: float = 0.05
    """Colour similarity scale of the fill's bilateral weights (RGB in [0, 1])."""
    fill_visibility_power: float = 2.0
    """An observed neighbour's vote is weighted by its visibility to this power (0: equal votes): one seen mostly
    through the surface in front of it carries some of that surface's feature. Development draws (seed 1000,
    20 pairs): filling's 3D gain +5.14 (power 0) -> +5.28 (0.5) -> +5.34 (1) -> +5.41 (2), of a +5.86 ceiling."""
    fill_radius: Optional[float] = None
    """Neighbours farther than this are not used (None: 10 % of the scene's extent, the 2-98 % box diagonal)."""
    subspace: int = 128
    """Lift in the teacher's principal subspace when its dimension D is larger: every map is projected
    onto the top-``subspace`` uncentred principal directions of its rows
    (:func:`rh3dgs.teachers.maps.principal_basis`), the means are taken on the unit sphere of that
    subspace, and the result is mapped back (``features`` stay [N, D]); the field keeps ``latent_dim``
    principal directions in the end anyway. The passes then cost what they cost at D = ``subspace``.
    Development draws at D = 512 (seed 1000; 14 pairs of 5 layouts x 4 simulated teachers, paired with the
    full-D lift): 128 is +0.09 mIoU on average (worst pair -1.8, strong CLIP-like teacher, layout 1) at
    ~1/3 of the time; 64 is -0.21 on average (worst -4.2: rare small objects drop out of the basis) at
    ~1/6. 0 = the full D."""
    views_per_batch: int = 8
    """Views rendered and aggregated together (memory: views_per_batch * H * W * D floats)."""
    latent_dim: int = 16
    """Dimension d of the latents of the PCA-initialised linear decoder (0 = skip)."""
    tile_size: int = 16
    cache_projections: Optional[bool] = None
    """Keep per-view projections, weights and upsampled maps between passes (None: when they fit in ~2 GB)."""
    compact_cache: Optional[bool] = None
    """When the full cache is off: keep, per view, only the Gaussians that can reach a pixel of
    weight > 0 (with their projection, the pixel weights and, if they fit, the teacher map as given
    or upsampled, whichever is smaller) within ~2 GB; exact (see the module doc). None: when there
    are IRLS passes (method robust / karcher, iters > 0); False: recompute every view in every pass."""
    record_contributions: Optional[bool] = None
    """With the full cache on CPU: record the (pixel, Gaussian) contributions the views' render composites
    (~13 bytes each, up to ~1 GB) and run every pass, the initial one included, over them instead of
    compositing again (the same sums, bit for bit). None: whenever possible; False: composite in every pass."""
    teacher_footprint: Optional[float] = None
    """Pixels of the render each teacher-map cell describes, for VCD's footprint-purity term: None reads
    it off the maps (render size / map size, when the maps are coarser than the render: a patch-token
    teacher), 0 switches the term off."""
    max_batch_gaussians: int = 4_000_000
    """Upper bound on views x Gaussians projected together: views_per_batch is lowered for scenes
    of more than max_batch_gaussians / views_per_batch Gaussians (the CPU projection holds
    ~200 bytes per (view, Gaussian) pair while it runs; see rh3dgs.lift_memory)."""

    def __post_init__(self) -> None:
        if self.method not in ("robust", "karcher", "euclidean"):
            raise ConfigError(f"LiftConfig.method must be 'robust', 'karcher' or 'euclidean', got {self.method!r}")
        if not self.fill_visibility_power >= 0:
            raise ConfigError(f"LiftConfig.fill_visibility_power must be >= 0, got {self.fill_visibility_power}")
        if not 0.0 <= self.min_visibility <= 1.0:
            raise ConfigError(f"LiftConfig.min_visibility must be in [0, 1], got {self.min_visibility}")
        if not self.delta > 0:
            raise ConfigError(f"LiftConfig.delta must be > 0 radians, got {self.delta}")
        if self.subspace < 0:
            raise ConfigError(f"LiftConfig.subspace must be >= 0 (0 = the full teacher dimension), got {self.subspace}")
        if not 0.0 <= self.max_rate < 1.0:
            raise ConfigError(f"LiftConfig.max_rate must be in [0, 1), got {self.max_rate}")
        if self.iters < 0 or self.views_per_batch < 1 or self.max_batch_gaussians < 1:
            raise ConfigError("LiftConfig.iters must be >= 0, views_per_batch and max_batch_gaussians >= 1")


@dataclass
class LiftResult:
    """Output of :func:`lift` (N Gaussians, teacher dimension D, latent dimension d).

    features: [N, D] unit lifted features (zero rows where ``valid`` is False).
    weight:   [N] total compositing weight sum_{v,u} alpha T w_bar received.
    visibility: [N] mean transmittance where the Gaussian composites, weight / sum_{v,u} alpha w_bar.
    valid:    [N] bool, the Gaussian has a feature: observed (weight >= min_weight and visibility >=
              min_visibility) or filled from its neighbours.
    filled:   [N] bool, the feature was filled from observed 3D neighbours (a subset of ``valid``).
    latents:  [N, d] PCA coordinates (None if latent_dim = 0).
    decoder:  [D, d] linear decoder (orthonormal columns): z_hat = normalize(decoder @ f).
    info:     passes, per-pass step-angle quantile, timings.
    """

    features: Tensor
    weight: Tensor
    visibility: Tensor
    valid: Tensor
    latents: Optional[Tensor]
    decoder: Optional[Tensor]
    info: Dict[str, object]
    filled: Optional[Tensor] = None

    def field(self):
        """The lifted :class:`rh3dgs.field.SemanticField` (latents, decoder, valid, filled)."""
        from .field import SemanticField

        return SemanticField(self.latents, self.decoder, self.valid, self.filled)


def aitken_factor(norms: Tensor, prev: Tensor, max_rate: float = 0.8) -> Tensor:
    """[N] Aitken's extrapolation factors of linearly converging steps: 1 / (1 - r), r = norms / prev.

    A fixed-point iteration that converges linearly takes steps s_k ~ r^k s_0 along a line; their sum from
    step k on is s_k / (1 - r), so stepping by s_k / (1 - r) lands where the iteration ends. r is each row's
    rate, the ratio of its step length ``norms`` to the previous one ``prev`` ([N] each); where it is not in
    (0, 1) (a step that grew, or none) the factor is 1, and r is clipped to ``max_rate`` (a factor of at most
    1 / (1 - max_rate)).

    >>> aitken_factor(torch.tensor([0.05, 0.2, 0.0]), torch.tensor([0.1, 0.1, 0.0]))
    tensor([2., 1., 1.])
    """
    r = norms / prev.clamp_min(1e-30)
    return torch.where((r > 0) & (r < 1), 1.0 / (1.0 - r.clamp_max(max_rate)), torch.ones_like(r))


def pca_decoder(features: Tensor, weight: Tensor, d: int, basis: Optional[Tensor] = None) -> tuple:
    """Uncentred weighted PCA: decoder [D, d] = top-d right singular vectors, latents = features @ decoder.

    Uncentred, so that the common direction of CLIP-like features (their cone axis) is
    the first component and the decoder needs no bias (keeps the linear query fast path).
    ``basis`` [D, k] (orthonormal columns): the features are given as their k coordinates in span(basis)
    (the lift's principal subspace); the PCA is then taken on the k x k moments (the same components,
    since every feature lies in that span) and the decoder returned in the full space, [D, d].
    """
    k = features.shape[1]
    d = min(d, k)
    w = weight.clamp_min(0).sqrt()[:, None]
    cov = (features * w).T @ (features * w)  # [k, k]
    evals, evecs = torch.linalg.eigh(cov.double())
    coords = evecs[:, torch.argsort(evals, descending=True)[:d]].float()  # [k, d]
    basis_full = coords if basis is None else basis @ coords  # [D, d]
    # deterministic sign: largest-magnitude entry of each column (in the full space) positive
    sign = torch.sign(basis_full.gather(0, basis_full.abs().argmax(0, keepdim=True)))
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    return basis_full * sign, features @ (coords * sign)


def lift(
    gaussians: Gaussians,
    cameras: Cameras,
    teacher_maps: TeacherMaps,
    cfg: Optional[LiftConfig] = None,
    progress: bool = True,
) -> LiftResult:
    """Lift per-view teacher feature maps into per-Gaussian unit features.

    Args:
        gaussians: the scene (CPU or CUDA; the native op runs where the tensors are).
        cameras:   B views.
        teacher_maps: [B, h, w, D] tensor, a sequence of [h, w, D] maps, or a callable
            ``i -> [h, w, D]`` (streaming); any resolution (bilinear to the image size),
            renormalised to unit length (zero vectors are ignored pixels).
        cfg: :class:`LiftConfig`.
    """
    cfg = cfg or LiftConfig()
    t0 = time.perf_counter()
    B, N = len(cameras), len(gaussians)
    basis = None  # [D, k]: the teacher's principal subspace (cfg.subspace)
    if cfg.subspace and B > 0 and map_dim(teacher_maps) > cfg.subspace:
        basis = principal_basis(teacher_maps, cfg.subspace, views=B).to(gaussians.device)
        teacher_maps = ProjectedMaps(teacher_maps, basis, B)
    order = morton_order(gaussians.means)  # the scene in space-filling-curve order (step 0; undone at the end)
    with torch.no_grad():  # a copy of what the lift reads (no graph for a trained model's parameters; its latents
        gaussians = replace(gaussians, latents=None, extra={})[order]  # and extra fields are not read)
    views = LiftViews(gaussians, cameras, teacher_maps, cfg)  # the view stream and its caches across passes
    weight, acc_v, mass = views.aggregate("init", description="lift: initial mean", progress=progress)
    visibility = weight / mass.clamp_min(1e-30)
    valid = (weight >= cfg.min_weight) & (visibility >= cfg.min_visibility)
    mu = torch.nn.functional.normalize(acc_v, dim=-1) * valid[:, None]
    steps: List[float] = []
    if cfg.method != "euclidean":
        delta = cfg.delta if cfg.method == "robust" else math.inf
        active = valid.clone()  # Gaussians still moving: each one's IRLS depends on its own mean only
        prev: Optional[Tensor] = None  # the previous pass's step lengths, when that pass was not extrapolated
        for it in range(cfg.iters):
            acc_w, acc_v, _ = views.aggregate("irls", mu, delta, f"lift: IRLS pass {it + 1}", progress, active)
            step = acc_v.div_(acc_w.clamp_min(1e-12)[:, None]).mul_(active[:, None])  # in place: N x D floats each
            del acc_v
            norms = step.norm(dim=-1)
            if cfg.extrapolate and prev is not None:  # every second pass: the end of each one's geometric series
                step.mul_(aitken_factor(norms, prev, cfg.max_rate)[:, None])
                prev = None
            else:
                prev = norms
            mu = sphere_exp_(mu, step).mul_(valid[:, None])
            q_step = float(torch.quantile(norms[valid][:1_000_000], cfg.tol_quantile)) if bool(valid.any()) else 0.0
            steps.append(q_step)
            if q_step < cfg.tol:
                break
            active &= norms >= cfg.tol  # converged (step below tol): it stops here, the others go on
    view_info = views.release()  # before the PCA's N x D temporaries
    observed = valid
    filled = torch.zeros_like(valid)
    if cfg.fill and N > 0:
        mu, filled = fill_from_neighbours(gaussians.means, gaussians.base_colors, mu, observed, cfg.fill_neighbors,
                                          cfg.fill_color_sigma, cfg.fill_radius,
                                          confidence=visibility.clamp(0.0, 1.0) ** cfg.fill_visibility_power)
        valid = observed | filled
    latents = decoder = None
    if cfg.latent_dim > 0 and N > 0:  # in the subspace's coordinates when there is one (k x k moments)
        decoder, latents = pca_decoder(mu, weight * observed, cfg.latent_dim, basis)
        latents = latents * valid[:, None]
    inv = torch.empty_like(order)
    inv[order] = torch.arange(N, device=order.device)  # back to the scene's order
    mu, weight, visibility, valid, observed, filled = (t[inv] for t in (mu, weight, visibility, valid, observed, filled))
    latents = None if latents is None else latents[inv]
    if basis is not None:  # back to the teacher's space: unit rows stay unit (orthonormal columns)
        mu = mu @ basis.T
    info = {"method": cfg.method, "use_vcd": cfg.use_vcd, "guided": cfg.guided, "passes": 1 + len(steps),
            "subspace": None if basis is None else int(basis.shape[1]),
            "step_quantile_per_pass": steps, "seconds": time.perf_counter() - t0, "views": B, "gaussians": N,
            "valid": int(valid.sum()), "observed": int(observed.sum()), "filled": int(filled.sum()),
            "hidden": int(((weight >= cfg.min_weight) & ~observed).sum()), **view_info}
    return LiftResult(mu, weight, visibility, valid, latents, decoder, info, filled)
