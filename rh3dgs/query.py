"""Text queries: their settings, phrase lists, relevancy (2D maps, per Gaussian) and 3D selection.

The one home of the query defaults and rules; the API (:class:`rh3dgs.api.Scene`), the CLI, both
viewers, the eval and the nerfstudio model call these functions.

Relevancy as in LERF: for a query embedding phi and the negatives phi_neg_j (by default
:data:`CANONICAL_NEGATIVES`), with s = cosine to the (decoded) feature,

    r = min_j softmax(tau * [s_q, s_neg_j])_0 = sigmoid(tau * (s_q - max_j s_neg_j))

(the two forms are equal; the second is cheaper and stable), tau = :data:`TEMPERATURE` = 10 as in
LERF. With no negatives, r = sigmoid(tau * s_q). A relevancy *map* is 0 where the render's
accumulated opacity is below :data:`MIN_ALPHA` (no surface there); a Gaussian without a valid
feature (``SemanticField.valid``) has relevancy 0; a Gaussian is *selected* when its relevancy is
above :data:`THRESHOLD`.

Shapes: N Gaussians, teacher dim D, latent dim d, Q positive / J negative queries, H x W pixels.

>>> import torch
>>> from rh3dgs.query import feature_relevancy, parse_queries
>>> parse_queries(" red ball ;blue box;; red ball")
('red ball', 'blue box')
>>> phi = torch.eye(3)[:2]                                  # two unit "text" vectors, D = 3
>>> feature_relevancy(torch.eye(3)[:1], phi, torch.eye(3)[2:]).round(decimals=4)   # feature = phi_0
tensor([[1.0000, 0.5000]])
"""
from __future__ import annotations

from typing import Annotated, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .errors import ConfigError, ShapeError
from .ranges import Range, check_value

__all__ = [
    "CANONICAL_NEGATIVES", "TEMPERATURE", "THRESHOLD", "MIN_ALPHA", "Threshold", "Temperature", "MinAlpha",
    "parse_queries", "format_queries",
    "relevancy_from_cosines", "feature_relevancy", "mask_low_alpha", "relevancy_maps", "gaussian_relevancy",
    "reduce_queries", "select_gaussians",
]

# ------------------------------------------------------------------------------ settings
CANONICAL_NEGATIVES: Tuple[str, ...] = ("object", "things", "stuff", "texture")
"""LERF's canonical negative phrases."""
TEMPERATURE: float = 10.0
"""tau of the pairwise softmax (LERF's value)."""
THRESHOLD: float = 0.5
"""Relevancy above which a Gaussian is selected (and a pixel highlighted in overlays)."""
Threshold = Annotated[float, Range(ge=0.0, le=1.0)]
"""The type of a selection threshold (relevancy is in [0, 1]): ``select --threshold``, the viewers' slider,
``Scene.select(threshold=...)``."""
Temperature = Annotated[float, Range(gt=0.0)]
"""The type of a relevancy temperature tau."""
MinAlpha = Annotated[float, Range(ge=0.0, le=1.0)]
"""The type of the accumulated-opacity floor of relevancy maps."""
MIN_ALPHA: float = 0.1
"""Pixels whose accumulated opacity is below this get relevancy 0 in relevancy maps."""


# ------------------------------------------------------------------------------ phrases
def parse_queries(text: Optional[str]) -> Tuple[str, ...]:
    """``"red ball; blue box;;red ball"`` -> ``("red ball", "blue box")``.

    Semicolon-separated; whitespace around and inside each phrase is normalised to single
    spaces; empty items and repeats are dropped (first occurrence kept).
    """
    out = []
    for part in (text or "").split(";"):
        q = " ".join(part.split())
        if q and q not in out:
            out.append(q)
    return tuple(out)


def format_queries(queries: Sequence[str]) -> str:
    """The inverse of :func:`parse_queries`: ``("a", "b")`` -> ``"a;b"``."""
    return ";".join(queries)


