"""``lic_infonce`` / ``lic_pull``: LIC's two forms per anchor (native ops, autograd).

For anchor ``a`` and its candidates ``j = candidates[a, k]`` of kind 1 (negative) or 2 (positive);
kind 0 entries are ignored (their index is not read, e.g. -1 padding):

    f = F.normalize(features),  s_aj = <f_a, f_j> / tau
    loss_a = log sum_{kind > 0} exp(s_aj) - mean_{kind = 2} s_aj      (0 when a has no positive)

which is -1/|P| sum_{p in P} log(exp(s_ap) / sum_j exp(s_aj)), the SupCon "L_out" form that
:class:`rh3dgs.method.lic.LICLoss` averages over anchors. The kernels read only the rows they touch and
write the gradient rows straight into dL/dfeatures; the torch formulation
(:func:`rh3dgs.ops._ref._ref_lic_infonce`) normalises all N rows and scatters the gathered
rows' gradients back with ``index_put``, which was most of an LIC step. The native forward also
returns the local derivatives (see csrc/cpu/lic.cpp), so the backward reads no candidate row.

``lic_pull`` takes the same inputs and gives LIC's pull form, ``loss_a = 1 - mean_{kind = 2} <f_a, f_j>``
(kind 1 entries are not read); its local derivatives have the same shape (``d_sim = -1/|P|`` on the
positives), so both forms share the backward op ``lic_infonce_bwd``.

Backends: CPU -> csrc/cpu/lic.cpp; CUDA -> csrc/cuda/lic.cu when built (``lic_pull``: its forward has no CUDA
kernel yet, so CUDA runs the reference :func:`rh3dgs.ops._ref._ref_lic_pull`), else the references.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ShapeError
from ._backend import has_native_kernel, native_ops
from ._ref import _ref_lic_infonce, _ref_lic_pull

__all__ = ["lic_infonce", "lic_pull"]


class _LicNative(torch.autograd.Function):
    """Either form's native forward (``lic_infonce_fwd`` with 1 / tau, ``lic_pull_fwd``) and their one backward."""

    @staticmethod
    def forward(ctx, features, anchors, candidates, kinds, inv_tau):
        ops = native_ops()
        fwd = ops.lic_pull_fwd(features, anchors, candidates, kinds) if inv_tau is None else \
            ops.lic_infonce_fwd(features, anchors, candidates, kinds, inv_tau)
        loss, anchor_feats, d_anchor, d_sim = fwd
        ctx.save_for_backward(features, anchors, candidates, kinds, anchor_feats, d_anchor, d_sim)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad = native_ops().lic_infonce_bwd(*ctx.saved_tensors, grad_loss.float().contiguous())
        return grad, None, None, None, None


def _checked(op: str, features: Tensor, anchors: Tensor, candidates: Tensor, kinds: Tensor):
    """Shapes checked; the index tensors on the features' device in the kernels' dtypes. Off the CPU the indices
    are checked here (one device sync): a CUDA kernel cannot raise, and an index out of range in the reference's
    gather is a device-side assert that ends the process's CUDA context. On CPU the kernels check them."""
    if features.dim() != 2:
        raise ShapeError(f"{op}: features must be [N, d], got {list(features.shape)}")
    if anchors.dim() != 1 or candidates.dim() != 2 or candidates.shape[0] != anchors.shape[0]:
        raise ShapeError(f"{op}: anchors must be [A] and candidates [A, K], got {list(anchors.shape)} "
                         f"and {list(candidates.shape)}")
    if kinds.shape != candidates.shape:
        raise ShapeError(f"{op}: kinds must be {list(candidates.shape)}, got {list(kinds.shape)}")
    dev = features.device
    anchors, candidates = anchors.to(dev, torch.long).contiguous(), candidates.to(dev, torch.long).contiguous()
    kinds = kinds.to(dev, torch.uint8).contiguous()
    if dev.type != "cpu":
        N = features.shape[0]
        used = candidates[kinds > 0]
        bad = ((anchors < 0) | (anchors >= N)).any() | ((used < 0) | (used >= N)).any() | (kinds > 2).any()
        if bool(bad):
            raise ShapeError(f"{op}: an anchor or a used candidate is outside [0, {N}) or a kind is not 0, 1, 2")
    return anchors, candidates, kinds


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
    anchors, candidates, kinds = _checked("lic_infonce", features, anchors, candidates, kinds)
    dev = features.device
    if features.dtype != torch.float32 or not has_native_kernel("lic_infonce_fwd", dev):
        return _ref_lic_infonce(features, anchors, candidates, kinds, temperature)
    return _LicNative.apply(features.contiguous(), anchors, candidates, kinds, 1.0 / float(temperature))


def lic_pull(features: Tensor, anchors: Tensor, candidates: Tensor, kinds: Tensor) -> Tensor:
    """Per-anchor pull to the mean of the positives: ``1 - mean_{kind = 2} cos(f_a, f_j)``.

    Args:
        features: [N, d] per-Gaussian features (normalised inside; differentiable).
        anchors: [A] long anchor indices.
        candidates: [A, K] long candidate indices (rows read only where ``kinds`` is 2; as for :func:`lic_infonce`,
            the CPU kernel checks every index whose kind is not 0).
        kinds: [A, K] uint8: 2 positive; 1 (the InfoNCE's negatives) and 0 leave the loss unchanged.
    Returns:
        [A] loss per anchor in [0, 2] (0 for anchors without a positive), differentiable w.r.t. ``features``.

    Example::

        >>> x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]])
        >>> lic_pull(x, torch.tensor([0]), torch.tensor([[1, 2]]), torch.tensor([[2, 2]], dtype=torch.uint8))
        tensor([0.5000])
    """
    anchors, candidates, kinds = _checked("lic_pull", features, anchors, candidates, kinds)
    if features.dtype != torch.float32 or not has_native_kernel("lic_pull_fwd", features.device):  # CPU kernel only
        return _ref_lic_pull(features, anchors, candidates, kinds)
    return _LicNative.apply(features.contiguous(), anchors, candidates, kinds, None)
