"""Tile binning of projected Gaussians (vectorised torch; gsplat's layout and sort keys).

gsplat's own torch reference (``_isect_tiles``) loops in Python over Gaussians; this
version gives the same ``isect_offsets`` / ``flatten_ids`` contract in a few tensor ops,
so it runs at native speed on CPU. On CUDA tensors gsplat's kernels are used.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

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
        from gsplat.cuda._wrapper import isect_offset_encode
        from gsplat.cuda._wrapper import isect_tiles as gs_isect_tiles

        tiles_per_gauss, isect_ids, flatten_ids = gs_isect_tiles(
            means2d, radii, depths, tile_size, tile_width, tile_height, packed=False
        )
        offsets = isect_offset_encode(isect_ids, means2d.shape[0], tile_width, tile_height)
        return tiles_per_gauss, offsets, flatten_ids

    B, N = radii.shape
    device = means2d.device
    r = radii.to(means2d.dtype)
    tmin = torch.floor((means2d - r[..., None]) / tile_size).long()
    tmax = torch.ceil((means2d + r[..., None]) / tile_size).long()
    tmin[..., 0].clamp_(0, tile_width)
    tmin[..., 1].clamp_(0, tile_height)
    tmax[..., 0].clamp_(0, tile_width)
    tmax[..., 1].clamp_(0, tile_height)
    ext = tmax - tmin  # [B, N, 2]
    tiles_per_gauss = (ext[..., 0] * ext[..., 1]) * (radii > 0)
    counts = tiles_per_gauss.reshape(-1)
    total = int(counts.sum())
    n_tiles = tile_width * tile_height
    if total == 0:
        return (
            tiles_per_gauss.int(),
            torch.zeros(B, tile_height, tile_width, dtype=torch.int32, device=device),
            torch.zeros(0, dtype=torch.int32, device=device),
        )
    gid = torch.repeat_interleave(torch.arange(B * N, device=device), counts)  # flat b*N+n
    start = torch.cumsum(counts, 0) - counts
    local = torch.arange(total, device=device) - start[gid]
    ext_x = ext[..., 0].reshape(-1)[gid]
    tx = tmin[..., 0].reshape(-1)[gid] + local % ext_x
    ty = tmin[..., 1].reshape(-1)[gid] + local // ext_x
    cam = gid // N
    tile_key = cam * n_tiles + ty * tile_width + tx  # global tile index
    # One sort on gsplat's key: (global tile) << 32 | float bits of the depth. Depths of
    # visible Gaussians are > 0, where IEEE-754 bit patterns order like the values.
    d = depths.reshape(-1)[gid].float().contiguous()
    key = (tile_key << 32) | d.view(torch.int32).to(torch.int64)
    order = torch.sort(key).indices
    flatten_ids = gid[order].int()
    tile_counts = torch.bincount(tile_key, minlength=B * n_tiles)
    offsets = (torch.cumsum(tile_counts, 0) - tile_counts).int().reshape(B, tile_height, tile_width)
    return tiles_per_gauss.int(), offsets, flatten_ids