# ------------------------------------------------------------------------------ relevancy
def relevancy_from_cosines(pos: Tensor, neg: Tensor, temperature: float = TEMPERATURE) -> Tensor:
    """pos [..., Q] and neg [..., J] cosines -> relevancy [..., Q] in [0, 1].

    Equals min_j softmax(tau [pos, neg_j])_0; with no negatives (J = 0), sigmoid(tau * pos).
    """
    if neg.shape[-1] == 0:
        return torch.sigmoid(temperature * pos)
    return torch.sigmoid(temperature * (pos - neg.max(dim=-1, keepdim=True).values))


def feature_relevancy(features: Tensor, positives: Tensor, negatives: Tensor,
                      temperature: float = TEMPERATURE) -> Tensor:
    """Relevancy of unit teacher-space ``features`` [..., D] for unit queries [Q, D] vs negatives [J, D] -> [..., Q].

    The slow, explicit path (decoded features); for a field's latents use ``SemanticField.relevancy``
    (the same numbers in one native pass over the latents).
    """
    if features.shape[-1] != positives.shape[-1] or (negatives.numel() and negatives.shape[-1] != features.shape[-1]):
        raise ShapeError(f"feature dim {features.shape[-1]} does not match query dim {positives.shape[-1]}")
    return relevancy_from_cosines(features @ positives.T, features @ negatives.T, temperature)


def mask_low_alpha(relevancy: Tensor, alpha: Tensor, min_alpha: float = MIN_ALPHA) -> Tensor:
    """Zero, in place, the relevancy [H, W, Q] of pixels whose accumulated opacity ``alpha`` [H, W] is
    below ``min_alpha`` (NaN alpha too); returns ``relevancy``."""
    return relevancy.masked_fill_(~(alpha >= min_alpha)[..., None], 0.0)


def relevancy_maps(field, latent_map: Tensor, alpha: Tensor, positives: Tensor, negatives: Tensor,
                   temperature: float = TEMPERATURE, min_alpha: float = MIN_ALPHA) -> Tensor:
    """Rendered latents [H, W, d] + accumulated opacity [H, W] -> relevancy [Q, H, W] in [0, 1].

    ``field`` is the :class:`~rh3dgs.field.SemanticField` the latents belong to; ``positives``
    [Q, D] / ``negatives`` [J, D] are unit teacher-space query vectors. Pixels with
    ``alpha < min_alpha`` get 0 (:func:`mask_low_alpha`). Positives and negatives share one
    native pass over the pixels (one latent norm per pixel, ``SemanticField.relevancy``).
    """
    rel = field.relevancy(latent_map, positives, negatives, temperature)  # [H, W, Q]
    return mask_low_alpha(rel, alpha, min_alpha).permute(2, 0, 1)


def gaussian_relevancy(field, positives: Tensor, negatives: Tensor, temperature: float = TEMPERATURE) -> Tensor:
    """Per-Gaussian relevancy [Q, N] of ``field``'s latents (0 where ``field.valid`` is False)."""
    rel = field.relevancy(field.latents.to(positives), positives, negatives, temperature).T
    if field.valid is not None:
        rel = rel * field.valid.to(rel.device)[None]
    return rel


# ------------------------------------------------------------------------------ selection
def reduce_queries(relevancy: Tensor, index: Optional[int] = None) -> Tensor:
    """[Q, ...] relevancy -> [...]: query ``index``, or (``None``) the max over the queries."""
    if relevancy.shape[0] == 0:
        raise ConfigError("no queries to combine (give at least one positive query)")
    if index is None and relevancy.shape[0] > 1:
        return relevancy.max(dim=0).values
    return relevancy[0 if index is None else index]  # one query: its own map (a view), as the max over one


def select_gaussians(relevancy: Tensor, threshold: float = THRESHOLD, index: Optional[int] = None) -> Tensor:
    """bool [N]: Gaussians whose relevancy [Q, N] for query ``index`` (None: any query) is > ``threshold``."""
    check_value("threshold", threshold, Threshold)
    return reduce_queries(relevancy, index) > threshold
