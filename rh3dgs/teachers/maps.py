"""Teacher maps: the per-view 2D feature maps every consumer (lift, distillation, training) reads.

A *teacher map* is one view's dense teacher output ``[h, w, D]`` at any resolution (usually the
teacher's patch grid). Consumers need it at the render's resolution ``[H, W, D]``, float32, with
unit rows; zero rows mean "no feature here" and are ignored downstream. This module is the one
place that checks, resizes and renormalises a map:

    prepare_map(m, (H, W))  =  normalize( bilinear_{align_corners=False}(m, H, W) )   (zero rows stay zero)

A collection of maps for B views is a :data:`TeacherMaps`: a ``[B, h, w, D]`` tensor, a sequence
of ``[h, w, D]`` maps, or a callable ``i -> [h, w, D]`` that streams them (e.g. from the feature
cache), so that nothing needs all maps in memory at once.

>>> import torch
>>> from rh3dgs.teachers.maps import prepare_map
>>> m = torch.randn(4, 4, 8)                      # a 4x4 patch grid of 8-d features
>>> prepare_map(m, (16, 16)).shape
torch.Size([16, 16, 8])
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import NonFiniteError, ShapeError

__all__ = ["TeacherMaps", "get_map", "map_dim", "prepare_map", "prepare_maps"]

#: B per-view maps: a [B, h, w, D] tensor, a sequence of [h, w, D] maps, or a callable i -> [h, w, D].
TeacherMaps = Union[Tensor, Sequence[Tensor], Callable[[int], Tensor]]


def get_map(teacher_maps: TeacherMaps, i: int) -> Tensor:
    """Map of view ``i`` as given (no copy, no check)."""
    m = teacher_maps(i) if callable(teacher_maps) else teacher_maps[i]
    return torch.as_tensor(m)


def map_dim(teacher_maps: TeacherMaps) -> int:
    """Teacher dimension D (reads view 0)."""
    return int(get_map(teacher_maps, 0).shape[-1])


def prepare_map(m: Tensor, size: Tuple[int, int], view: Optional[int] = None) -> Tensor:
    """One view's map ``[h, w, D]`` -> ``[H, W, D]`` float32 unit rows (bilinear if the size differs).

    Raises :class:`ShapeError` for a map that is not 3-D and :class:`NonFiniteError` for NaN / Inf
    (checked before resizing: bilinear weights keep finite values finite). The input is never
    modified. Rows whose norm is below 1e-8 (ignored pixels) stay exactly zero.
    """
    where = "teacher map" if view is None else f"teacher map of view {view}"
    if m.dim() != 3:
        raise ShapeError(f"{where} must be [h, w, D], got {list(m.shape)}")
    H, W = int(size[0]), int(size[1])
    if H <= 0 or W <= 0:
        raise ShapeError(f"{where}: output size must be positive, got {tuple(size)}")
    m = m.float()
    if not torch.isfinite(m).all():
        raise NonFiniteError(f"{where} contains NaN / Inf")
    if m.shape[:2] != (H, W):
        # channels-last in and out: the [H, W, D] result needs no permuting copy
        x = m.permute(2, 0, 1)[None].contiguous(memory_format=torch.channels_last)
        m = F.interpolate(x, size=(H, W), mode="bilinear", align_corners=False)[0].permute(1, 2, 0)
        m = m.contiguous()  # a view of channels-last memory: no copy
    else:
        m = m.clone()  # normalised in place below; the caller's map stays as it was
    n = torch.linalg.vector_norm(m, dim=-1, keepdim=True)
    return m.mul_(torch.where(n > 1e-8, 1.0 / n.clamp_min(1e-8), 0.0))  # unit rows, zero rows stay zero


def prepare_maps(teacher_maps: TeacherMaps, views: Sequence[int], size: Tuple[int, int],
                 device: Union[str, torch.device, None] = None) -> Tensor:
    """:func:`prepare_map` of each of ``views`` -> ``[len(views), H, W, D]`` on ``device``."""
    out = torch.stack([prepare_map(get_map(teacher_maps, i), size, i) for i in views])
    return out if device is None else out.to(device)
