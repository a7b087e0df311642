"""Training-free lift: per-Gaussian robust, reliability-weighted spherical Frechet means.

For Gaussian i, over every (view v, pixel u) it contributes to with compositing weight
alpha_i T_i(u) and VCD reliability w_bar_v(u), the lifted feature is

    mu_i = argmin_mu  sum_{v,u} alpha_i T_i(u) w_bar_v(u) rho_delta( d(mu, z_v(u)) )

The algorithm (:func:`lift`):

0. **Order**: the scene is lifted in Z-order (:func:`rh3dgs.gaussians.morton_order`), so the passes' reads
   and writes of per-Gaussian rows (means, sums) that one tile visits share cache lines and pages (the
   benchmark's passes 17-25 % faster than in the scene's own order); the results are returned in the
   scene's order. **Subspace** (teachers with D > ``LiftConfig.subspace``, e.g. CLIP's 512): the maps are seen through
   their top principal directions P [D, k] (z -> P^T z, renormalised); the means below are taken on the
   sphere of that subspace and mapped back, mu <- P mu.
1. **Initial pass**: the normalised weighted Euclidean mean, ``mu_i = normalize(sum w z)``, with per Gaussian
   its total weight and its mean transmittance where it composites (``visibility``).
2. **Validity**: Gaussians with too little weight, or seen only through the surfaces in front of them
   (visibility < ``min_visibility``), get no feature from the views.
3. **IRLS passes** (method "robust": Huber ``delta``; "karcher": delta = inf): each pass accumulates
   sum omega and sum omega Log_mu(z), omega = w min(1, delta / d(mu, z)), and steps
   mu <- Exp_mu(sum omega Log / sum omega), ``iters`` passes (default 1: the one-step estimator) or until
   the 99th percentile of the step angles is below ``tol``.
   A Gaussian's step depends on its own mean only, so one whose step fell below ``tol`` stops there and
   the later passes replay only the contributions of those still moving. Every second pass extrapolates
   each Gaussian's step to the end of its linear convergence (Aitken, :func:`aitken_factor`;
   ``LiftConfig.extrapolate``).
4. **Filling**: Gaussians without a feature take their observed 3D neighbours'
   (:func:`rh3dgs.lifting.fill.fill_from_neighbours`).
5. **Decoder**: uncentred weighted PCA of the features (:func:`pca_decoder`): latents and a linear decoder.

Each pass is one call of :meth:`rh3dgs.lifting.views.LiftViews.initial_pass` or ``irls_pass``, which streams
the views (teacher maps at any resolution, upsampled guided by the render's colours (``LiftConfig.guided``),
renders, VCD pixel weights) and keeps what fits between passes; nothing is stored per (pixel, Gaussian) pair
beyond those caches.

Ablation baselines behind the same call (``LiftConfig.method``): "robust" (ours), "karcher" (delta =
inf, same weights), "euclidean" (weighted Euclidean mean, then normalise: LUDVIG / gradient
back-projection); ``use_vcd=False`` gives uniform pixel weights (no VCD).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional

import torch
from torch import Tensor

from ..cameras import Cameras
from ..errors import ConfigError
from ..gaussians import Gaussians, morton_order
from ..method.sphere import sphere_exp_
from ..teachers.maps import ProjectedMaps, TeacherMaps, map_dim, principal_basis
from .config import LiftConfig
from .fill import fill_from_neighbours
from .views import LiftViews

__all__ = ["LiftResult", "lift", "pca_decoder", "aitken_factor", "initial_field"]


@dataclass
class LiftResult:
    """Output of :func:`lift` (N Gaussians, teacher dimension D, latent dimension d).

    features: [N, D] unit lifted features (zero rows where ``valid`` is False).
    weight:   [N] total compositing weight sum_{v,u} alpha T w_bar received.
    visibility: [N] mean transmittance where the Gaussian composites, weight / sum_{v,u} alpha w_bar.
    valid:    [N] bool, the Gaussian has a feature: observed (weight >= min_weight and visibility >=
              min_visibility) or filled from its neighbours.
    filled:   [N] bool, the feature was filled from observed 3D neighbours (a subset of ``valid``).
    latents:  [N, d] PCA coordinates (None if latent_dim = 0).
    decoder:  [D, d] linear decoder (orthonormal columns): z_hat = normalize(decoder @ f).
    info:     passes, per-pass step-angle quantile, timings.
    """

    features: Tensor
    weight: Tensor
    visibility: Tensor
    valid: Tensor
    latents: Optional[Tensor]
    decoder: Optional[Tensor]
    info: Dict[str, object]
    filled: Optional[Tensor] = None

    def field(self):
        """The lifted :class:`rh3dgs.field.SemanticField` (latents, decoder, valid, filled)."""
        from ..field import SemanticField

        return SemanticField(self.latents, self.decoder, self.valid, self.filled)


def aitken_factor(norms: Tensor, prev: Tensor, max_rate: float = 0.8) -> Tensor:
    """[N] Aitken's extrapolation factors of linearly converging steps: 1 / (1 - r), r = norms / prev.

    A fixed-point iteration that converges linearly takes steps s_k ~ r^k s_0 along a line; their sum from
    step k on is s_k / (1 - r), so stepping by s_k / (1 - r) lands where the iteration ends. r is each row's
    rate, the ratio of its step length ``norms`` to the previous one ``prev`` ([N] each); where it is not in
    (0, 1) (a step that grew, or none) the factor is 1, and r is clipped to ``max_rate`` (a factor of at most
    1 / (1 - max_rate)).

    >>> aitken_factor(torch.tensor([0.05, 0.2, 0.0]), torch.tensor([0.1, 0.1, 0.0]))
    tensor([2., 1., 1.])
    """
    r = norms / prev.clamp_min(1e-30)
    return torch.where((r > 0) & (r < 1), 1.0 / (1.0 - r.clamp_max(max_rate)), torch.ones_like(r))


def pca_decoder(features: Tensor, weight: Tensor, d: int, basis: Optional[Tensor] = None) -> tuple:
    """Uncentred weighted PCA: decoder [D, d] = top-d right singular vectors, latents = features @ decoder.

    Uncentred, so that the common direction of CLIP-like features (their cone axis) is
    the first component and the decoder needs no bias (keeps the linear query fast path).
    ``basis`` [D, k] (orthonormal columns): the features are given as their k coordinates in span(basis)
    (the lift's principal subspace); the PCA is then taken on the k x k moments (the same components,
    since every feature lies in that span) and the decoder returned in the full space, [D, d].
    """
    k = features.shape[1]
    d = min(d, k)
    w = weight.clamp_min(0).sqrt()[:, None]
    cov = (features * w).T @ (features * w)  # [k, k]
    evals, evecs = torch.linalg.eigh(cov.double())
    coords = evecs[:, torch.argsort(evals, descending=True)[:d]].float()  # [k, d]
    basis_full = coords if basis is None else basis @ coords  # [D, d]
    # deterministic sign: largest-magnitude entry of each column (in the full space) positive
    sign = torch.sign(basis_full.gather(0, basis_full.abs().argmax(0, keepdim=True)))
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    return basis_full * sign, features @ (coords * sign)


def lift(
    gaussians: Gaussians,
    cameras: Cameras,
    teacher_maps: TeacherMaps,
    cfg: Optional[LiftConfig] = None,
    progress: bool = True,
) -> LiftResult:
    """Lift per-view teacher feature maps into per-Gaussian unit features.

    Args:
        gaussians: the scene (CPU or CUDA; the native op runs where the tensors are).
        cameras:   B views.
        teacher_maps: [B, h, w, D] tensor, a sequence of [h, w, D] maps, or a callable
            ``i -> [h, w, D]`` (streaming); any resolution (bilinear to the image size),
            renormalised to unit length (zero vectors are ignored pixels).
        cfg: :class:`LiftConfig`.
    """
    cfg = cfg or LiftConfig()
    t0 = time.perf_counter()
    B, N = len(cameras), len(gaussians)
    basis = None  # [D, k]: the teacher's principal subspace (cfg.subspace)
    if cfg.subspace and B > 0 and map_dim(teacher_maps) > cfg.subspace:
        basis = principal_basis(teacher_maps, cfg.subspace, views=B).to(gaussians.device)
        teacher_maps = ProjectedMaps(teacher_maps, basis, B)
    order = morton_order(gaussians.means)  # the scene in space-filling-curve order (step 0; undone at the end)
    with torch.no_grad():  # a copy of what the lift reads (no graph for a trained model's parameters; its latents
        gaussians = replace(gaussians, latents=None, extra={})[order]  # and extra fields are not read)
    views = LiftViews(gaussians, cameras, teacher_maps, cfg)  # the view stream and its caches across passes
    weight, acc_v, mass = views.initial_pass(progress=progress)
    visibility = weight / mass.clamp_min(1e-30)
    valid = (weight >= cfg.min_weight) & (visibility >= cfg.min_visibility)
    mu = torch.nn.functional.normalize(acc_v, dim=-1) * valid[:, None]
    steps: List[float] = []
    if cfg.method != "euclidean":
        delta = cfg.delta if cfg.method == "robust" else math.inf
        active = valid.clone()  # Gaussians still moving: each one's IRLS depends on its own mean only
        prev: Optional[Tensor] = None  # the previous pass's step lengths, when that pass was not extrapolated
        for it in range(cfg.iters):
            acc_w, acc_v, _ = views.irls_pass(mu, delta, f"lift: IRLS pass {it + 1}", progress, active)
            step = acc_v.div_(acc_w.clamp_min(1e-12)[:, None]).mul_(active[:, None])  # in place: N x D floats each
            del acc_v
            norms = step.norm(dim=-1)
            if cfg.extrapolate and prev is not None:  # every second pass: the end of each one's geometric series
                step.mul_(aitken_factor(norms, prev, cfg.max_rate)[:, None])
                prev = None
            else:
                prev = norms
            mu = sphere_exp_(mu, step).mul_(valid[:, None])
            q_step = float(torch.quantile(norms[valid][:1_000_000], cfg.tol_quantile)) if bool(valid.any()) else 0.0
            steps.append(q_step)
            if q_step < cfg.tol:
                break
            active &= norms >= cfg.tol  # converged (step below tol): it stops here, the others go on
    view_info = views.release()  # before the PCA's N x D temporaries
    observed = valid
    filled = torch.zeros_like(valid)
    if cfg.fill and N > 0:
        mu, filled = fill_from_neighbours(gaussians.means, gaussians.base_colors, mu, observed, cfg.fill_neighbors,
                                          cfg.fill_color_sigma, cfg.fill_radius,
                                          confidence=visibility.clamp(0.0, 1.0) ** cfg.fill_visibility_power)
        valid = observed | filled
    latents = decoder = None
    if cfg.latent_dim > 0 and N > 0:  # in the subspace's coordinates when there is one (k x k moments)
        decoder, latents = pca_decoder(mu, weight * observed, cfg.latent_dim, basis)
        latents = latents * valid[:, None]
    inv = torch.empty_like(order)
    inv[order] = torch.arange(N, device=order.device)  # back to the scene's order
    mu, weight, visibility, valid, observed, filled = (t[inv] for t in (mu, weight, visibility, valid, observed, filled))
    latents = None if latents is None else latents[inv]
    if basis is not None:  # back to the teacher's space: unit rows stay unit (orthonormal columns)
        mu = mu @ basis.T
    info = {"method": cfg.method, "use_vcd": cfg.use_vcd, "guided": cfg.guided, "passes": 1 + len(steps),
            "subspace": None if basis is None else int(basis.shape[1]),
            "step_quantile_per_pass": steps, "seconds": time.perf_counter() - t0, "views": B, "gaussians": N,
            "valid": int(valid.sum()), "observed": int(observed.sum()), "filled": int(filled.sum()),
            "hidden": int(((weight >= cfg.min_weight) & ~observed).sum()), **view_info}
    return LiftResult(mu, weight, visibility, valid, latents, decoder, info, filled)


def initial_field(gaussians, cameras, teacher_maps, latent_dim: int, lift_cfg=None, progress: bool = False):
    """Latents [N, d], decoder [D, d] and the lift's result, from the training-free lift (the start of training)."""
    cfg = replace(lift_cfg or LiftConfig(), latent_dim=latent_dim)
    res = lift(gaussians, cameras, teacher_maps, cfg, progress=progress)
    return res.latents, res.decoder, res
