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
    """Settings of lift(); why each default is what it is: docs/method.md, section 5 ("Choices")."""

    method: str = "robust"
    """Mean on the sphere: Huber IRLS, Karcher or Euclidean."""
    use_vcd: bool = True
    """VCD reliability weights (off: uniform on covered pixels)."""
    vcd: VCDConfig = field(default_factory=VCDConfig.rh3dgs)
    """VCD's terms (feature edges use the view's teacher map)."""
    delta: float = 0.2
    """Huber threshold (rad); e.g. 0.35 for patch-token teachers."""
    iters: int = 1
    """IRLS steps from the Euclidean mean; 3 for clean teachers."""
    extrapolate: bool = True
    """Aitken-extrapolate every second IRLS step (iters >= 2)."""
    max_rate: float = 0.8
    """Largest rate the extrapolation trusts, in [0, 1)."""
    tol: float = 5e-3
    """Stop when the tol_quantile step angle (rad) is below this."""
    tol_quantile: float = 0.99
    """Quantile of the step angles held against tol (1: max)."""
    min_coverage: float = 0.5
    """Pixels with less accumulated opacity get weight 0."""
    guided: bool = True
    """Upsample coarse maps guided by the render (off: bilinear)."""
    guide_sigma_color: float = 0.05
    """Colour scale of the guided upsampling (RGB in [0, 1])."""
    min_weight: float = 1e-6
    """Gaussians with less total weight are invalid."""
    min_visibility: float = 0.01
    """Gaussians below this mean transmittance are invalid."""
    fill: bool = True
    """Fill unseen Gaussians from their observed 3D neighbours."""
    fill_neighbors: int = 512
    """Observed neighbours a filled Gaussian votes over."""
    fill_color_sigma: float = 0.05
    """Colour scale of the fill's weights (RGB in [0, 1])."""
    fill_visibility_power: float = 2.0
    """Votes weighted by visibility ** this, >= 0 (0: equal)."""
    fill_radius: Optional[float] = None
    """Neighbour radius (None: 10 % of the scene's extent)."""
    subspace: int = 128
    """Lift in the teacher's top principal directions (0: all)."""
    views_per_batch: int = 8
    """Views rendered together (memory grows with it)."""
    latent_dim: int = 16
    """Latent size d of the linear decoder (0: no decoder)."""
    tile_size: int = 16
    """Rasterizer tile side in pixels."""
    cache_projections: Optional[bool] = None
    """Cache views' projections across passes (None: if < 2 GB)."""
    compact_cache: Optional[bool] = None
    """Else cache each view's useful Gaussians (None: iters > 0)."""
    record_contributions: Optional[bool] = None
    """CPU: replay recorded contributions (None: when they fit)."""
    teacher_footprint: Optional[float] = None
    """Pixels per teacher-map cell (None: from the maps; 0: off)."""
    max_batch_gaussians: int = 4_000_000
    """At most this many views x Gaussians projected at once."""

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

