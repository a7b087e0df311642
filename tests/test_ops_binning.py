"""Tile binning vs gsplat's pure-torch reference (_isect_tiles / _isect_offset_encode) and the vectorised reference,
on every device present (CUDA: gsplat's kernels, whose stable radix sort gives the same order, ties included)."""
import math

import pytest
import torch

from rh3dgs.ops import isect_tiles
from rh3dgs.ops._gsplat import isect_offset_encode_torch as _isect_offset_encode
from rh3dgs.ops._gsplat import isect_tiles_torch as _isect_tiles


@pytest.mark.parametrize("B,N,W,H,tile", [(1, 50, 64, 48, 16), (2, 120, 70, 33, 16), (3, 40, 32, 32, 8)])
def test_binning_matches_gsplat_reference(B, N, W, H, tile, device):
    g = torch.Generator().manual_seed(N)
    means2d = torch.rand(B, N, 2, generator=g) * torch.tensor([W * 1.4, H * 1.4]) - torch.tensor([W * 0.2, H * 0.2])
    radii = (torch.rand(B, N, generator=g) * 20).int()
    radii[:, ::7] = 0  # culled
    depths = 0.5 + torch.rand(B, N, generator=g) * 10
    tw, th = math.ceil(W / tile), math.ceil(H / tile)
    tpg, offsets, fids = (t.cpu() for t in isect_tiles(means2d.to(device), radii.to(device), depths.to(device), tile,
                                                       tw, th))
    ref_tpg, ref_ids, ref_fids = _isect_tiles(means2d, radii, depths, tile, tw, th)
    ref_offsets = _isect_offset_encode(ref_ids, B, tw, th)
    assert torch.equal(tpg, ref_tpg)
    assert torch.equal(offsets, ref_offsets)
    assert torch.equal(fids, ref_fids)
    assert fids.numel() > N  # Gaussians span several tiles


def test_native_binning_matches_vectorised_reference_with_ties(device):
    from rh3dgs.ops._ref import _ref_isect_tiles

    g = torch.Generator().manual_seed(5)
    B, N, W, H, tile = 2, 3000, 200, 130, 16
    means2d = torch.rand(B, N, 2, generator=g) * torch.tensor([W * 1.2, H * 1.2]) - 10
    radii = (torch.rand(B, N, generator=g) * 40).int()
    depths = torch.randint(1, 20, (B, N), generator=g).float()  # many exact ties
    tw, th = math.ceil(W / tile), math.ceil(H / tile)
    nat = [t.cpu() for t in isect_tiles(means2d.to(device), radii.to(device), depths.to(device), tile, tw, th)]
    ref = _ref_isect_tiles(means2d, radii, depths, tile, tw, th)
    for a, b in zip(nat, ref):
        assert torch.equal(a, b)
    # inside every tile, depths are non-decreasing and ties keep Gaussian order
    offs = nat[1].reshape(-1).tolist() + [nat[2].numel()]
    d = depths.reshape(-1)[nat[2].long()]
    for s, e in zip(offs[:-1], offs[1:]):
        seg, ids = d[s:e], nat[2][s:e]
        assert torch.all(seg[1:] >= seg[:-1])
        same = seg[1:] == seg[:-1]
        assert torch.all(ids[1:][same] > ids[:-1][same])


def test_native_binning_sorts_depths_of_every_magnitude(device):
    """The radix sort's three 11-bit digits all vary (depths over six decades, one value repeated): the order
    of a sort by (depth, id), as the vectorised reference sorts (depths in front of the camera: positive)."""
    from rh3dgs.ops._ref import _ref_isect_tiles

    g = torch.Generator().manual_seed(7)
    B, N, W, H, tile = 3, 5000, 160, 96, 16
    means2d = torch.rand(B, N, 2, generator=g) * torch.tensor([W * 1.2, H * 1.2]) - 10
    radii = (torch.rand(B, N, generator=g) * 30).int()
    depths = 10 ** (torch.rand(B, N, generator=g) * 6 - 3)
    depths[:, ::17] = 2.5
    tw, th = math.ceil(W / tile), math.ceil(H / tile)
    nat = [t.cpu() for t in isect_tiles(means2d.to(device), radii.to(device), depths.to(device), tile, tw, th)]
    ref = _ref_isect_tiles(means2d, radii, depths, tile, tw, th)
    for a, b in zip(nat, ref):
        assert torch.equal(a, b)
    assert nat[2].numel() > 2 * B * N
