"""A typed batch of pinhole cameras (nerfstudio / gsplat conventions).

World-to-camera matrices use the OpenCV convention gsplat expects (x right, y down,
z forward). nerfstudio's transforms.json stores OpenGL camera-to-world matrices
(x right, y up, z backward); :meth:`Cameras.from_c2w_opengl` converts.

Scenes that come without cameras (a downloaded splat) get them from their Gaussians:
:func:`scene_bounds` (a centre and size robust to floaters), :func:`detect_up` and :func:`orbit_cameras`
(``rh3dgs render SCENE.ply`` without a transforms.json; the viewer's first view).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Tuple, Union

import torch

from .errors import ShapeError

__all__ = ["Cameras", "OPENGL_TO_OPENCV", "scene_bounds", "detect_up", "orbit_cameras", "AXES"]

OPENGL_TO_OPENCV = torch.diag(torch.tensor([1.0, -1.0, -1.0, 1.0]))


@dataclass
class Cameras:
    """B pinhole cameras, all of one image size.

    Fields:
        viewmats: [B, 4, 4] world-to-camera, OpenCV convention (gsplat's ``viewmats``).
        Ks:       [B, 3, 3] intrinsics in pixels (fx, fy, cx, cy; pixel centres at +0.5).
        width, height: image size in pixels.
        names:    optional per-camera names (image file stems).
    """

    viewmats: torch.Tensor
    Ks: torch.Tensor
    width: int
    height: int
    names: Optional[List[str]] = None

    def __post_init__(self) -> None:
        if self.viewmats.dim() != 3 or self.viewmats.shape[1:] != (4, 4):
            raise ShapeError(f"Cameras.viewmats must be [B, 4, 4], got {list(self.viewmats.shape)}")
        if self.Ks.shape != (self.viewmats.shape[0], 3, 3):
            raise ShapeError(f"Cameras.Ks must be [B, 3, 3] with B={self.viewmats.shape[0]}, got {list(self.Ks.shape)}")
        if int(self.width) <= 0 or int(self.height) <= 0:
            raise ShapeError(f"Cameras image size must be positive, got {self.width}x{self.height}")
        if self.names is not None and len(self.names) != len(self):
            raise ShapeError(f"Cameras.names has {len(self.names)} entries for {len(self)} cameras")

    def __len__(self) -> int:
        return self.viewmats.shape[0]

    @property
    def device(self) -> torch.device:
        return self.viewmats.device

    def to(self, device) -> "Cameras":
        return replace(self, viewmats=self.viewmats.to(device), Ks=self.Ks.to(device))

    def __getitem__(self, index: Union[int, slice, Sequence[int], torch.Tensor]) -> "Cameras":
        if isinstance(index, int):
            index = [index]
        if isinstance(index, slice):
            idx = list(range(len(self)))[index]
        else:
            idx = [int(i) for i in (index.tolist() if isinstance(index, torch.Tensor) else index)]
        names = None if self.names is None else [self.names[i] for i in idx]
        return replace(self, viewmats=self.viewmats[idx], Ks=self.Ks[idx], names=names)

    @property
    def c2w_opengl(self) -> torch.Tensor:
        """[B, 4, 4] camera-to-world in nerfstudio's OpenGL convention."""
        return torch.linalg.inv(self.viewmats) @ OPENGL_TO_OPENCV.to(self.viewmats)

    @property
    def centers(self) -> torch.Tensor:
        """[B, 3] camera centres in world coordinates."""
        return torch.linalg.inv(self.viewmats)[:, :3, 3]

    @staticmethod
    def from_c2w_opengl(
        c2w: torch.Tensor, fx, fy, cx, cy, width: int, height: int, names: Optional[List[str]] = None
    ) -> "Cameras":
        """From [B, 4, 4] (or [B, 3, 4]) OpenGL camera-to-world matrices and intrinsics (scalars or [B])."""
        c2w = torch.as_tensor(c2w, dtype=torch.float32)
        b = c2w.shape[0]
        if c2w.shape[1:] == (3, 4):
            bottom = torch.tensor([0.0, 0.0, 0.0, 1.0]).expand(b, 1, 4)
            c2w = torch.cat([c2w, bottom], dim=1)
        c2w_cv = c2w @ OPENGL_TO_OPENCV
        viewmats = torch.linalg.inv(c2w_cv)
        Ks = torch.zeros(b, 3, 3)
        Ks[:, 0, 0] = torch.as_tensor(fx, dtype=torch.float32)
        Ks[:, 1, 1] = torch.as_tensor(fy, dtype=torch.float32)
        Ks[:, 0, 2] = torch.as_tensor(cx, dtype=torch.float32)
        Ks[:, 1, 2] = torch.as_tensor(cy, dtype=torch.float32)
        Ks[:, 2, 2] = 1.0
        return Cameras(viewmats=viewmats, Ks=Ks, width=int(width), height=int(height), names=names)

    @staticmethod
    def look_at(
        eyes: torch.Tensor, targets: torch.Tensor, up=(0.0, 0.0, 1.0), fov_deg: float = 50.0, width: int = 128, height: int = 128
    ) -> "Cameras":
        """Cameras at ``eyes`` [B,3] looking at ``targets`` [B,3] (or [3]) with world ``up``."""
        eyes = torch.as_tensor(eyes, dtype=torch.float32)
        targets = torch.as_tensor(targets, dtype=torch.float32).expand_as(eyes)
        up_t = torch.as_tensor(up, dtype=torch.float32).expand_as(eyes)
        fwd = torch.nn.functional.normalize(targets - eyes, dim=-1)  # +z (OpenCV)
        right = torch.nn.functional.normalize(torch.cross(fwd, up_t, dim=-1), dim=-1)  # +x
        down = torch.cross(fwd, right, dim=-1)  # +y
        R = torch.stack([right, down, fwd], dim=1)  # rows: camera axes in world
        b = eyes.shape[0]
        viewmats = torch.eye(4).repeat(b, 1, 1)
        viewmats[:, :3, :3] = R
        viewmats[:, :3, 3] = -(R @ eyes.unsqueeze(-1)).squeeze(-1)
        f = 0.5 * width / torch.tan(torch.deg2rad(torch.tensor(fov_deg)) / 2)
        Ks = torch.tensor([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1]], dtype=torch.float32).repeat(b, 1, 1)
        return Cameras(viewmats=viewmats, Ks=Ks, width=width, height=height)


