"""``project_gaussians``: EWA projection of 3D Gaussians into pinhole cameras (autograd).

The contract of gsplat's ``fully_fused_projection`` (non-packed, pinhole): per (camera, Gaussian)
the world covariance ``R S S^T R^T`` from the quaternion and activated scales, the camera-space
mean ``R_v p + t_v`` and covariance ``R_v Sigma R_v^T``, the perspective Jacobian ``J`` (with the
mean clamped to 1.3x the field of view, as gsplat), ``cov2d = J Sigma_c J^T + eps2d I``, the conic
``cov2d^-1``, the depth ``z`` and the radius ``ceil(3 sqrt(lambda_max))`` (0 when culled: outside
(near, far) or the image).

Backends, chosen by the device (callers never branch):
  * CPU  -> ``torch.ops.rh3dgs.project_fwd/bwd`` (csrc/cpu/projection.cpp; one fused pass per
            Gaussian, deterministic gradients; about 250x faster than the torch formulation)
  * CUDA -> gsplat's fused CUDA kernel.
Reference: :func:`rh3dgs.ops._ref._ref_project_gaussians` (gsplat's pure-torch formulation).

Example::

    radii, means2d, depths, conics = project_gaussians(g.means, g.quats, g.activated_scales,
                                                       cams.viewmats, cams.Ks, cams.width, cams.height)
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from ..errors import ShapeError
from ._backend import native_ops
from ._gsplat import fully_fused_projection_cuda

__all__ = ["project_gaussians"]


class _ProjectNative(torch.autograd.Function):
    @staticmethod
    def forward(ctx, means, quats, scales, viewmats, Ks, width, height, eps2d, near_plane, far_plane):
        radii, means2d, depths, conics = native_ops().project_fwd(means, quats, scales, viewmats, Ks, width, height,
                                                                  eps2d, near_plane, far_plane)
        ctx.save_for_backward(means, quats, scales, viewmats, Ks, radii)
        ctx.dims = (width, height, eps2d)
        ctx.mark_non_differentiable(radii)
        return radii, means2d, depths, conics

    @staticmethod
    def backward(ctx, _v_radii, v_means2d, v_depths, v_conics):
        means, quats, scales, viewmats, Ks, radii = ctx.saved_tensors
        width, height, eps2d = ctx.dims
        B, N = radii.shape
        grad = lambda g, *shape: means.new_zeros(*shape) if g is None else g.contiguous()  # noqa: E731
        v_means, v_quats, v_scales, v_viewmats = native_ops().project_bwd(
            means, quats, scales, viewmats, Ks, width, height, eps2d, radii, grad(v_means2d, B, N, 2),
            grad(v_depths, B, N), grad(v_conics, B, N, 3), bool(ctx.needs_input_grad[3]),
        )
        return (v_means, v_quats, v_scales, v_viewmats if ctx.needs_input_grad[3] else None,
                None, None, None, None, None, None)


def project_gaussians(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    eps2d: float = 0.3,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Project N Gaussians into B cameras.

    Args:
        means:    [N, 3] world centres.
        quats:    [N, 4] rotations (w, x, y, z), any norm (normalised inside).
        scales:   [N, 3] activated scales (standard deviations).
        viewmats: [B, 4, 4] world-to-camera matrices (OpenCV axes).
        Ks:       [B, 3, 3] intrinsics.
        width, height: image size in pixels; eps2d, near_plane, far_plane: gsplat's meaning.

    Returns:
        radii [B, N] int32 (0 = culled), means2d [B, N, 2], depths [B, N], conics [B, N, 3].
        Differentiable w.r.t. means, quats, scales and viewmats (not Ks).
    """
    N = means.shape[0]
    if means.dim() != 2 or means.shape[1] != 3 or tuple(quats.shape) != (N, 4) or tuple(scales.shape) != (N, 3):
        raise ShapeError(f"project_gaussians: means [N,3], quats [N,4], scales [N,3] expected, got "
                         f"{list(means.shape)}, {list(quats.shape)}, {list(scales.shape)}")
    if viewmats.dim() != 3 or viewmats.shape[1:] != (4, 4) or tuple(Ks.shape) != (viewmats.shape[0], 3, 3):
        raise ShapeError(f"project_gaussians: viewmats [B,4,4] and Ks [B,3,3] expected, got "
                         f"{list(viewmats.shape)}, {list(Ks.shape)}")
    if means.is_cuda:
        radii, means2d, depths, conics = fully_fused_projection_cuda(
            means, quats, scales, viewmats, Ks, int(width), int(height), eps2d=eps2d, near_plane=near_plane,
            far_plane=far_plane,
        )
        return radii.int(), means2d, depths, conics
    args = [t.float().contiguous() for t in (means, quats, scales, viewmats, Ks)]
    return _ProjectNative.apply(*args, int(width), int(height), float(eps2d), float(near_plane), float(far_plane))
