"""Procedural labelled scenes built directly as 3D Gaussians (exact ground truth).

A scene is a floor plus labelled objects of several primitive shapes (sphere, box,
cylinder, torus, an open bowl with an object inside, a thin pole), each surface
sampled into flat Gaussians (disks tangent to the surface) with per-Gaussian class and
instance labels. Objects are placed so that some occlude others from many viewpoints.
Cameras orbit the scene at several heights. Everything is seeded and deterministic.

Layouts (:attr:`SceneConfig.layout`, by index into :data:`LAYOUTS` or by name, :func:`layout_names`):
fixed object sets whose positions the seed jitters (:data:`LAYOUTS`: the table-top scenes, touching
objects of one colour, thin structures) and procedural ones that the seed draws from an object bank
(:data:`PROCEDURAL_LAYOUTS`: cluttered, sparse and textured scenes; the families of
:mod:`rh3dgs.eval.families` define them).

:func:`make_scene` returns a :class:`SyntheticScene`; :func:`write_dataset` renders it
into a nerfstudio dataset folder (images, transforms.json, the Gaussians as PLY, an
initial point cloud, ground-truth depth and class masks).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from ..cameras import Cameras
from ..gaussians import Gaussians
from ..ranges import Range, check_fields

__all__ = ["SceneConfig", "SyntheticScene", "LAYOUTS", "PROCEDURAL_LAYOUTS", "PALETTE", "layout_names", "camera_azimuths", "make_scene",
           "orbit_cameras", "all_cameras", "write_dataset", "rotmat_to_quat"]


@dataclass
class SceneConfig:
    """Settings of :func:`make_scene`."""

    seed: int = 0
    """RNG seed (object jitter, sampling, textures)."""
    layout: Union[int, str] = 0
    """Object set: 0-4 (0: the original table-top scene) or a layout's name (the procedural ones have names only)."""
    gaussians_per_unit_area: Annotated[float, Range(gt=0)] = 6000.0
    """Surface sampling density (Gaussians per m^2)."""
    floor_size: Annotated[float, Range(gt=0)] = 3.0
    """Side length of the square floor (m)."""
    texture_noise: Annotated[float, Range(ge=0)] = 0.04
    """Std of the per-Gaussian colour jitter (texture)."""
    num_views: Annotated[int, Range(ge=1)] = 12
    """Cameras on the orbit."""
    image_size: Annotated[int, Range(ge=8)] = 128
    """Square image side in pixels."""
    orbit_radius: Annotated[float, Range(gt=0)] = 3.2
    """Radius of the camera orbit (m); cameras look at the scene centre."""
    orbit_heights: Annotated[Tuple[float, ...], Range(min_len=1)] = (1.2, 2.0)
    """Heights of the camera rings (m)."""
    fov_deg: Annotated[float, Range(gt=0, lt=180)] = 50.0
    """Horizontal field of view (degrees)."""
    heldout_views: Annotated[int, Range(ge=0)] = 0
    """Extra held-out cameras at other heights, half-way between the training ones."""
    heldout_heights: Annotated[Tuple[float, ...], Range(min_len=1)] = (1.0, 1.7)
    """Heights of the held-out cameras (m)."""
    heldout_radius: Annotated[Optional[float], Range(gt=0)] = None
    """Orbit radius of the held-out cameras (m; None: the training orbit's); smaller: closer views than any training view."""
    gaussian_style: str = "surfel"
    """surfel: flat opaque disks on the surface; blob: isotropic half-opaque Gaussians that mix along rays."""

    def __post_init__(self) -> None:
        check_fields(self)  # every numeric field against its declared Range (rh3dgs.ranges)
        if isinstance(self.layout, str) and self.layout not in layout_names():
            from ..errors import ConfigError

            raise ConfigError(f"SceneConfig.layout: unknown layout {self.layout!r}; known: {layout_names()}")
        if self.gaussian_style not in ("surfel", "blob"):
            from ..errors import ConfigError

            raise ConfigError(f"SceneConfig.gaussian_style must be 'surfel' or 'blob', got {self.gaussian_style!r}")
        if not isinstance(self.layout, str) and not 0 <= int(self.layout) < len(LAYOUTS):
            from ..errors import ConfigError

            raise ConfigError(f"SceneConfig.layout must be in 0..{len(LAYOUTS) - 1} or a name of {layout_names()}, "
                              f"got {self.layout!r}")


@dataclass
class SyntheticScene:
    """A labelled Gaussian scene.

    gaussians: the Gaussians (raw parameters, SH degree 0).
    class_ids: [N] long, index into ``class_names`` (0 = floor).
    instance_ids: [N] long, 0 = floor, 1.. = objects.
    class_names: names usable as text queries ("red ball", ...).
    cameras: the orbit cameras.
    """

    gaussians: Gaussians
    class_ids: torch.Tensor
    instance_ids: torch.Tensor
    class_names: List[str]
    cameras: Cameras
    config: SceneConfig = field(default_factory=SceneConfig)
    heldout_cameras: Optional[Cameras] = None


