"""``lic_infonce``: the LIC multi-positive InfoNCE per anchor (native op, autograd).

For anchor ``a`` and its candidates ``j = candidates[a, k]`` of kind 1 (negative) or 2 (positive);
kind 0 entries are ignored (their index is not read, e.g. -1 padding):

    f = F.normalize(features),  s_aj = <f_a, f_j> / tau
    loss_a = log sum_{kind > 0} exp(s_aj) - mean_{kind = 2} s_aj      (0 when a has no positive)

which is -1/|P| sum_{p in P} log(exp(s_ap) / sum_j exp(s_aj)), the SupCon "L_out" form that
:class:`rh3dgs.lic.LICLoss` averages over anchors. The kernels read only the rows they touch and
write the gradient rows straight into dL/dfeatures; the torch formulation
(:func:`rh3dgs.ops._ref._ref_lic_infonce`) normalises all N rows and scatters the gathered
rows' gradients back with ``index_put``, which was most of an LIC step. The native forward also
returns the local derivatives (see csrc/cpu/lic.cpp), so the backward reads no candidate row.

Backends: CPU -> csrc/cpu/lic.cpp; CUDA -> csrc/cuda/lic.cu when built, else the reference.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ShapeError
from ._backend import has_native_kernel, native_ops
from ._ref import _ref_lic_infonce

__all__ = ["lic_infonce"]


class _LicInfoNCENative(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features, anchors, candidates, kinds, inv_tau):
        loss, anchor_feats, d_anchor, d_sim = native_ops().lic_infonce_fwd(features, anchors, candidates, kinds,
                                                                            inv_tau)
        ctx.save_for_backward(features, anchors, candidates, kinds, anchor_feats, d_anchor, d_sim)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad = native_ops().lic_infonce_bwd(*ctx.saved_tensors, grad_loss.float().contiguous())
        return grad, None, None, None, None


def lic_infonce(features: Tensor, anchors: Tensor, candidates: Tensor, kinds: Tensor, temperature: float) -> Tensor:
    """Per-anchor multi-positive InfoNCE.

    Args:
        features: [N, d] per-Gaussian features (normalised inside; differentiable).
        anchors: [A] long anchor indices.
        candidates: [A, K] long candidate indices (any value where ``kinds`` is 0).
        kinds: [A, K] uint8: 0 ignored, 1 negative, 2 positive.
        temperature: tau > 0.
    Returns:
        [A] loss per anchor (0 for anchors without a positive), differentiable w.r.t. ``features``.
    """
    if features.dim() != 2:
        raise ShapeError(f"lic_infonce: features must be [N, d], got {list(features.shape)}")
    if anchors.dim() != 1 or candidates.dim() != 2 or candidates.shape[0] != anchors.shape[0]:
        raise ShapeError(f"lic_infonce: anchors must be [A] and candidates [A, K], got {list(anchors.shape)} "
                         f"and {list(candidates.shape)}")
    if kinds.shape != candidates.shape:
        raise ShapeError(f"lic_infonce: kinds must be {list(candidates.shape)}, got {list(kinds.shape)}")
    dev = features.device
    if features.dtype != torch.float32 or not has_native_kernel("lic_infonce_fwd", dev):
        return _ref_lic_infonce(features, anchors, candidates, kinds, temperature)
    anchors, candidates = anchors.to(dev, torch.long).contiguous(), candidates.to(dev, torch.long).contiguous()
    kinds = kinds.to(dev, torch.uint8).contiguous()
    if dev.type != "cpu":  # the CPU kernel checks indices itself; a CUDA kernel cannot raise
        N = features.shape[0]
        used = candidates[kinds > 0]
        bad = ((anchors < 0) | (anchors >= N)).any() | ((used < 0) | (used >= N)).any() | (kinds > 2).any()
        if bool(bad):  # one device sync
            raise ShapeError(f"lic_infonce: an anchor or a used candidate is outside [0, {N}) or a kind is not 0, 1, 2")
    return _LicInfoNCENative.apply(features.contiguous(), anchors, candidates, kinds, 1.0 / float(temperature))
