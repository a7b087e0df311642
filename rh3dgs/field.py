"""SemanticField: per-Gaussian latents + a linear decoder into teacher space.

z_hat = normalize(decoder @ f) with decoder [D, d]. Rendering composites the latents f
with the colour weights; the decoder is applied per pixel after compositing. Queries
fold into latent space (``<phi, Dec F> = <Dec^T phi, F>``; the norm |Dec F| = |R F| with
R from the decoder's QR), so a text query costs one d-dimensional dot product per pixel.
Relevancy, its defaults and the per-Gaussian scores are defined in :mod:`rh3dgs.query`;
:meth:`SemanticField.relevancy` is their fast path over latents.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .errors import ShapeError
from .query import TEMPERATURE, gaussian_relevancy

__all__ = ["SemanticField"]


def decoder_factor(decoder: Tensor) -> Tensor:
    """[D, d] decoder -> [r, d] R of its reduced QR (decoder = Q R, Q with orthonormal columns), r = min(D, d).

    Q maps R's coordinates isometrically into the teacher space, so every length, inner product and
    cosine of decoded latents is the same in d dimensions: ``<decoder f, decoder g> = <R f, R g>``,
    ``cos(decoder f, decoder g) = cos(R f, R g)``; anything that only compares decoded features
    (cosines, spherical means, LIC) may run on ``f @ R.T`` instead of ``f @ decoder.T`` at d/D the
    cost. Differentiable in ``decoder``.

    Example::

        >>> dec = torch.randn(64, 8, dtype=torch.float64); f, g = torch.randn(2, 8, dtype=torch.float64)
        >>> R = decoder_factor(dec)
        >>> bool(torch.isclose(torch.cosine_similarity(dec @ f, dec @ g, 0), torch.cosine_similarity(R @ f, R @ g, 0)))
        True
    """
    return torch.linalg.qr(decoder, mode="reduced" if decoder.requires_grad else "r")[1]


@dataclass
class SemanticField:
    """latents [N, d], decoder [D, d] (teacher dim D), optional per-Gaussian ``valid`` [N] bool (has a
    feature) and ``filled`` [N] bool (the feature was filled from 3D neighbours, not observed)."""

    latents: Tensor
    decoder: Tensor
    valid: Optional[Tensor] = None
    filled: Optional[Tensor] = None

    def __post_init__(self) -> None:
        if self.latents.dim() != 2 or self.decoder.dim() != 2 or self.decoder.shape[1] != self.latents.shape[1]:
            raise ShapeError(f"SemanticField: latents [N, d] and decoder [D, d] must agree on d, got "
                             f"{list(self.latents.shape)} and {list(self.decoder.shape)}")

    @property
    def dim(self) -> int:
        """Teacher dimension D."""
        return self.decoder.shape[0]

    @property
    def latent_dim(self) -> int:
        return self.decoder.shape[1]

    @property
    def gram(self) -> Tensor:
        """[d, d] decoder^T decoder (the norm of a decoded vector in latent terms)."""
        return self.decoder.T @ self.decoder

    @property
    def norm_factor(self) -> Tensor:
        """[r, d] R with R^T R = gram (R of the decoder's reduced QR): |decoder f| = |R f|."""
        return decoder_factor(self.decoder.double()).to(self.decoder.dtype)

    def decode(self, latents: Optional[Tensor] = None) -> Tensor:
        """[..., d] latents -> [..., D] unit teacher-space features (zero where the latent is zero)."""
        f = self.latents if latents is None else latents
        return torch.nn.functional.normalize(f @ self.decoder.T, dim=-1)

    def fold_queries(self, phi: Tensor) -> Tensor:
        """[Q, D] unit queries -> [Q, d] latent-space query vectors decoder^T phi."""
        if phi.shape[-1] != self.dim:
            raise ShapeError(f"queries have dimension {phi.shape[-1]} but the field's teacher space has {self.dim}")
        return phi @ self.decoder

    def cosine(self, latents: Tensor, phi: Tensor) -> Tensor:
        """Cosine between decoded ``latents`` [..., d] and unit queries phi [Q, D] -> [..., Q] (fast path).

        One [.., d] x [d, Q + r] product gives the numerators <decoder^T phi, f> and R f, whose
        length is |decoder f| (0 latents: cosine 0).
        """
        q = self.fold_queries(phi.to(latents))  # [Q, d]
        Q, d = q.shape
        y = latents.reshape(-1, d) @ torch.cat([q.T, self.norm_factor.to(latents).T], 1)
        norm = torch.linalg.vector_norm(y[:, Q:], dim=1, keepdim=True).clamp_min(1e-12)
        return (y[:, :Q] / norm).reshape(*latents.shape[:-1], Q)

    def relevancy(self, latents: Tensor, positives: Tensor, negatives: Tensor,
                  temperature: float = TEMPERATURE) -> Tensor:
        """LERF relevancy of decoded ``latents`` [..., d] for unit queries [Q, D] vs negatives [J, D] -> [..., Q].

        :func:`rh3dgs.query.relevancy_from_cosines` of :meth:`cosine`, in one native pass
        (:func:`rh3dgs.ops.relevancy` on the folded queries); equals
        :func:`rh3dgs.query.feature_relevancy` of :meth:`decode`.
        """
        from .ops import relevancy

        pos = self.fold_queries(positives.to(latents))
        neg = self.fold_queries(negatives.to(latents)) if negatives.numel() else pos.new_zeros(0, pos.shape[1])
        return relevancy(latents, pos, neg, self.norm_factor.to(latents), temperature)

    def gaussian_relevancy(self, positives: Tensor, negatives: Tensor, temperature: float = TEMPERATURE) -> Tensor:
        """Per-Gaussian relevancy [Q, N] (0 where ``valid`` is False): :func:`rh3dgs.query.gaussian_relevancy`."""
        return gaussian_relevancy(self, positives, negatives, temperature)

    def to(self, device) -> "SemanticField":
        return SemanticField(self.latents.to(device), self.decoder.to(device),
                             None if self.valid is None else self.valid.to(device),
                             None if self.filled is None else self.filled.to(device))
