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

Past one process (:mod:`rh3dgs.lifting.shard`): each rank of a ``torch.distributed`` group renders its share of the
views over the Gaussians they see, and once per pass the sums go to the rank owning each block of Gaussians, which
finishes its rows (steps 2-5 are per Gaussian; the quantile, the fill's neighbours and the PCA's moments are the
few things shared). ``lift(..., checkpoint=FOLDER)`` keeps the state after each pass, so that a rerun resumes
after the last completed one (:mod:`rh3dgs.lifting.checkpoint`).

Ablation baselines behind the same call (``LiftConfig.method``): "robust" (ours), "karcher" (delta =
inf, same weights), "euclidean" (weighted Euclidean mean, then normalise: LUDVIG / gradient
back-projection); ``use_vcd=False`` gives uniform pixel weights (no VCD).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Union

import torch
from torch import Tensor

from ..cameras import Cameras
from ..distributed import DistInfo, broadcast, current
from ..errors import ConfigError
from ..gaussians import Gaussians, morton_order
from ..method.sphere import sphere_exp_
from ..teachers.maps import ProjectedMaps, TeacherMaps, map_dim, principal_basis
from .checkpoint import PassCheckpoint, fingerprint
from .config import LiftConfig
from .fill import fill_from_neighbours
from .shard import LiftShard
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
    info:     passes, per-pass step-angle quantile, timings (a distributed lift: the ranks' shares).
    rows:     None, or in a distributed lift the scene rows [n] whose features this process holds
              (``features`` is then [n, D]: its block; every other field covers the whole scene).
    """

    features: Tensor
    weight: Tensor
    visibility: Tensor
    valid: Tensor
    latents: Optional[Tensor]
    decoder: Optional[Tensor]
    info: Dict[str, object]
    filled: Optional[Tensor] = None
    rows: Optional[Tensor] = None

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


def pca_decoder(features: Tensor, weight: Tensor, d: int, basis: Optional[Tensor] = None,
                total: Optional[Callable[[Tensor], Tensor]] = None) -> tuple:
    """Uncentred weighted PCA: decoder [D, d] = top-d right singular vectors, latents = features @ decoder.

    Uncentred, so that the common direction of CLIP-like features (their cone axis) is
    the first component and the decoder needs no bias (keeps the linear query fast path).
    ``basis`` [D, k] (orthonormal columns): the features are given as their k coordinates in span(basis)
    (the lift's principal subspace); the PCA is then taken on the k x k moments (the same components,
    since every feature lies in that span) and the decoder returned in the full space, [D, d].
    ``total``: the rows are one block of a distributed lift; it sums the blocks' k x k moments over the ranks
    (:func:`rh3dgs.distributed.all_reduce`), so every rank gets the same decoder and its block's latents.
    """
    k = features.shape[1]
    d = min(d, k)
    w = weight.clamp_min(0).sqrt()[:, None]
    cov = (features * w).T @ (features * w)  # [k, k]
    if total is not None:
        cov = total(cov)
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
    checkpoint: Optional[Union[str, Path]] = None,
    distributed: Optional[bool] = None,
) -> LiftResult:
    """Lift per-view teacher feature maps into per-Gaussian unit features.

    Args:
        gaussians: the scene (CPU or CUDA; the native op runs where the tensors are).
        cameras:   B views.
        teacher_maps: [B, h, w, D] tensor, a sequence of [h, w, D] maps, or a callable
            ``i -> [h, w, D]`` (streaming); any resolution (bilinear to the image size),
            renormalised to unit length (zero vectors are ignored pixels).
        cfg: :class:`LiftConfig`.
        checkpoint: a folder for the state after each pass (:class:`rh3dgs.lifting.checkpoint.PassCheckpoint`): a
            rerun with the same inputs and settings resumes after the last completed pass.
        distributed: inside an initialised ``torch.distributed`` group of K > 1 processes (None: whenever there
            is one), every rank calls ``lift`` with the same arguments and takes its share
            (:mod:`rh3dgs.lifting.shard`): its views, the Gaussians they see, a block of N / K Gaussians it owns.
            Every rank gets ``weight``, ``visibility``, ``valid``, ``filled``, ``latents`` and ``decoder`` of the
            whole scene; ``features`` holds its block only, the scene rows ``LiftResult.rows``.
    """
    cfg = cfg or LiftConfig()
    t0 = time.perf_counter()
    B, N = len(cameras), len(gaussians)
    group = current() if distributed is not False else None
    if distributed and group is None:
        raise ConfigError("lift(distributed=True) needs an initialised torch.distributed group of more than one "
                          "process (torchrun; rh3dgs.distributed.process_group_from_env)")
    basis = None  # [D, k]: the teacher's principal subspace (cfg.subspace)
    if cfg.subspace and B > 0 and map_dim(teacher_maps) > cfg.subspace:
        basis = _subspace_basis(teacher_maps, cfg.subspace, B, gaussians.device, group)
        teacher_maps = ProjectedMaps(teacher_maps, basis, B)
    order = morton_order(gaussians.means)  # the scene in space-filling-curve order (step 0; undone at the end)
    with torch.no_grad():  # a copy of what the lift reads (no graph for a trained model's parameters; its latents
        gaussians = replace(gaussians, latents=None, extra={})[order]  # and extra fields are not read)
    shard = LiftShard.make(gaussians, cameras, cfg, group)  # this process's views, seen Gaussians, owned block
    saved = None
    if checkpoint is not None:
        key = fingerprint(gaussians.means, gaussians.quats, gaussians.scales, gaussians.opacities, gaussians.sh0,
                          cameras.viewmats, cameras.Ks, (cameras.width, cameras.height), B, map_dim(teacher_maps),
                          basis, repr(cfg))
        saved = PassCheckpoint(Path(checkpoint), key, shard.start, shard.end, group)
    state = saved.load(gaussians.device) if saved is not None else None
    # the view stream and its caches across passes
    views = LiftViews(shard.scene(gaussians), shard.cameras(cameras), shard.maps(teacher_maps), cfg)
    mu, weight, visibility, valid, steps, pass_seconds = _passes(views, shard, cfg, saved, state,
                                                                 progress and shard.is_main)
    view_info = views.release()  # before the PCA's N x D temporaries
    observed = valid
    filled = torch.zeros_like(valid)
    if cfg.fill and N > 0:
        mu, filled = fill_from_neighbours(gaussians.means, gaussians.base_colors, mu, shard.gather(observed),
                                          cfg.fill_neighbors, cfg.fill_color_sigma, cfg.fill_radius,
                                          confidence=shard.gather(visibility).clamp(0.0, 1.0) ** cfg.fill_visibility_power,
                                          start=shard.start, fetch=shard.fill_source(mu))
        valid = observed | filled
    latents = decoder = None
    if cfg.latent_dim > 0 and N > 0:  # in the subspace's coordinates when there is one (k x k moments)
        decoder, latents = pca_decoder(mu, weight * observed, cfg.latent_dim, basis, total=shard.total)
        latents = latents * valid[:, None]
    inv = torch.empty_like(order)
    inv[order] = torch.arange(N, device=order.device)  # back to the scene's order
    rows = None if shard.group is None else order[shard.start:shard.end]  # the scene rows of this rank's block
    weight, visibility, valid, observed, filled = (shard.gather(t)[inv] for t in (weight, visibility, valid, observed,
                                                                                  filled))
    if shard.group is None:
        mu = mu[inv]
    latents = None if latents is None else shard.gather(latents)[inv]
    if basis is not None:  # back to the teacher's space: unit rows stay unit (orthonormal columns)
        mu = mu @ basis.T
    info = {"method": cfg.method, "use_vcd": cfg.use_vcd, "guided": cfg.guided, "passes": 1 + len(steps),
            "subspace": None if basis is None else int(basis.shape[1]),
            "step_quantile_per_pass": steps, "seconds_per_pass": pass_seconds, "seconds": time.perf_counter() - t0,
            "views": B, "gaussians": N,
            "valid": int(valid.sum()), "observed": int(observed.sum()), "filled": int(filled.sum()),
            "hidden": int(((weight >= cfg.min_weight) & ~observed).sum()), **view_info, **shard.info()}
    if state is not None:
        info["resumed_after_pass"] = int(state["pass"])
    return LiftResult(mu, weight, visibility, valid, latents, decoder, info, filled, rows)


def _passes(views: LiftViews, shard: LiftShard, cfg: LiftConfig, saved: Optional[PassCheckpoint],
            state: Optional[dict], show: bool) -> tuple:
    """Steps 1-3 of :func:`lift` over this process's block (after ``state``'s pass when resumed), each pass saved
    to ``saved``: ``(mu, weight, visibility, observed, steps, seconds per pass)``."""
    pass_seconds: List[float] = []  # each pass run here: its views, the combination, the owners' update
    if state is None:
        t_pass = time.perf_counter()
        weight, acc_v, mass = shard.combine(views.initial_pass(shard.label("lift: initial mean"), show))
        visibility = weight / mass.clamp_min(1e-30)
        valid = (weight >= cfg.min_weight) & (visibility >= cfg.min_visibility)
        mu = torch.nn.functional.normalize(acc_v, dim=-1) * valid[:, None]
        del acc_v, mass
        active = valid.clone()  # Gaussians still moving: each one's IRLS depends on its own mean only
        prev: Optional[Tensor] = None  # the previous pass's step lengths, when that pass was not extrapolated
        steps: List[float] = []
        done = cfg.method == "euclidean" or cfg.iters == 0
        pass_seconds.append(time.perf_counter() - t_pass)
        if saved is not None:
            saved.save(0, steps, done, mu=mu, weight=weight, visibility=visibility, observed=valid, active=active)
    else:  # resumed after pass state["pass"]
        mu, weight, visibility, valid = state["mu"], state["weight"], state["visibility"], state["observed"]
        active, prev, steps, done = state["active"], state["prev"], state["steps"], state["done"]
    if cfg.method != "euclidean" and not done:
        delta = cfg.delta if cfg.method == "robust" else math.inf
        for it in range(len(steps), cfg.iters):
            t_pass = time.perf_counter()
            acc_w, acc_v, _ = shard.combine(views.irls_pass(shard.spread(mu), delta, shard.label(f"lift: IRLS pass "
                                                                                                f"{it + 1}"), show,
                                                            shard.spread(active)), keep=2)
            step = acc_v.div_(acc_w.clamp_min(1e-12)[:, None]).mul_(active[:, None])  # in place: N x D floats each
            del acc_v
            norms = step.norm(dim=-1)
            if cfg.extrapolate and prev is not None:  # every second pass: the end of each one's geometric series
                step.mul_(aitken_factor(norms, prev, cfg.max_rate)[:, None])
                prev = None
            else:
                prev = norms
            mu = sphere_exp_(mu, step).mul_(valid[:, None])
            q_step = shard.quantile(norms, valid, cfg.tol_quantile)
            steps.append(q_step)
            done = q_step < cfg.tol or it + 1 == cfg.iters
            if not done:
                active &= norms >= cfg.tol  # converged (step below tol): it stops here, the others go on
            pass_seconds.append(time.perf_counter() - t_pass)
            if saved is not None:
                saved.save(it + 1, steps, done, mu=mu, weight=weight, visibility=visibility, observed=valid,
                           active=active, prev=prev)
            if done:
                break
    return mu, weight, visibility, valid, steps, pass_seconds


def _subspace_basis(teacher_maps: TeacherMaps, k: int, views: int, device: torch.device,
                    group: Optional[DistInfo]) -> Tensor:
    """:func:`principal_basis` of the maps, on the lift's device; in a group computed by rank 0 and broadcast."""
    if group is None:
        return principal_basis(teacher_maps, k, views=views).to(device)
    if group.is_main:
        basis = principal_basis(teacher_maps, k, views=views).to(device)
    else:
        basis = torch.empty(map_dim(teacher_maps), min(k, map_dim(teacher_maps)), device=device)
    return broadcast(basis)


def initial_field(gaussians, cameras, teacher_maps, latent_dim: int, lift_cfg=None, progress: bool = False,
                  checkpoint: Optional[Union[str, Path]] = None, distributed: Optional[bool] = None):
    """Latents [N, d], decoder [D, d] and the lift's result, from the training-free lift (the start of training;
    in a ``torch.distributed`` group, the distributed lift: every rank gets the whole scene's latents)."""
    cfg = replace(lift_cfg or LiftConfig(), latent_dim=latent_dim)
    res = lift(gaussians, cameras, teacher_maps, cfg, progress=progress, checkpoint=checkpoint,
               distributed=distributed)
    return res.latents, res.decoder, res
