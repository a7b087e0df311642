"""The Gaussian scene container shared by rendering, I/O and the method.

Parameters are stored *raw*, exactly as 3DGS optimisers and the INRIA PLY layout keep
them (log-scales, logit opacities, un-normalised wxyz quaternions, SH coefficients), so
that a PLY round trip is bit-exact. Activated values are properties.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Dict, Optional

import torch

from .errors import NonFiniteError, ShapeError

#: the degree-0 real spherical harmonic, 1 / (2 sqrt(pi)): colour = C0 sh0 + 0.5
SH_C0 = 0.28209479177387814

__all__ = ["Gaussians", "morton_order"]


@dataclass
class Gaussians:
    """A set of N 3D Gaussians.

    Fields (all on one device, float32 unless stated):
        means:     [N, 3] centres in world coordinates.
        scales:    [N, 3] log standard deviations (``exp`` gives the axis lengths).
        quats:     [N, 4] rotations as (w, x, y, z), not necessarily normalised.
        opacities: [N] logits (``sigmoid`` gives the opacity in (0, 1)).
        sh0:       [N, 1, 3] degree-0 SH coefficients (INRIA ``f_dc_*``).
        shN:       [N, K, 3] higher SH coefficients, K in {0, 3, 8, 15} (INRIA ``f_rest_*``).
        latents:   optional [N, d] semantic latents (rh3dgs ``sem_*`` PLY fields).
        extra:     other per-Gaussian fields read from a PLY, name -> [N] tensor; kept
                   so that writing back loses nothing (e.g. ``nx, ny, nz``).
    """

    means: torch.Tensor
    scales: torch.Tensor
    quats: torch.Tensor
    opacities: torch.Tensor
    sh0: torch.Tensor
    shN: torch.Tensor
    latents: Optional[torch.Tensor] = None
    extra: Dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.means.shape[0] if self.means.dim() == 2 else -1
        expect = {
            "means": (n, 3),
            "scales": (n, 3),
            "quats": (n, 4),
            "opacities": (n,),
            "sh0": (n, 1, 3),
        }
        for name, shape in expect.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape:
                raise ShapeError(f"Gaussians.{name} must have shape {list(shape)} (N={n}), got {list(t.shape)}")
        if self.shN.dim() != 3 or self.shN.shape[0] != n or self.shN.shape[2] != 3:
            raise ShapeError(f"Gaussians.shN must have shape [N, K, 3], got {list(self.shN.shape)}")
        if self.shN.shape[1] not in (0, 3, 8, 15):
            raise ShapeError(f"Gaussians.shN has K={self.shN.shape[1]} coefficients; expected 0, 3, 8 or 15 (SH degree 0-3)")
        if self.latents is not None and (self.latents.dim() != 2 or self.latents.shape[0] != n):
            raise ShapeError(f"Gaussians.latents must have shape [N, d], got {list(self.latents.shape)}")
        for k, v in self.extra.items():
            if v.shape[:1] != (n,):
                raise ShapeError(f"Gaussians.extra[{k!r}] must have N={n} rows, got {list(v.shape)}")

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return self.means.shape[0]

    @property
    def sh_degree(self) -> int:
        return {0: 0, 3: 1, 8: 2, 15: 3}[self.shN.shape[1]]

    @property
    def device(self) -> torch.device:
        return self.means.device

    @property
    def activated_scales(self) -> torch.Tensor:
        return torch.exp(self.scales)

    @property
    def activated_opacities(self) -> torch.Tensor:
        return torch.sigmoid(self.opacities)

    @property
    def normalized_quats(self) -> torch.Tensor:
        return torch.nn.functional.normalize(self.quats, dim=-1)

    @property
    def base_colors(self) -> torch.Tensor:
        """[N, 3] the view-independent colour in [0, 1], ``clamp(SH_C0 sh0 + 0.5, 0, 1)`` (no gradient)."""
        return (SH_C0 * self.sh0[:, 0].detach() + 0.5).clamp(0.0, 1.0)

    @property
    def sh_coeffs(self) -> torch.Tensor:
        """[N, (deg+1)^2, 3] all SH coefficients (gsplat's ``colors`` with ``sh_degree``)."""
        return torch.cat([self.sh0, self.shN], dim=1)

    def _tensor_fields(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                yield f.name, v

    def to(self, device) -> "Gaussians":
        kw = {name: t.to(device) for name, t in self._tensor_fields()}
        kw["extra"] = {k: v.to(device) for k, v in self.extra.items()}
        return replace(self, **kw)

    def __getitem__(self, index) -> "Gaussians":
        """Select Gaussians by a bool mask or an index tensor."""
        kw = {name: t[index] for name, t in self._tensor_fields()}
        kw["extra"] = {k: v[index] for k, v in self.extra.items()}
        return replace(self, **kw)

    def check_finite(self, source: str = "Gaussians") -> None:
        """Raise :class:`NonFiniteError` naming the first field with NaN / Inf."""
        items = list(self._tensor_fields()) + [(f"extra[{k!r}]", v) for k, v in self.extra.items()]
        for name, t in items:
            if t.is_floating_point() and not torch.isfinite(t).all():
                bad = (~torch.isfinite(t)).reshape(t.shape[0], -1).any(dim=1).nonzero()[:, 0]
                raise NonFiniteError(
                    f"{source}: field '{name}' has non-finite values at {bad.numel()} Gaussians "
                    f"(first index {int(bad[0])})"
                )

    @staticmethod
    def from_activated(
        means: torch.Tensor,
        scales: torch.Tensor,
        quats: torch.Tensor,
        opacities: torch.Tensor,
        colors: torch.Tensor,
        latents: Optional[torch.Tensor] = None,
        sh_degree: int = 0,
    ) -> "Gaussians":
        """Build from activated values: scales [N,3] > 0, opacities [N] in (0,1), RGB colors [N,3] in [0,1]."""
        n = means.shape[0]
        k = (sh_degree + 1) ** 2 - 1
        op = opacities.clamp(1e-6, 1 - 1e-6)
        return Gaussians(
            means=means.float().contiguous(),
            scales=torch.log(scales.float()),
            quats=quats.float().contiguous(),
            opacities=torch.log(op / (1 - op)).float(),
            sh0=((colors.float() - 0.5) / SH_C0).reshape(n, 1, 3),
            shN=torch.zeros(n, k, 3, dtype=torch.float32, device=means.device),
            latents=None if latents is None else latents.float(),
        )


def _spread3(x: torch.Tensor) -> torch.Tensor:
    """The low 21 bits of int64 ``x`` moved to every third bit (bit k -> bit 3k)."""
    x = x & 0x1FFFFF
    for shift, mask in ((32, 0x1F00000000FFFF), (16, 0x1F0000FF0000FF), (8, 0x100F00F00F00F00F),
                        (4, 0x10C30C30C30C30C3), (2, 0x1249249249249249)):
        x = (x | (x << shift)) & mask
    return x


def morton_order(points: torch.Tensor, bits: int = 16) -> torch.Tensor:
    """[N] int64 permutation that lists ``points`` [N, 3] along a Z-order (Morton) curve.

    Each point is quantised to a 2^bits grid over the 1-99 % box of the points (those outside clamped to
    its border cells) and ordered by the interleaved bits of its three cell indices (bits <= 21), so points
    near each other in space are near each other in the order. Kernels that visit Gaussians by where they
    project (a tile's depth-sorted list, a pixel's contributors) then read rows of per-Gaussian tables that
    share cache lines and pages: the lift (:func:`rh3dgs.lifting.lift`) runs on its scene in this order.

    >>> pts = torch.tensor([[1., 1, 1], [0., 0, 0], [1., 0, 0], [0., 0, 0.1]])
    >>> morton_order(pts, bits=1)
    tensor([1, 3, 2, 0])
    """
    if not 1 <= bits <= 21:
        raise ValueError(f"morton_order: bits must be in [1, 21], got {bits}")
    n = points.shape[0]
    if n == 0:
        return torch.zeros(0, dtype=torch.long, device=points.device)
    p = points.detach().float().nan_to_num()
    qs = torch.tensor([0.01, 0.99], device=p.device)
    lo, hi = torch.quantile(p[:: max(1, n // 1_000_000)], qs, dim=0)  # quantile takes at most 16M values
    cells = ((p - lo) / (hi - lo).clamp_min(1e-12) * (1 << bits)).clamp_(0, (1 << bits) - 1).long()
    code = _spread3(cells[:, 0]) | (_spread3(cells[:, 1]) << 1) | (_spread3(cells[:, 2]) << 2)
    return torch.argsort(code, stable=True)
