"""``rasterize_to_pixels``: one op, CPU and CUDA backends, autograd.

Composites per-Gaussian N-D features front to back (gsplat's contract) and also returns
the render statistics VCD needs: accumulated opacity A = sum_i w_i, and depth moments
D1 = sum_i w_i z_i, D2 = sum_i w_i z_i^2, with w_i = alpha_i T_i.

Backends, chosen by the device of the inputs (callers never branch):
  * CPU  -> ``torch.ops.rh3dgs.rasterize_fwd/bwd`` (C++/OpenMP, csrc/cpu/rasterize.cpp)
  * CUDA -> the same ops' CUDA kernels when the extension was built with CUDA
            (csrc/cuda/rasterize.cu), else gsplat's CUDA rasterizer with the depth
            moments composited as two extra channels.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ..errors import ShapeError
from ._backend import has_native_kernel, native_ops
from ._gsplat import rasterize_to_pixels_cuda

__all__ = ["RasterOutput", "rasterize_to_pixels"]


@dataclass
class RasterOutput:
    """Output of :func:`rasterize_to_pixels`.

    render: [B, H, W, C] composited features (+ T * background).
    alpha:  [B, H, W] accumulated opacity A.
    d1:     [B, H, W] first depth moment  sum_i w_i z_i.
    d2:     [B, H, W] second depth moment sum_i w_i z_i^2.
    """

    render: Tensor
    alpha: Tensor
    d1: Tensor
    d2: Tensor


class _RasterizeNative(torch.autograd.Function):
    @staticmethod
    def forward(ctx, means2d, conics, features, opacities, depths, backgrounds, width, height, tile_size,
                isect_offsets, flatten_ids, geometry_channels):
        ops = native_ops()
        render, alpha, d1, d2, last_ids = ops.rasterize_fwd(
            means2d, conics, features, opacities, depths, backgrounds, width, height, tile_size,
            isect_offsets, flatten_ids,
        )
        ctx.save_for_backward(means2d, conics, features, opacities, depths, backgrounds, isect_offsets,
                              flatten_ids, alpha, last_ids)
        ctx.dims = (width, height, tile_size, geometry_channels)
        ctx.mark_non_differentiable(last_ids)
        return render, alpha, d1, d2, last_ids

    @staticmethod
    def backward(ctx, v_render, v_alpha, v_d1, v_d2, _v_last):
        (means2d, conics, features, opacities, depths, backgrounds, isect_offsets, flatten_ids, alpha,
         last_ids) = ctx.saved_tensors
        width, height, tile_size, geometry_channels = ctx.dims
        zeros = lambda t, g: torch.zeros_like(t) if g is None else g.contiguous()  # noqa: E731
        v_render = zeros(torch.empty(*alpha.shape, features.shape[-1], device=alpha.device), v_render)
        v_alpha, v_d1, v_d2 = zeros(alpha, v_alpha), zeros(alpha, v_d1), zeros(alpha, v_d2)
        v_means2d, v_conics, v_features, v_opacities, v_depths = native_ops().rasterize_bwd(
            means2d, conics, features, opacities, depths, backgrounds, width, height, tile_size,
            isect_offsets, flatten_ids, alpha, last_ids, v_render, v_alpha, v_d1, v_d2, geometry_channels,
        )
        v_bg = None
        if backgrounds is not None and ctx.needs_input_grad[5]:
            v_bg = ((1 - alpha)[..., None] * v_render).sum(dim=(1, 2))
        return v_means2d, v_conics, v_features, v_opacities, v_depths, v_bg, None, None, None, None, None, None


def _rasterize_gsplat(means2d, conics, features, opacities, depths, backgrounds, width, height, tile_size,
                      isect_offsets, flatten_ids, geometry_channels: int = -1) -> RasterOutput:
    """CUDA fallback when rh3dgs was built without CUDA kernels: gsplat with [f, z, z^2] channels (the channels
    from ``geometry_channels`` on in a second call, on detached geometry)."""
    C = features.shape[-1]
    cg = C if geometry_channels < 0 else min(geometry_channels, C)
    if cg < C:
        tail = _rasterize_gsplat(means2d.detach(), conics.detach(), features[..., cg:], opacities.detach(),
                                 depths.detach(), None if backgrounds is None else backgrounds[:, cg:], width, height,
                                 tile_size, isect_offsets, flatten_ids)
        head = _rasterize_gsplat(means2d, conics, features[..., :max(cg, 1)], opacities, depths,
                                 None if backgrounds is None else backgrounds[:, :max(cg, 1)], width, height, tile_size,
                                 isect_offsets, flatten_ids)  # cg = 0: one channel for the statistics, dropped
        render = torch.cat([head.render[..., :cg], tail.render], dim=-1)
        return RasterOutput(render, head.alpha, head.d1, head.d2)
    stacked = torch.cat([features, depths[..., None], depths[..., None] ** 2], dim=-1)
    bg = None
    if backgrounds is not None:
        bg = torch.cat([backgrounds, backgrounds.new_zeros(backgrounds.shape[0], 2)], dim=-1)
    out, alpha = rasterize_to_pixels_cuda(means2d, conics, stacked, opacities, width, height, tile_size,
                                          isect_offsets, flatten_ids, backgrounds=bg)
    return RasterOutput(out[..., :C], alpha[..., 0], out[..., C], out[..., C + 1])


def rasterize_to_pixels(
    means2d: Tensor,
    conics: Tensor,
    features: Tensor,
    opacities: Tensor,
    depths: Tensor,
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: Tensor,
    flatten_ids: Tensor,
    backgrounds: Optional[Tensor] = None,
    geometry_channels: Optional[int] = None,
) -> RasterOutput:
    """Rasterize N-D features with render statistics.

    Args:
        means2d:   [B, N, 2] projected centres (pixels).
        conics:    [B, N, 3] inverse 2D covariances (a, b, c) = upper triangle.
        features:  [B, N, C] per-Gaussian features, any C >= 1.
        opacities: [B, N] activated opacities in [0, 1].
        depths:    [B, N] camera-space depths (for D1, D2).
        width, height, tile_size: image and tile size.
        isect_offsets: [B, TH, TW] int32, flatten_ids: [M] int32 from :func:`rh3dgs.ops.isect_tiles`.
        backgrounds: optional [B, C] background added with weight T (= 1 - A).
        geometry_channels: only the first ``geometry_channels`` channels pass their gradient on to the
            geometry (means2d, conics, opacities, depths); the others' gradients reach their features (and
            backgrounds) only, as if composited with detached weights. None: all channels. The backward then
            skips those channels' share of the alpha gradient (RGB + latents in one pass where only RGB
            shapes the Gaussians). A, D1 and D2 keep their gradients.

    Returns:
        :class:`RasterOutput`. Differentiable w.r.t. means2d, conics, features, opacities,
        depths and backgrounds.
    """
    if means2d.dim() != 3 or means2d.shape[-1] != 2:
        raise ShapeError(f"means2d must be [B, N, 2], got {list(means2d.shape)}")
    B, N = means2d.shape[:2]
    if features.dim() != 3 or features.shape[:2] != (B, N) or features.shape[2] < 1:
        raise ShapeError(f"features must be [B, N, C] with B={B}, N={N}, C>=1, got {list(features.shape)}")
    if backgrounds is not None and tuple(backgrounds.shape) != (B, features.shape[2]):
        raise ShapeError(f"backgrounds must be [B, C] = {[B, features.shape[2]]}, got {list(backgrounds.shape)}")
    args = [t.float().contiguous() for t in (means2d, conics, features, opacities, depths)]
    bg = None if backgrounds is None else backgrounds.float().contiguous()
    offs, fids = isect_offsets.int().contiguous(), flatten_ids.int().contiguous()
    cg = -1 if geometry_channels is None else int(geometry_channels)
    if geometry_channels is not None and cg < 0:
        raise ShapeError(f"geometry_channels must be >= 0 (or None: all), got {geometry_channels}")
    if means2d.is_cuda and not has_native_kernel("rasterize_fwd", means2d.device):
        return _rasterize_gsplat(*args, bg, width, height, tile_size, offs, fids, cg)
    render, alpha, d1, d2, _ = _RasterizeNative.apply(*args, bg, int(width), int(height), int(tile_size), offs, fids,
                                                      cg)
    return RasterOutput(render, alpha, d1, d2)
