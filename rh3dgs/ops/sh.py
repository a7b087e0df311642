"""``sh_colors``: view-dependent colours from spherical-harmonics coefficients (degree 0-3).

``colors[b, n] = sum_k Y_k(d) coeffs[n, k]`` with ``d = normalise(means[n] - campos[b])`` and
gsplat's real SH bases and order (the raw sum: the renderer adds 0.5 and clamps at 0).

Backends, chosen by the device (callers never branch):
  * CPU  -> ``torch.ops.rh3dgs.sh_fwd`` (csrc/cpu/sh.cpp, one pass per pair in registers, about
            30x faster than the torch formulation at degree 3); gradients come from the torch
            reference recomputed in the backward (training runs it once, as before).
  * CUDA -> gsplat's ``spherical_harmonics`` kernel.
Reference: gsplat's ``_spherical_harmonics`` (:func:`rh3dgs.ops._ref._ref_sh_colors`).

Example::

    campos = torch.linalg.inv(cams.viewmats)[:, :3, 3]
    rgb = (sh_colors(g.sh_degree, g.means, campos, g.sh_coeffs) + 0.5).clamp_min(0)   # [B, N, 3]
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ShapeError
from ._backend import native_ops
from ._gsplat import spherical_harmonics_cuda

__all__ = ["sh_colors"]


class _SHNative(torch.autograd.Function):
    @staticmethod
    def forward(ctx, degree, means, campos, coeffs):
        ctx.degree = degree
        ctx.save_for_backward(means, campos, coeffs)
        return native_ops().sh_fwd(degree, means, campos, coeffs)

    @staticmethod
    def backward(ctx, v_colors):
        from ._ref import _ref_sh_colors

        leaves = [t.detach().requires_grad_(need) for t, need in zip(ctx.saved_tensors, ctx.needs_input_grad[1:])]
        with torch.enable_grad():
            out = _ref_sh_colors(ctx.degree, *leaves)
            wanted = [t for t in leaves if t.requires_grad]
            grads = iter(torch.autograd.grad(out, wanted, v_colors) if wanted else ())
        return (None, *[next(grads) if t.requires_grad else None for t in leaves])


def sh_colors(degree: int, means: Tensor, campos: Tensor, coeffs: Tensor) -> Tensor:
    """Raw SH colours [B, N, 3] of N Gaussians seen from B camera centres.

    Args:
        degree: SH degree 0-3 (uses the first (degree + 1)^2 coefficients).
        means:  [N, 3] Gaussian centres; campos: [B, 3] camera centres (world).
        coeffs: [N, K, 3] SH coefficients, K >= (degree + 1)^2.

    Returns:
        [B, N, 3], differentiable w.r.t. means, campos and coeffs.
    """
    N = means.shape[0]
    nb = (degree + 1) ** 2
    if not 0 <= degree <= 3 or means.dim() != 2 or means.shape[1] != 3 or campos.dim() != 2 or campos.shape[1] != 3 \
            or coeffs.dim() != 3 or coeffs.shape[0] != N or coeffs.shape[1] < nb or coeffs.shape[2] != 3:
        raise ShapeError(f"sh_colors: degree 0-3, means [N,3], campos [B,3], coeffs [N,K>={nb},3] expected, got "
                         f"{degree}, {list(means.shape)}, {list(campos.shape)}, {list(coeffs.shape)}")
    if means.is_cuda:
        dirs = means[None] - campos[:, None, :]
        return spherical_harmonics_cuda(degree, dirs, coeffs[None].expand(campos.shape[0], -1, -1, -1))
    return _SHNative.apply(int(degree), means.float().contiguous(), campos.float().contiguous(),
                           coeffs.float().contiguous())
