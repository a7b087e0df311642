"""``rasterize_to_pixels``: one op, CPU and CUDA backends, autograd.

Composites per-Gaussian N-D features front to back (gsplat's contract) and also returns
the render statistics VCD needs: accumulated opacity A = sum_i w_i, and depth moments
D1 = sum_i w_i z_i, D2 = sum_i w_i z_i^2, with w_i = alpha_i T_i.

Backends, chosen by the device of the inputs (callers never branch):
  * CPU  -> ``torch.ops.rh3dgs.rasterize_fwd/bwd`` (C++/OpenMP, csrc/cpu/rasterize.cpp)
  * CUDA -> the same ops' CUDA kernels when the extension was built with CUDA
            (csrc/cuda/rasterize.cu), else gsplat's CUDA rasterizer with the depth
            moments composited as two extra channels.

On CPU a forward can also record the (Gaussian, pixel) contributions it composites
(``record=True``, ``torch.ops.rh3dgs.rasterize_record``, about 13 bytes each):
:func:`rh3dgs.ops.aggregate_sphere_replay` then runs aggregation passes over those views with any
pixel features and weights without compositing them again (the lift's passes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..errors import ShapeError
from ._backend import has_native_kernel, native_ops
from ._gsplat import rasterize_to_pixels_cuda

__all__ = ["Contributions", "RasterOutput", "rasterize_to_pixels"]


@dataclass
class Contributions:
    """The (Gaussian, pixel) contributions a recording forward composited (CPU), one list per tile in
    compositing order (rows, and in each row the Gaussians front to back).

    seg_offsets, pair_offsets: [tiles+1] int64 list offsets into ``segments`` and the per-pair arrays.
    segments: [S, 3] int32 (Gaussian index, flat index into [B, H, W] of the segment's first pixel, count).
    lanes: [P] uint8 pixel = first + lane; weights: [P] w_i = alpha_i T_i; masses: [P] alpha_i.
    num_gaussians: N; image_shape: (B, H, W) of the recorded render.
    """

    seg_offsets: Tensor
    pair_offsets: Tensor
    segments: Tensor
    lanes: Tensor
    weights: Tensor
    masses: Tensor
    num_gaussians: int
    image_shape: Tuple[int, int, int]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.seg_offsets, self.pair_offsets, self.segments,
                                                           self.lanes, self.weights, self.masses))

    def gaussian_ids(self) -> Tensor:
        """[P] int64: the Gaussian of every contribution."""
        return torch.repeat_interleave(self.segments[:, 0].long(), self.segments[:, 2].long())

    def pixels(self) -> Tensor:
        """[P] int64: the flat index into [B, H, W] of every contribution's pixel (segment's first + lane)."""
        return torch.repeat_interleave(self.segments[:, 1].long(), self.segments[:, 2].long()) + self.lanes.long()


@dataclass
class RasterOutput:
    """Output of :func:`rasterize_to_pixels`.

    render: [B, H, W, C] composited features (+ T * background).
    alpha:  [B, H, W] accumulated opacity A.
    d1:     [B, H, W] first depth moment  sum_i w_i z_i.
    d2:     [B, H, W] second depth moment sum_i w_i z_i^2.
    contributions: what the forward composited (``record=True``), else None.
    """

    render: Tensor
    alpha: Tensor
    d1: Tensor
    d2: Tensor
    contributions: Optional[Contributions] = None


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
    record: bool = False,
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
        record: CPU, no gradients: also return the composited :class:`Contributions` (the same outputs).

    Returns:
        :class:`RasterOutput`. Differentiable w.r.t. means2d, conics, features, opacities,
        depths and backgrounds (not with ``record``).
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
    if record:
        if means2d.device.type != "cpu":
            raise NotImplementedError("rasterize_to_pixels(record=True) is a CPU forward")
        with torch.no_grad():
            r = native_ops().rasterize_record(*args, bg, int(width), int(height), int(tile_size), offs, fids)
        return RasterOutput(r[0], r[1], r[2], r[3], Contributions(*r[5:], num_gaussians=N,
                                                                  image_shape=(B, int(height), int(width))))
    if means2d.is_cuda and not has_native_kernel("rasterize_fwd", means2d.device):
        return _rasterize_gsplat(*args, bg, width, height, tile_size, offs, fids, cg)
    render, alpha, d1, d2, _ = _RasterizeNative.apply(*args, bg, int(width), int(height), int(tile_size), offs, fids,
                                                      cg)
    return RasterOutput(render, alpha, d1, d2)
