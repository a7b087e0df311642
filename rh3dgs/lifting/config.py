"""Settings of the training-free lift (:func:`rh3dgs.lifting.lift`): one dataclass, read by every part of it.

``rh3dgs lift``'s options are this dataclass's fields (tyro); ``configs/lift-*.yaml`` are presets of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Optional

from ..errors import ConfigError
from ..ranges import Range, check_fields
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
    delta: Annotated[float, Range(gt=0)] = 0.2
    """Huber threshold (rad); e.g. 0.35 for patch-token teachers."""
    iters: Annotated[int, Range(ge=0)] = 1
    """IRLS steps from the Euclidean mean; 3 for clean teachers."""
    extrapolate: bool = True
    """Aitken-extrapolate every second IRLS step (iters >= 2)."""
    max_rate: Annotated[float, Range(ge=0, lt=1)] = 0.8
    """Largest rate the extrapolation trusts, in [0, 1)."""
    tol: Annotated[float, Range(ge=0)] = 5e-3
    """Stop when the tol_quantile step angle (rad) is below this."""
    tol_quantile: Annotated[float, Range(gt=0, le=1)] = 0.99
    """Quantile of the step angles held against tol (1: max)."""
    min_coverage: Annotated[float, Range(ge=0, le=1)] = 0.5
    """Pixels with less accumulated opacity get weight 0."""
    guided: bool = True
    """Upsample coarse maps guided by the render (off: bilinear)."""
    guide_sigma_color: Annotated[float, Range(gt=0)] = 0.05
    """Colour scale of the guided upsampling (RGB in [0, 1])."""
    min_weight: Annotated[float, Range(ge=0)] = 1e-6
    """Gaussians with less total weight are invalid."""
    min_visibility: Annotated[float, Range(ge=0, le=1)] = 0.01
    """Gaussians below this mean transmittance are invalid."""
    fill: bool = True
    """Fill unseen Gaussians from their observed 3D neighbours."""
    fill_neighbors: Annotated[int, Range(ge=1)] = 512
    """Observed neighbours a filled Gaussian votes over."""
    fill_color_sigma: Annotated[float, Range(gt=0)] = 0.05
    """Colour scale of the fill's weights (RGB in [0, 1])."""
    fill_visibility_power: Annotated[float, Range(ge=0)] = 2.0
    """Votes weighted by visibility ** this, >= 0 (0: equal)."""
    fill_radius: Optional[Annotated[float, Range(gt=0)]] = None
    """Neighbour radius (None: 10 % of the scene's extent)."""
    subspace: Annotated[int, Range(ge=0)] = 128
    """Lift in the teacher's top principal directions (0: all)."""
    views_per_batch: Annotated[int, Range(ge=1)] = 8
    """Views rendered together (memory grows with it)."""
    latent_dim: Annotated[int, Range(ge=0)] = 16
    """Latent size d of the linear decoder (0: no decoder)."""
    tile_size: Annotated[int, Range(ge=1)] = 16
    """Rasterizer tile side in pixels."""
    cache_projections: Optional[bool] = None
    """Cache views' projections across passes (None: if < 2 GB)."""
    compact_cache: Optional[bool] = None
    """Else cache each view's useful Gaussians (None: iters > 0)."""
    record_contributions: Optional[bool] = None
    """CPU: replay recorded contributions (None: when they fit)."""
    teacher_footprint: Optional[Annotated[float, Range(ge=0)]] = None
    """Pixels per teacher-map cell (None: from the maps; 0: off)."""
    max_batch_gaussians: Annotated[int, Range(ge=1)] = 4_000_000
    """At most this many views x Gaussians projected at once."""

    def __post_init__(self) -> None:
        if self.method not in ("robust", "karcher", "euclidean"):
            raise ConfigError(f"LiftConfig.method must be 'robust', 'karcher' or 'euclidean', got {self.method!r}")
        check_fields(self)  # every numeric field against its declared Range (rh3dgs.ranges)