# ------------------------------------------------------------------------------ cameras for a scene without any
AXES = {"x": (1.0, 0.0, 0.0), "-x": (-1.0, 0.0, 0.0), "y": (0.0, 1.0, 0.0), "-y": (0.0, -1.0, 0.0),
        "z": (0.0, 0.0, 1.0), "-z": (0.0, 0.0, -1.0)}
"""World axes by name (``--up``)."""
_SAMPLE = 200_000


def _opaque_means(means: torch.Tensor, opacities: Optional[torch.Tensor]) -> torch.Tensor:
    """The finite means of Gaussians with opacity > 0.1 (all when fewer than 16 are), at most 200k evenly spaced,
    float64."""
    m = means.detach().double().cpu()
    finite = torch.isfinite(m).all(-1)
    if opacities is not None:
        keep = finite & (torch.sigmoid(opacities.detach().double().cpu().reshape(-1)) > 0.1)
        finite = keep if int(keep.sum()) >= 16 else finite
    m = m[finite]
    if len(m) > _SAMPLE:
        m = m[torch.linspace(0, len(m) - 1, _SAMPLE).long()]
    return m


def scene_bounds(means: torch.Tensor, opacities: Optional[torch.Tensor] = None,
                 quantile: float = 0.95) -> Tuple[torch.Tensor, float]:
    """``(centre [3], extent)``: the middle of the (opaque) Gaussians' robust box (per axis, the ``1 - quantile``
    and ``quantile`` quantiles of their means) and the ``quantile`` of their distances to it. Quantiles, not the
    bounding box: the floaters and the far background a trained splat carries do not move them; the box's middle,
    not the median: a standing object whose Gaussians crowd at its base (a guitar's body) is framed whole.

    >>> c, r = scene_bounds(torch.cat([torch.randn(1000, 3), torch.full((5, 3), 1e4)]))
    >>> bool(c.abs().max() < 0.2), 2.0 < r < 3.5
    (True, True)
    """
    m = _opaque_means(means, opacities)
    if len(m) == 0:
        return torch.zeros(3), 1.0
    lo, hi = torch.quantile(m, 1.0 - quantile, dim=0), torch.quantile(m, quantile, dim=0)
    centre = (lo + hi) / 2
    extent = float(torch.quantile((m - centre).norm(dim=-1), quantile)) if len(m) > 1 else 1.0
    return centre.float(), max(extent, 1e-3)