# ----------------------------------------------------------------------------- geometry
def rotmat_to_quat(R: torch.Tensor) -> torch.Tensor:
    """[..., 3, 3] rotation matrices -> [..., 4] unit quaternions (w, x, y, z)."""
    m = R
    t = m[..., 0, 0] + m[..., 1, 1] + m[..., 2, 2]
    cands = torch.stack(
        [
            torch.stack([1 + t, m[..., 2, 1] - m[..., 1, 2], m[..., 0, 2] - m[..., 2, 0], m[..., 1, 0] - m[..., 0, 1]], -1),
            torch.stack([m[..., 2, 1] - m[..., 1, 2], 1 + m[..., 0, 0] - m[..., 1, 1] - m[..., 2, 2], m[..., 0, 1] + m[..., 1, 0], m[..., 0, 2] + m[..., 2, 0]], -1),
            torch.stack([m[..., 0, 2] - m[..., 2, 0], m[..., 0, 1] + m[..., 1, 0], 1 - m[..., 0, 0] + m[..., 1, 1] - m[..., 2, 2], m[..., 1, 2] + m[..., 2, 1]], -1),
            torch.stack([m[..., 1, 0] - m[..., 0, 1], m[..., 0, 2] + m[..., 2, 0], m[..., 1, 2] + m[..., 2, 1], 1 - m[..., 0, 0] - m[..., 1, 1] + m[..., 2, 2]], -1),
        ],
        -2,
    )  # [..., 4, 4]; pick the numerically largest candidate
    diag = torch.stack([1 + t, 1 + m[..., 0, 0] - m[..., 1, 1] - m[..., 2, 2], 1 - m[..., 0, 0] + m[..., 1, 1] - m[..., 2, 2],
                        1 - m[..., 0, 0] - m[..., 1, 1] + m[..., 2, 2]], -1)
    best = diag.argmax(-1)
    q = torch.gather(cands, -2, best[..., None, None].expand(*best.shape, 1, 4)).squeeze(-2)
    q = torch.nn.functional.normalize(q, dim=-1)
    return q * torch.where(q[..., :1] < 0, -1.0, 1.0)


def _tangent_frames(normals: torch.Tensor) -> torch.Tensor:
    """[N,3] unit normals -> [N,3,3] rotations whose third column is the normal."""
    a = torch.where(normals[:, 2:3].abs() < 0.9, torch.tensor([0.0, 0.0, 1.0]), torch.tensor([1.0, 0.0, 0.0]))
    t1 = torch.nn.functional.normalize(torch.cross(a, normals, dim=-1), dim=-1)
    t2 = torch.cross(normals, t1, dim=-1)
    return torch.stack([t1, t2, normals], dim=-1)


Sampler = Callable[[int, torch.Generator], Tuple[torch.Tensor, torch.Tensor]]


def _sphere(center, r) -> Tuple[float, Sampler]:
    def sample(n, g):
        nrm = torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=-1)
        return torch.tensor(center) + r * nrm, nrm

    return 4 * math.pi * r * r, sample


def _box(center, half) -> Tuple[float, Sampler]:
    hx, hy, hz = half
    areas = torch.tensor([hy * hz, hy * hz, hx * hz, hx * hz, hx * hy, hx * hy]) * 4

    def sample(n, g):
        face = torch.multinomial(areas, n, replacement=True, generator=g)
        u = torch.rand(n, 3, generator=g) * 2 - 1
        axis = face // 2
        sign = (face % 2) * 2 - 1.0
        p = u * torch.tensor(half)
        nrm = torch.zeros(n, 3)
        idx = torch.arange(n)
        p[idx, axis] = sign * torch.tensor(half)[axis]
        nrm[idx, axis] = sign
        return torch.tensor(center) + p, nrm

    return float(areas.sum()), sample


def _cylinder(center, r, h) -> Tuple[float, Sampler]:
    side, cap = 2 * math.pi * r * h, math.pi * r * r

    def sample(n, g):
        which = torch.multinomial(torch.tensor([side, cap]), n, replacement=True, generator=g)
        phi = torch.rand(n, generator=g) * 2 * math.pi
        z = torch.rand(n, generator=g) * h
        rr = torch.sqrt(torch.rand(n, generator=g)) * r
        on_side = which == 0
        x = torch.where(on_side, r * torch.cos(phi), rr * torch.cos(phi))
        y = torch.where(on_side, r * torch.sin(phi), rr * torch.sin(phi))
        z = torch.where(on_side, z, torch.full_like(z, h))
        nrm = torch.where(on_side[:, None], torch.stack([torch.cos(phi), torch.sin(phi), torch.zeros(n)], -1),
                          torch.tensor([0.0, 0.0, 1.0]).expand(n, 3))
        return torch.tensor(center) + torch.stack([x, y, z], -1), nrm

    return side + cap, sample


def _torus(center, R, r) -> Tuple[float, Sampler]:
    def sample(n, g):
        out_u, out_v = [], []
        while sum(len(u) for u in out_u) < n:  # rejection sampling for uniform area
            u = torch.rand(2 * n, generator=g) * 2 * math.pi
            v = torch.rand(2 * n, generator=g) * 2 * math.pi
            keep = torch.rand(2 * n, generator=g) < (R + r * torch.cos(v)) / (R + r)
            out_u.append(u[keep])
            out_v.append(v[keep])
        u, v = torch.cat(out_u)[:n], torch.cat(out_v)[:n]
        nrm = torch.stack([torch.cos(v) * torch.cos(u), torch.cos(v) * torch.sin(u), torch.sin(v)], -1)
        p = torch.stack([(R + r * torch.cos(v)) * torch.cos(u), (R + r * torch.cos(v)) * torch.sin(u), r * torch.sin(v)], -1)
        return torch.tensor(center) + p, nrm

    return 4 * math.pi ** 2 * R * r, sample


