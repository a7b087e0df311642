"""Settings of the training-free lift (:func:`rh3dgs.lifting.lift`): one dataclass, read by every part of it.

``rh3dgs lift``'s options are this dataclass's fields (tyro); ``configs/lift-*.yaml`` are presets of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..errors import ConfigError
from ..method.vcd import VCDConfig

__all__ = ["LiftConfig"]


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
    ~200 bytes per (view, Gaussian) pair while it runs; see rh3dgs.lifting.preflight)."""

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