def detect_up(means: torch.Tensor, opacities: Optional[torch.Tensor] = None) -> Tuple[str, str]:
    """``(axis name, why)``: the world up of a scene without cameras, from the spread of its Gaussians.

    The principal axes of the (opaque) means: one much longer than the others (a standing figure) is the up axis;
    else one much shorter than the others (a floor, a flat object) is; else the PLY convention of COLMAP / INRIA /
    SuperSplat files (x right, y down: up is ``-y``). The axis is snapped to the nearest world axis, with the sign
    of its convention (``-y``, ``z``, ``x``). A guess: ``--up`` overrides it.
    """
    m = _opaque_means(means, opacities)
    if len(m) < 4:
        return "-y", "too few Gaussians to tell; the PLY convention"
    d = m - m.median(dim=0).values
    scale = torch.quantile(d.abs(), 0.9, dim=0).clamp_min(1e-12)  # per axis, robust
    evals, evecs = torch.linalg.eigh(torch.cov((d / scale.max()).T))
    axis = None
    if evals[2] > 2.5 * evals[1]:
        axis, why = evecs[:, 2], "the scene's longest axis (a standing object)"
    elif evals[0] < 0.4 * evals[1]:
        axis, why = evecs[:, 0], "the scene's thinnest axis (a floor or a flat object)"
    if axis is None or float(axis.abs().max()) < 0.9:  # no clear axis, or one far from every world axis
        return "-y", "no dominant axis; the PLY convention (y down)"
    name = {0: "x", 1: "-y", 2: "z"}[int(axis.abs().argmax())]
    return name, why


def orbit_cameras(centre: torch.Tensor, extent: float, up: Union[str, Sequence[float]] = "-y", views: int = 36,
                  width: int = 512, height: int = 512, fov_deg: float = 50.0, elevation_deg: float = 20.0,
                  distance: float = 2.5) -> Cameras:
    """``views`` cameras on a circle about ``up`` through ``centre``, ``distance * extent`` away, ``elevation_deg``
    above the horizontal plane, looking at ``centre`` (a turntable; first camera on the plane's first axis, the
    rest counter-clockwise seen from above). Names ``orbit_000``...

    >>> cams = orbit_cameras(torch.zeros(3), 1.0, "z", views=4, width=32, height=24)
    >>> len(cams), cams.width, cams.height, [round(float(x), 2) for x in cams.centers.norm(dim=-1)]
    (4, 32, 24, [2.5, 2.5, 2.5, 2.5])
    """
    u = torch.tensor(AXES[up] if isinstance(up, str) else up, dtype=torch.float64)
    u = u / u.norm()
    a = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    if abs(float(a @ u)) > 0.9:
        a = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    e1 = torch.nn.functional.normalize(a - (a @ u) * u, dim=0)
    e2 = torch.linalg.cross(u, e1)
    t = torch.arange(views, dtype=torch.float64) * (2 * torch.pi / max(views, 1))
    el = torch.deg2rad(torch.tensor(float(elevation_deg), dtype=torch.float64))
    dirs = torch.cos(el) * (torch.cos(t)[:, None] * e1 + torch.sin(t)[:, None] * e2) + torch.sin(el) * u
    c = centre.double().cpu()
    eyes = c + distance * float(extent) * dirs
    cams = Cameras.look_at(eyes.float(), c.float(), up=tuple(u.tolist()), fov_deg=fov_deg, width=width, height=height)
    return replace(cams, names=[f"orbit_{i:03d}" for i in range(views)])