def _bowl(center, r) -> Tuple[float, Sampler]:
    """Open hemispherical shell (concave), rim at the top."""

    def sample(n, g):
        nrm = torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=-1)
        nrm[:, 2] = -nrm[:, 2].abs()
        return torch.tensor(center) + torch.tensor([0.0, 0.0, r]) + r * nrm, nrm

    return 2 * math.pi * r * r, sample


def _floor(size) -> Tuple[float, Sampler]:
    def sample(n, g):
        xy = (torch.rand(n, 2, generator=g) - 0.5) * size
        return torch.cat([xy, torch.zeros(n, 1)], -1), torch.tensor([0.0, 0.0, 1.0]).expand(n, 3).clone()

    return size * size, sample


def _union(*parts: Tuple[float, Sampler]) -> Tuple[float, Sampler]:
    """One object made of several primitives, sampled in proportion to their areas."""
    areas = torch.tensor([a for a, _ in parts])

    def sample(n, g):
        which = torch.multinomial(areas, n, replacement=True, generator=g)
        p, nrm = torch.zeros(n, 3), torch.zeros(n, 3)
        for k, (_, smp) in enumerate(parts):
            sel = torch.nonzero(which == k).flatten()
            if len(sel):
                pk, nk = smp(len(sel), g)
                p[sel], nrm[sel] = pk, nk
        return p, nrm

    return float(areas.sum()), sample


def _upright_ring(center, R, r, yaw=0.0) -> Tuple[float, Sampler]:
    """A torus standing on its edge (ring axis horizontal, at angle ``yaw`` from the x axis)."""
    area, smp = _torus((0.0, 0.0, 0.0), R, r)
    c, s = math.cos(yaw), math.sin(yaw)
    rot = torch.tensor([[c, 0.0, -s], [s, 0.0, c], [0.0, 1.0, 0.0]])  # ring plane z -> vertical

    def sample(n, g):
        p, nrm = smp(n, g)
        return torch.tensor(center) + p @ rot.T, nrm @ rot.T

    return area, sample


def _legs(center, half_xy, r, h) -> Tuple[float, Sampler]:
    """Four thin legs (cylinders) under a rectangle of half extents ``half_xy``."""
    x, y = center[0], center[1]
    hx, hy = half_xy
    return _union(*[_cylinder((x + sx * hx, y + sy * hy, 0.0), r, h) for sx in (-1, 1) for sy in (-1, 1)])


ObjectSpec = Tuple[str, Tuple[float, float, float], Callable[[Tuple[float, float]], Tuple[float, Sampler]]]

# Each layout: (name, rgb, shape factory of the jittered (x, y) position) per object, and the positions.
# Objects with the same position share the jitter of the first one (an object inside / on another).
_TABLETOP: List[ObjectSpec] = [
    ("red ball", (0.85, 0.12, 0.10), lambda o: _sphere((o[0], o[1], 0.25), 0.25)),
    ("blue box", (0.12, 0.25, 0.85), lambda o: _box((o[0], o[1], 0.3), (0.22, 0.18, 0.3))),
    ("green cylinder", (0.15, 0.7, 0.2), lambda o: _cylinder((o[0], o[1], 0.0), 0.15, 0.55)),
    ("yellow torus", (0.92, 0.82, 0.10), lambda o: _torus((o[0], o[1], 0.12), 0.25, 0.08)),
    ("white bowl", (0.92, 0.92, 0.90), lambda o: _bowl((o[0], o[1], 0.0), 0.3)),
    ("purple ball", (0.55, 0.2, 0.7), lambda o: _sphere((o[0], o[1], 0.1), 0.1)),  # sits inside the bowl
    ("black pole", (0.08, 0.08, 0.08), lambda o: _cylinder((o[0], o[1], 0.0), 0.025, 0.9)),  # thin part
]
_TABLETOP_XY = [(-0.55, -0.35), (0.05, 0.15), (0.6, -0.45), (-0.3, 0.6), (0.65, 0.55), (0.65, 0.55), (0.05, -0.6)]

_TABLE: List[ObjectSpec] = [  # a table with thin legs, a mug on it, a cube under it
    ("wooden table", (0.55, 0.35, 0.18), lambda o: _union(_box((o[0], o[1], 0.5), (0.45, 0.3, 0.025)),
                                                          _legs((o[0], o[1]), (0.4, 0.25), 0.025, 0.475))),
    ("red mug", (0.85, 0.1, 0.12), lambda o: _cylinder((o[0] + 0.12, o[1] + 0.05, 0.525), 0.07, 0.13)),
    ("blue cube", (0.15, 0.3, 0.85), lambda o: _box((o[0] - 0.1, o[1] - 0.05, 0.1), (0.1, 0.1, 0.1))),
    ("green plant pot", (0.2, 0.65, 0.25), lambda o: _cylinder((o[0], o[1], 0.0), 0.15, 0.35)),
    ("orange ball", (0.95, 0.55, 0.1), lambda o: _sphere((o[0], o[1], 0.12), 0.12)),
    ("black lamp", (0.08, 0.08, 0.08), lambda o: _union(_cylinder((o[0], o[1], 0.0), 0.02, 0.8),
                                                        _sphere((o[0], o[1], 0.88), 0.1))),
]
_TABLE_XY = [(0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.85, 0.55), (-0.8, 0.55), (-0.7, -0.65)]

