"""A typed batch of pinhole cameras (nerfstudio / gsplat conventions).

World-to-camera matrices use the OpenCV convention gsplat expects (x right, y down,
z forward). nerfstudio's transforms.json stores OpenGL camera-to-world matrices
(x right, y up, z backward); :meth:`Cameras.from_c2w_opengl` converts.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Union

import torch

from .errors import ShapeError

__all__ = ["Cameras", "OPENGL_TO_OPENCV"]

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
