"""Relevancy of text queries as in LERF, on pixels or Gaussians.

For a query embedding phi and canonical negatives phi_neg_j ("object", "things",
"stuff", "texture"), with s = cosine to the (decoded) feature:

    r = min_j softmax(tau * [s_q, s_neg_j])_0 = sigmoid(tau * (s_q - max_j s_neg_j))

(the two forms are equal; the second is cheaper and stable). tau = 10 as in LERF.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

import torch
from torch import Tensor

from .errors import ShapeError

__all__ = ["RelevancyConfig", "CANONICAL_NEGATIVES", "relevancy_from_cosines", "relevancy"]

CANONICAL_NEGATIVES: Tuple[str, ...] = ("object", "things", "stuff", "texture")


@dataclass
class RelevancyConfig:
    negatives: Tuple[str, ...] = field(default_factory=lambda: CANONICAL_NEGATIVES)
    """Negative phrases (canonical LERF negatives by default)."""
    temperature: float = 10.0
    """tau in the pairwise softmax."""


def relevancy_from_cosines(pos: Tensor, neg: Tensor, temperature: float = 10.0) -> Tensor:
    """pos [..., Q] and neg [..., J] cosines -> relevancy [..., Q] in [0, 1].

    Equals min_j softmax(tau [pos, neg_j])_0; with no negatives, sigmoid(tau * pos).
    """
    if neg.shape[-1] == 0:
        return torch.sigmoid(temperature * pos)
    return torch.sigmoid(temperature * (pos - neg.max(dim=-1, keepdim=True).values))


def relevancy(features: Tensor, positives: Tensor, negatives: Tensor, temperature: float = 10.0) -> Tensor:
    """Relevancy of unit ``features`` [..., D] for unit query embeddings [Q, D] vs negatives [J, D] -> [..., Q]."""
    if features.shape[-1] != positives.shape[-1] or (negatives.numel() and negatives.shape[-1] != features.shape[-1]):
        raise ShapeError(f"feature dim {features.shape[-1]} does not match query dim {positives.shape[-1]}")
    return relevancy_from_cosines(features @ positives.T, features @ negatives.T, temperature)