_STACKS: List[ObjectSpec] = [  # objects on others, a thin upright ring, a small ball
    ("grey crate", (0.5, 0.5, 0.52), lambda o: _box((o[0], o[1], 0.25), (0.25, 0.25, 0.25))),
    ("red box", (0.85, 0.15, 0.1), lambda o: _box((o[0], o[1], 0.6), (0.1, 0.1, 0.1))),
    ("white pedestal", (0.9, 0.9, 0.88), lambda o: _cylinder((o[0], o[1], 0.0), 0.12, 0.5)),
    ("yellow ball", (0.92, 0.8, 0.1), lambda o: _sphere((o[0], o[1], 0.62), 0.12)),
    ("blue ring", (0.12, 0.3, 0.85), lambda o: _upright_ring((o[0], o[1], 0.25), 0.22, 0.03, yaw=0.6)),
    ("green marble", (0.2, 0.7, 0.25), lambda o: _sphere((o[0], o[1], 0.06), 0.06)),
]
_STACKS_XY = [(0.3, -0.2), (0.3, -0.2), (-0.5, 0.3), (-0.5, 0.3), (0.45, 0.6), (-0.25, -0.6)]

_SMALL: List[ObjectSpec] = [  # small objects in front of and behind a wall
    ("brown wall", (0.45, 0.3, 0.2), lambda o: _box((o[0], o[1], 0.35), (0.8, 0.05, 0.35))),
    ("red pen", (0.85, 0.1, 0.1), lambda o: _box((o[0], o[1], 0.02), (0.14, 0.02, 0.02))),
    ("blue die", (0.15, 0.3, 0.85), lambda o: _box((o[0], o[1], 0.06), (0.06, 0.06, 0.06))),
    ("green marble", (0.2, 0.7, 0.25), lambda o: _sphere((o[0], o[1], 0.07), 0.07)),
    ("yellow cup", (0.92, 0.82, 0.1), lambda o: _cylinder((o[0], o[1], 0.0), 0.08, 0.15)),
    ("orange ball", (0.95, 0.55, 0.1), lambda o: _sphere((o[0], o[1], 0.15), 0.15)),
    ("pink ring", (0.95, 0.5, 0.7), lambda o: _torus((o[0], o[1], 0.03), 0.1, 0.03)),
]
_SMALL_XY = [(0.0, 0.45), (0.3, -0.15), (-0.3, -0.3), (0.0, -0.5), (-0.55, 0.05), (0.3, 0.85), (0.55, -0.55)]

_OCCLUSION: List[ObjectSpec] = [  # a tall cabinet between objects, a chair with thin legs, a box under it
    ("tall cabinet", (0.6, 0.4, 0.25), lambda o: _box((o[0], o[1], 0.5), (0.2, 0.35, 0.5))),
    ("red ball", (0.85, 0.12, 0.1), lambda o: _sphere((o[0] + 0.45, o[1], 0.2), 0.2)),
    ("blue ball", (0.12, 0.25, 0.85), lambda o: _sphere((o[0] - 0.45, o[1] + 0.1, 0.2), 0.2)),
    ("white chair", (0.9, 0.9, 0.88), lambda o: _union(_box((o[0], o[1], 0.3), (0.18, 0.18, 0.02)),
                                                       _box((o[0], o[1] + 0.17, 0.55), (0.18, 0.02, 0.23)),
                                                       _legs((o[0], o[1]), (0.15, 0.15), 0.015, 0.28))),
    ("yellow box", (0.92, 0.82, 0.1), lambda o: _box((o[0], o[1], 0.08), (0.08, 0.08, 0.08))),
    ("green bottle", (0.2, 0.7, 0.25), lambda o: _union(_cylinder((o[0], o[1], 0.0), 0.06, 0.28),
                                                        _cylinder((o[0], o[1], 0.28), 0.02, 0.1))),
]
_OCCLUSION_XY = [(0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.55, 0.65), (0.55, 0.65), (-0.6, -0.6)]

_SAME_COLOUR: List[ObjectSpec] = [  # touching objects of one colour and different classes
    ("white table", (0.92, 0.92, 0.9), lambda o: _union(_box((o[0], o[1], 0.5), (0.4, 0.28, 0.025)),
                                                        _legs((o[0], o[1]), (0.35, 0.23), 0.025, 0.475))),
    ("white mug", (0.92, 0.92, 0.9), lambda o: _cylinder((o[0] + 0.1, o[1], 0.525), 0.07, 0.13)),
    ("red crate", (0.85, 0.12, 0.1), lambda o: _box((o[0], o[1], 0.22), (0.22, 0.22, 0.22))),
    ("red box", (0.85, 0.12, 0.1), lambda o: _box((o[0], o[1], 0.53), (0.09, 0.09, 0.09))),
    ("green ball", (0.15, 0.7, 0.2), lambda o: _sphere((o[0], o[1], 0.15), 0.15)),
    ("green cylinder", (0.15, 0.7, 0.2), lambda o: _cylinder((o[0] + 0.25, o[1], 0.0), 0.1, 0.4)),
    ("grey pedestal", (0.5, 0.5, 0.52), lambda o: _cylinder((o[0], o[1], 0.0), 0.14, 0.45)),
    ("grey vase", (0.5, 0.5, 0.52), lambda o: _cylinder((o[0], o[1], 0.45), 0.07, 0.22)),
    ("blue ring", (0.12, 0.25, 0.85), lambda o: _upright_ring((o[0], o[1], 0.21), 0.18, 0.03, yaw=0.4)),
]
_SAME_COLOUR_XY = [(-0.45, 0.35), (-0.45, 0.35), (0.5, 0.4), (0.5, 0.4), (-0.5, -0.45), (-0.5, -0.45),
                   (0.45, -0.45), (0.45, -0.45), (0.0, -0.05)]


