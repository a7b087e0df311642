"""Tile binning of projected Gaussians (gsplat's layout and sort order).

CPU: the native op ``torch.ops.rh3dgs.isect_tiles`` (csrc/cpu/binning.cpp: counting sort by
tile, then depth order per tile). CUDA: gsplat's kernels (:mod:`rh3dgs.ops._gsplat`). References
for tests: gsplat's ``_isect_tiles`` (a Python loop, :func:`rh3dgs.ops._gsplat.isect_tiles_torch`)
and the vectorised :func:`rh3dgs.ops._ref._ref_isect_tiles`.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from ._backend import native_ops
from ._gsplat import isect_offset_encode_cuda, isect_tiles_cuda

__all__ = ["isect_tiles"]


@torch.no_grad()
def isect_tiles(
    means2d: Tensor, radii: Tensor, depths: Tensor, tile_size: int, tile_width: int, tile_height: int
) -> Tuple[Tensor, Tensor, Tensor]:
    """Intersect Gaussians with image tiles, sorted by (camera, tile, depth).

    Args:
        means2d: [B, N, 2] projected centres in pixels.
        radii:   [B, N] int pixel radii (0 = culled).
        depths:  [B, N] camera-space depths (> 0 for visible Gaussians).
        tile_size, tile_width, tile_height: tile grid.

    Returns:
        tiles_per_gauss [B, N] int32, isect_offsets [B, tile_height, tile_width] int32
        (start of each tile's run in ``flatten_ids``), flatten_ids [M] int32 (b * N + n).
    """
    if means2d.is_cuda:
        tiles_per_gauss, isect_ids, flatten_ids = isect_tiles_cuda(means2d, radii, depths, tile_size, tile_width,
                                                                   tile_height)
        offsets = isect_offset_encode_cuda(isect_ids, means2d.shape[0], tile_width, tile_height)
        return tiles_per_gauss, offsets, flatten_ids

    return native_ops().isect_tiles(means2d.detach(), radii, depths.detach(), int(tile_size), int(tile_width),
                                    int(tile_height))
