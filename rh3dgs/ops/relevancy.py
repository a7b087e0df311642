"""``relevancy``: per-row text-query relevancy of latents (native op on CPU).

rel[p, q] = sigmoid(tau (cos(q, f_p) - max_j cos(neg_j, f_p))) with cos(x, f) = <x, f> / |R f|,
for folded queries (decoder^T phi) and R^T R = decoder^T decoder (:attr:`SemanticField.norm_factor`).
The formula is :func:`rh3dgs.query.relevancy_from_cosines` of :meth:`SemanticField.cosine`;
:func:`rh3dgs.ops._ref._ref_relevancy` computes it with torch (used on other devices and by tests).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ShapeError
from ._backend import native_ops
from ._ref import _ref_relevancy

__all__ = ["relevancy"]


@torch.no_grad()
def relevancy(latents: Tensor, pos: Tensor, neg: Tensor, norm_factor: Tensor, temperature: float) -> Tensor:
    """[..., d] latents, pos [Q, d], neg [J, d], norm_factor [r, d], tau -> relevancy [..., Q] in [0, 1].

    Called through :meth:`rh3dgs.field.SemanticField.relevancy` (which folds the queries; the default
    temperature is :data:`rh3dgs.query.TEMPERATURE`).
    """
    d = latents.shape[-1]
    for name, t in (("pos", pos), ("neg", neg), ("norm_factor", norm_factor)):
        if t.dim() != 2 or t.shape[1] != d:
            raise ShapeError(f"relevancy: {name} must be [*, {d}], got {list(t.shape)}")
    if latents.device.type != "cpu":
        return _ref_relevancy(latents, pos, neg, norm_factor, temperature)
    rows = latents.reshape(-1, d)  # a view for a channel slice of a render (row stride kept)
    out = native_ops().relevancy(rows.float(), pos.float().contiguous(), neg.float().contiguous(),
                                 norm_factor.float().contiguous(), float(temperature))
    return out.reshape(*latents.shape[:-1], pos.shape[0])