def _stool(center, seat_r, h, leg_r) -> Tuple[float, Sampler]:
    """A round seat at height ``h`` on 3 thin legs."""
    x, y = center
    legs = [_cylinder((x + 0.75 * seat_r * math.cos(a), y + 0.75 * seat_r * math.sin(a), 0.0), leg_r, h - 0.02)
            for a in (0.0, 2 * math.pi / 3, 4 * math.pi / 3)]
    return _union(_cylinder((x, y, h - 0.02), seat_r, 0.02), *legs)


def _fence(center, half_len, post_r, h, bar_half) -> Tuple[float, Sampler]:
    """Two posts and three horizontal bars between them (along x)."""
    x, y = center
    posts = [_cylinder((x + s * half_len, y, 0.0), post_r, h) for s in (-1, 1)]
    bars = [_box((x, y, z), (half_len, bar_half, bar_half)) for z in (0.3 * h, 0.6 * h, 0.9 * h)]
    return _union(*posts, *bars)


_THIN: List[ObjectSpec] = [  # thin structures
    ("black pole", (0.08, 0.08, 0.08), lambda o: _cylinder((o[0], o[1], 0.0), 0.015, 0.9)),
    ("silver pole", (0.75, 0.75, 0.78), lambda o: _cylinder((o[0], o[1], 0.0), 0.012, 0.7)),
    ("brown fence", (0.5, 0.3, 0.15), lambda o: _fence((o[0], o[1]), 0.3, 0.012, 0.5, 0.008)),
    ("orange ring", (0.95, 0.55, 0.1), lambda o: _upright_ring((o[0], o[1], 0.212), 0.2, 0.012, yaw=1.1)),
    ("red stool", (0.8, 0.2, 0.15), lambda o: _stool((o[0], o[1]), 0.15, 0.4, 0.01)),
    ("green wire", (0.15, 0.7, 0.2), lambda o: _torus((o[0], o[1], 0.008), 0.3, 0.008)),
]
_THIN_XY = [(-0.6, 0.5), (0.6, 0.6), (0.0, 0.55), (0.55, -0.3), (-0.1, -0.1), (-0.35, -0.55)]

#: The fixed scene layouts (:attr:`SceneConfig.layout` by index or name): (name, objects, positions), the positions
#: jittered by the seed. All share the floor (class 0).
LAYOUTS: List[Tuple[str, List[ObjectSpec], List[Tuple[float, float]]]] = [
    ("tabletop", _TABLETOP, _TABLETOP_XY),
    ("table", _TABLE, _TABLE_XY),
    ("stacks", _STACKS, _STACKS_XY),
    ("small objects", _SMALL, _SMALL_XY),
    ("occlusion", _OCCLUSION, _OCCLUSION_XY),
    ("same-colour", _SAME_COLOUR, _SAME_COLOUR_XY),
    ("thin", _THIN, _THIN_XY),
]
# the original names (kept for callers)
_OBJECTS, _LAYOUT = _TABLETOP, _TABLETOP_XY

#: The colours of the procedural layouts' objects (each object of a scene takes a different one).
PALETTE: List[Tuple[str, Tuple[float, float, float]]] = [
    ("red", (0.85, 0.12, 0.10)), ("blue", (0.12, 0.25, 0.85)), ("green", (0.15, 0.7, 0.2)),
    ("yellow", (0.92, 0.82, 0.10)), ("orange", (0.95, 0.55, 0.1)), ("purple", (0.55, 0.2, 0.7)),
    ("white", (0.92, 0.92, 0.90)), ("black", (0.08, 0.08, 0.08)), ("pink", (0.95, 0.5, 0.7)),
    ("cyan", (0.1, 0.75, 0.8)),
]

#: A texture: (Gaussian positions [n, 3], their colour [n, 3], generator) -> colours [n, 3].
Texture = Callable[[torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]


@dataclass
class _BankObject:
    """One object of the procedural layouts' bank: its shape, sizes and footprint radius."""

    shape: str
    sizes: Tuple[float, ...]
    footprint: float

    def make(self, xy: Tuple[float, float]) -> Tuple[float, Sampler]:
        x, y = xy
        s = self.sizes
        if self.shape == "ball":
            return _sphere((x, y, s[0]), s[0])
        if self.shape == "box":
            return _box((x, y, s[2]), s)
        if self.shape == "cylinder":
            return _cylinder((x, y, 0.0), s[0], s[1])
        if self.shape == "torus":
            return _torus((x, y, s[1]), s[0], s[1])
        if self.shape == "bowl":
            return _bowl((x, y, 0.0), s[0])
        return _upright_ring((x, y, s[0] + s[1]), s[0], s[1], yaw=s[2])  # "ring"


def _uniform(g: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand(1, generator=g))


def _bank_object(g: torch.Generator, scale: float = 1.0) -> _BankObject:
    """A shape of the bank (uniform) with sizes uniform in its ranges (x ``scale``)."""
    shape = ("ball", "box", "cylinder", "torus", "bowl", "ring")[int(torch.randint(6, (1,), generator=g))]
    u = lambda lo, hi: scale * _uniform(g, lo, hi)  # noqa: E731
    if shape == "ball":
        r = u(0.06, 0.14)
        return _BankObject(shape, (r,), r)
    if shape == "box":
        h = (u(0.05, 0.12), u(0.05, 0.12), u(0.05, 0.12))
        return _BankObject(shape, h, math.hypot(h[0], h[1]))
    if shape == "cylinder":
        r = u(0.04, 0.09)
        return _BankObject(shape, (r, u(0.10, 0.35)), r)
    if shape == "torus":
        R, r = u(0.07, 0.12), u(0.02, 0.035)
        return _BankObject(shape, (R, r), R + r)
    if shape == "bowl":
        r = u(0.08, 0.14)
        return _BankObject(shape, (r,), r)
    R, r = u(0.08, 0.14), u(0.015, 0.025)
    return _BankObject(shape, (R, r, _uniform(g, 0.0, math.pi)), R + r)


def _place(g: torch.Generator, objs: List[_BankObject], half: float, gap_min: float, gap_max: float,
           tries: int = 20000) -> List[Tuple[float, float]]:
    """Centres uniform in [-half, half]^2 with every footprint at least ``gap_min`` from the others and (after the
    first) at most ``gap_max`` from its nearest one; the upper bound is dropped for an object that finds no such
    place in ``tries`` draws."""
    xy: List[Tuple[float, float]] = []
    for o in objs:
        best = None
        for t in range(tries):
            c = (_uniform(g, -half + o.footprint, half - o.footprint), _uniform(g, -half + o.footprint, half - o.footprint))
            gaps = [math.hypot(c[0] - p[0], c[1] - p[1]) - o.footprint - q.footprint for p, q in zip(xy, objs)]
            if gaps and min(gaps) < gap_min:
                continue
            best = c
            if not gaps or min(gaps) <= gap_max:
                break
        if best is None:
            raise RuntimeError(f"synthetic layout: no place for a {o.shape} in [-{half}, {half}]^2")
        xy.append(best)
    return xy


def _stripes(second: Tuple[float, float, float], period: float = 0.08) -> Texture:
    def tex(p, col, g):
        band = (torch.floor(p[:, 2] / (period / 2)) % 2)[:, None]
        return torch.where(band > 0, torch.tensor(second).expand_as(col), col)

    return tex


def _checker(second: Tuple[float, float, float], cell: float = 0.06) -> Texture:
    def tex(p, col, g):
        c = (torch.floor(p / cell).sum(-1) % 2)[:, None]
        return torch.where(c > 0, torch.tensor(second).expand_as(col), col)

    return tex


def _blotches(std: float = 0.15) -> Texture:
    def tex(p, col, g):
        return col + std * torch.randn(col.shape, generator=g)

    return tex


#: A layout's draw: (class name, rgb, shape factory, texture or None) per object, and the object positions.
LayoutDraw = Tuple[List[Tuple[str, Tuple[float, float, float], Callable, Optional[Texture]]], List[Tuple[float, float]]]


def _bank_layout(g: torch.Generator, count: int, half: float, gap_min: float, gap_max: float,
                 scale: float = 1.0, ring: bool = False, textured: bool = False) -> LayoutDraw:
    objs = [_bank_object(g, scale) for _ in range(count)]
    colours = torch.randperm(len(PALETTE), generator=g).tolist()[:count]
    if ring:  # on a circle of radius 0.9, 120 degrees apart (+- 20 degrees)
        a0 = _uniform(g, 0.0, 2 * math.pi)
        angles = [a0 + 2 * math.pi * k / count + math.radians(_uniform(g, -20.0, 20.0)) for k in range(count)]
        xy = [(0.9 * math.cos(a), 0.9 * math.sin(a)) for a in angles]
    else:
        xy = _place(g, objs, half, gap_min, gap_max)
    out = []
    for o, c in zip(objs, colours):
        name, rgb = PALETTE[c]
        tex = None
        if textured:
            kind = int(torch.randint(3, (1,), generator=g))
            other = [k for k in range(len(PALETTE)) if k != c]
            second = PALETTE[other[int(torch.randint(len(other), (1,), generator=g))]][1]
            tex = (_stripes(second), _checker(second), _blotches())[kind]
        out.append((f"{name} {o.shape}", rgb, o.make, tex))
    return out, xy


#: The procedural layouts (the seed draws the objects from the bank; :mod:`rh3dgs.eval.families`).
PROCEDURAL_LAYOUTS: Dict[str, Callable[[torch.Generator], LayoutDraw]] = {
    "cluttered": lambda g: _bank_layout(g, 10, 0.8, 0.01, 0.03),
    "sparse": lambda g: _bank_layout(g, 3, 0.9, 0.0, 0.0, scale=1.5, ring=True),
    "textured": lambda g: _bank_layout(g, 6, 0.7, 0.05, 10.0, textured=True),
}


def layout_names() -> List[str]:
    """Every layout name :attr:`SceneConfig.layout` takes (the fixed ones first, in :data:`LAYOUTS` order)."""
    return [n for n, _, _ in LAYOUTS] + list(PROCEDURAL_LAYOUTS)


def orbit_cameras(cfg: SceneConfig, center=(0.0, 0.0, 0.3), heldout: bool = False) -> Cameras:
    """Cameras on circles of radius ``orbit_radius`` at ``orbit_heights``, looking at ``center``.

    ``heldout=True``: the ``heldout_views`` evaluation cameras instead, at ``heldout_heights``, their
    azimuths offset by half a training step (so no held-out view repeats a training viewpoint);
    named ``frame_XXXXX`` after the training frames.
    """
    n, heights = (cfg.heldout_views, cfg.heldout_heights) if heldout else (cfg.num_views, cfg.orbit_heights)
    radius = cfg.heldout_radius if heldout and cfg.heldout_radius is not None else cfg.orbit_radius
    eyes = []
    for i in range(n):
        ang = 2 * math.pi * i / n + 0.3 + (math.pi / max(cfg.num_views, 1) if heldout else 0.0)
        h = heights[i % len(heights)]
        eyes.append([radius * math.cos(ang), radius * math.sin(ang), h])
    cams = Cameras.look_at(torch.tensor(eyes).reshape(-1, 3), torch.tensor(center), up=(0.0, 0.0, 1.0),
                           fov_deg=cfg.fov_deg, width=cfg.image_size, height=cfg.image_size)
    first = cfg.num_views if heldout else 0
    cams.names = [f"frame_{first + i:05d}" for i in range(n)]
    return cams


def camera_azimuths(cameras: Cameras) -> List[float]:
    """Each camera's azimuth around the vertical (z) axis through the origin, in radians: where on the orbit it is
    (the simulated teachers' view-correlated failures, ``view_failure_mode="azimuth"``)."""
    R, t = cameras.viewmats[:, :3, :3], cameras.viewmats[:, :3, 3]
    centres = -(R.transpose(1, 2) @ t[..., None])[..., 0]  # camera centres in the world
    return [float(a) for a in torch.atan2(centres[:, 1], centres[:, 0])]


def _draw_layout(cfg: SceneConfig, g: torch.Generator) -> LayoutDraw:
    """The objects of ``cfg.layout`` and their positions: a fixed layout jittered by the seed, or a procedural one."""
    if isinstance(cfg.layout, str) and cfg.layout in PROCEDURAL_LAYOUTS:
        return PROCEDURAL_LAYOUTS[cfg.layout](g)
    idx = [n for n, _, _ in LAYOUTS].index(cfg.layout) if isinstance(cfg.layout, str) else int(cfg.layout)
    _, objects, xy = LAYOUTS[idx]
    jitter = (torch.rand(len(xy), 2, generator=g) - 0.5) * 0.1
    for k in range(1, len(xy)):  # an object placed on / in / under another keeps its jitter
        if xy[k] in xy[:k]:
            jitter[k] = jitter[xy.index(xy[k])]
    return ([(name, rgb, make, None) for name, rgb, make in objects],
            [(x + float(j[0]), y + float(j[1])) for (x, y), j in zip(xy, jitter)])


def make_scene(cfg: Optional[SceneConfig] = None) -> SyntheticScene:
    """Build the labelled Gaussian scene described in the module docstring."""
    cfg = cfg or SceneConfig()
    g = torch.Generator().manual_seed(cfg.seed)
    objects, xy = _draw_layout(cfg, g)
    parts = [("floor", (0.55, 0.5, 0.45), _floor(cfg.floor_size), None)]
    for (name, rgb, make, tex), o in zip(objects, xy):
        parts.append((name, rgb, make(o), tex))
    class_names = [p[0] for p in parts]
    means, normals, colors, cls, inst, spacing = [], [], [], [], [], []
    for k, (name, rgb, (area, sampler), tex) in enumerate(parts):
        n = max(64, int(round(area * cfg.gaussians_per_unit_area)))
        p, nrm = sampler(n, g)
        col = torch.tensor(rgb).expand(n, 3).clone()
        if name == "floor":  # checkerboard texture
            chk = ((torch.floor(p[:, 0] / 0.25) + torch.floor(p[:, 1] / 0.25)) % 2)[:, None]
            col = col * (0.75 + 0.5 * chk)
        if tex is not None:
            col = tex(p, col, g)
        col = (col + cfg.texture_noise * torch.randn(n, 3, generator=g)).clamp(0.01, 0.99)
        means.append(p); normals.append(nrm); colors.append(col)
        cls.append(torch.full((n,), k)); inst.append(torch.full((n,), k))
        spacing.append(torch.full((n,), math.sqrt(area / n)))
    means, normals, colors = torch.cat(means), torch.cat(normals), torch.cat(colors)
    s = torch.cat(spacing)
    blob = cfg.gaussian_style == "blob"
    scales = torch.stack([0.8 * s, 0.8 * s, (0.8 if blob else 0.08) * s], -1)
    quats = rotmat_to_quat(_tangent_frames(normals))
    opac = torch.full((len(means),), 0.5 if blob else 0.9)
    gaussians = Gaussians.from_activated(means, scales, quats, opac, colors)
    gaussians.extra = {"class_id": torch.cat(cls).float(), "instance_id": torch.cat(inst).float()}
    heldout = orbit_cameras(cfg, heldout=True) if cfg.heldout_views > 0 else None
    return SyntheticScene(gaussians, torch.cat(cls), torch.cat(inst), class_names, orbit_cameras(cfg), cfg, heldout)


def write_dataset(scene: SyntheticScene, out_dir, progress: bool = True) -> Dict[str, Path]:
    """Render ``scene`` into a nerfstudio dataset at ``out_dir``.

    Layout::
        images/frame_XXXXX.png         RGB renders
        depth/frame_XXXXX.npy          expected depth (float32, 0 = background)
        masks/frame_XXXXX.png          per-pixel class index (uint8, 255 = background)
        instances/frame_XXXXX.png      per-pixel instance index (uint8, 255 = background)
        transforms.json                nerfstudio cameras (OpenGL c2w), ply_file_path; with held-out
                                       cameras also train_filenames / val_filenames / test_filenames
        sparse_pc.ply                  initial point cloud (Gaussian centres, for splatfacto)
        scene.ply                      ground-truth Gaussians (INRIA layout + class_id, instance_id)
        classes.txt                    class names, one per line, index = class id
    The folder is built beside ``out_dir`` and swapped in by one rename (:func:`rh3dgs.io.atomic.atomic_folder`):
    an existing dataset there is replaced whole or not at all.
    """
    from ..io.atomic import atomic_folder

    final = Path(out_dir)
    with atomic_folder(final) as out:
        _write_dataset_files(scene, out, progress)
    return {"root": final, "transforms": final / "transforms.json", "scene_ply": final / "scene.ply"}


def _write_dataset_files(scene: SyntheticScene, out: Path, progress: bool) -> None:
    from ..io.atomic import atomic_save_bytes, atomic_save_png
    from ..io.ply import save_ply
    from ..io.transforms import save_transforms
    from ..progress import track
    from ..rendering import render

    for sub in ("images", "depth", "masks", "instances"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    cams = all_cameras(scene)
    n_inst = int(scene.instance_ids.max()) + 1
    onehot = torch.cat([torch.nn.functional.one_hot(scene.class_ids, len(scene.class_names)),
                        torch.nn.functional.one_hot(scene.instance_ids, n_inst)], 1).float()
    K = len(scene.class_names)
    image_paths = []
    for i in track(range(len(cams)), description="rendering synthetic views", disable=not progress):
        with torch.no_grad():
            r = render(scene.gaussians, cams[i], onehot)
        name = cams.names[i]
        img = (r.rgb[0].clamp(0, 1) * 255).round().to(torch.uint8).numpy()
        atomic_save_png(out / "images" / f"{name}.png", img)
        buf = _npy_bytes(torch.where(r.alpha[0] > 0.5, r.depth[0], torch.zeros_like(r.depth[0])).numpy().astype(np.float32))
        atomic_save_bytes(out / "depth" / f"{name}.npy", buf)
        for sub, feats in (("masks", r.features[0, ..., :K]), ("instances", r.features[0, ..., K:])):
            lab = feats.argmax(-1).to(torch.uint8)
            lab[r.alpha[0] < 0.5] = 255
            atomic_save_png(out / sub / f"{name}.png", lab.numpy())
        image_paths.append(out / "images" / f"{name}.png")
    save_ply(out / "scene.ply", scene.gaussians)
    _save_point_cloud(out / "sparse_pc.ply", scene.gaussians.means, scene.gaussians.base_colors)
    extra: Dict[str, object] = {"ply_file_path": "sparse_pc.ply"}
    if scene.heldout_cameras is not None:
        rel = [f"images/{n}.png" for n in cams.names]
        n_train = len(scene.cameras)
        extra.update(train_filenames=rel[:n_train], val_filenames=rel[n_train:], test_filenames=rel[n_train:])
    save_transforms(out / "transforms.json", cams, image_paths, extra=extra)
    atomic_save_bytes(out / "classes.txt", ("\n".join(scene.class_names) + "\n").encode())


def all_cameras(scene: SyntheticScene) -> Cameras:
    """The training cameras followed by the held-out ones (if any)."""
    if scene.heldout_cameras is None:
        return scene.cameras
    a, b = scene.cameras, scene.heldout_cameras
    return Cameras(torch.cat([a.viewmats, b.viewmats]), torch.cat([a.Ks, b.Ks]), a.width, a.height,
                   list(a.names or []) + list(b.names or []))


def _npy_bytes(arr: np.ndarray) -> bytes:
    import io

    bio = io.BytesIO()
    np.save(bio, arr)
    return bio.getvalue()


def _save_point_cloud(path: Path, xyz: torch.Tensor, rgb: torch.Tensor) -> None:
    """A coloured point cloud PLY (x y z red green blue), as nerfstudio's ``ply_file_path`` expects."""
    from plyfile import PlyData, PlyElement

    from ..io.atomic import atomic_write

    arr = np.empty(len(xyz), dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    xyz_np, rgb_np = xyz.numpy(), (rgb * 255).round().clamp(0, 255).to(torch.uint8).numpy()
    for i, k in enumerate("xyz"):
        arr[k] = xyz_np[:, i]
    for i, k in enumerate(("red", "green", "blue")):
        arr[k] = rgb_np[:, i]
    with atomic_write(path, "wb") as f:
        PlyData([PlyElement.describe(arr, "vertex")]).write(f)
