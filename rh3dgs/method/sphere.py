"""Geometry on the unit hypersphere S^{D-1}: geodesic distance, Huber, robust Frechet means.

Everything here works on the last dimension of float tensors and is batched. The one
heavy function is :func:`robust_frechet_mean`, a segment-batched, weighted, Huber-robust
Frechet mean computed by Riemannian IRLS (Karcher) iterations::

    mu <- Exp_mu( sum_k omega_k Log_mu(x_k) / sum_k omega_k ),
    omega_k = w_k * min(1, delta / d(mu, x_k)).

Numerics (why we wrap geoopt instead of calling ``Sphere.logmap`` / ``Sphere.dist``):
geoopt's ``Sphere.dist`` is ``acos`` of the inner product clamped to ``1 - 1e-4`` in
float32 (``1 - 1e-7`` in float64), which floors every distance at 1.4e-2 rad (4.5e-4 rad
in float64) and so biases ``logmap`` for close points, and ``Sphere.expmap`` has a NaN
gradient at a zero tangent vector (``sin(0) / 0`` in the unselected ``torch.where``
branch). We therefore compute angles as ``atan2(|u|, <mu, x>)`` with ``u`` geoopt's tangent
projection (``Sphere.proju``), and the exponential map with a series expansion near zero;
both agree with geoopt's maps where those are accurate (tested).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Annotated, Any, Dict, Optional, Tuple, Union

import torch

with warnings.catch_warnings():  # geoopt uses torch.jit.script, deprecated in recent torch
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=FutureWarning)
    import geoopt

from ..errors import ConfigError, NonFiniteError, ShapeError
from ..ranges import Range, check_fields

__all__ = [
    "FrechetMeanConfig",
    "FrechetMeanInfo",
    "geodesic_distance",
    "huber",
    "huber_weight",
    "tangent_log",
    "sphere_exp",
    "sphere_exp_",
    "robust_frechet_mean",
]

Tensor = torch.Tensor
Delta = Union[float, Tensor]

#: geoopt's sphere; used for the tangent projection and the retraction.
_SPHERE = geoopt.manifolds.Sphere()


# --------------------------------------------------------------------------------------
# elementary maps
# --------------------------------------------------------------------------------------
#: samples closer than this many sqrt(eps) to ``-mu`` have no IRLS direction (see :func:`_irls`)
_ANTIPODAL = 8.0


def _small(dtype: torch.dtype) -> float:
    """Below this norm a tangent vector / sine is 'small' and series expansions are used."""
    return math.sqrt(torch.finfo(dtype).eps)


def _normalize(x: Tensor) -> Tensor:
    """Row-normalise ``x`` along the last dim; zero rows stay zero (finite gradient)."""
    n = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x / n.clamp_min(torch.finfo(x.dtype).tiny)


def geodesic_distance(x: Tensor, y: Tensor, keepdim: bool = False) -> Tensor:
    """Great-circle distance ``arccos(<x, y>)`` between unit vectors along the last dim.

    Computed as ``2 * atan2(|x - y|, |x + y|)``, which equals ``arccos(<x, y>)`` for unit
    vectors but is accurate (no ``acos`` clamp) and has finite gradients at 0 and pi
    (the subgradient 0 at the two non-differentiable points).

    Args:
        x, y: [..., D] unit vectors (broadcastable). Not re-normalised.
        keepdim: keep the last dim (size 1).
    Returns:
        [...] (or [..., 1]) angles in [0, pi].
    """
    a = torch.linalg.vector_norm(x - y, dim=-1, keepdim=keepdim)
    b = torch.linalg.vector_norm(x + y, dim=-1, keepdim=keepdim)
    return 2.0 * torch.atan2(a, b)


def huber(t: Tensor, delta: Delta) -> Tensor:
    """Huber function ``rho_delta(t) = t^2/2 if t <= delta else delta * (t - delta/2)``.

    Written as ``m * (t - m/2)`` with ``m = min(t, delta)`` so that ``delta = inf`` gives
    exactly ``t^2/2`` with finite gradients (no ``inf * 0``).

    Args:
        t: [...] non-negative values (angles).
        delta: positive float (``math.inf`` allowed) or tensor broadcastable to ``t``.
    Returns:
        [...] same shape as ``t``.
    """
    if isinstance(delta, Tensor):
        m = torch.minimum(t, delta.to(t.dtype))
    else:
        _check_delta(delta)
        m = t.clamp(max=float(delta))
    return m * (t - 0.5 * m)


def huber_weight(t: Tensor, delta: Delta) -> Tensor:
    """IRLS weight ``rho'(t) / t = min(1, delta / t)`` (1 at ``t = 0``).

    Args:
        t: [...] non-negative values; delta: as in :func:`huber`.
    Returns:
        [...] weights in (0, 1].
    """
    if not isinstance(delta, Tensor):
        _check_delta(delta)
        if math.isinf(delta):
            return torch.ones_like(t)
        delta = torch.as_tensor(float(delta), dtype=t.dtype, device=t.device)
    delta = delta.to(t.dtype)
    over = t > delta
    return torch.where(over, delta / torch.where(over, t, torch.ones_like(t)), torch.ones_like(t))


def _check_delta(delta: float) -> None:
    if not (float(delta) > 0.0):  # also rejects NaN
        raise ConfigError(f"Huber delta must be > 0 (math.inf for the squared loss), got {delta!r}")


def _log_parts(mu: Tensor, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Logarithm map with its angle and a 'defined' mask.

    Returns ``(v, theta, defined)``: ``v = Log_mu(x)`` [..., D], ``theta = d(mu, x)`` [...],
    ``defined`` [...] False where ``x`` is (numerically) antipodal to ``mu``; there the
    direction is undefined and ``v`` is set to 0.
    """
    c = (mu * x).sum(-1, keepdim=True)
    u = _SPHERE.proju(mu, x)  # x - <mu, x> mu
    s = torch.linalg.vector_norm(u, dim=-1, keepdim=True)
    theta = torch.atan2(s, c)
    thr = _small(x.dtype)
    big = s > thr
    s_safe = torch.where(big, s, torch.ones_like(s))
    ratio = torch.where(big, theta / s_safe, torch.where(c > 0, 1.0 + s * s / 6.0, torch.zeros_like(s)))
    defined = (big | (c > 0)).squeeze(-1)
    return u * ratio, theta.squeeze(-1), defined


def tangent_log(mu: Tensor, x: Tensor) -> Tensor:
    """Riemannian logarithm ``Log_mu(x)`` on the unit sphere.

    ``Log_mu(x) = theta * u / |u|`` with ``u = x - <mu, x> mu`` and ``theta = atan2(|u|, <mu, x>)``.
    Exactly antipodal points (within ~sqrt(eps)) have no defined direction and map to 0.

    Args:
        mu: [..., D] unit base points; x: [..., D] unit points (broadcastable).
    Returns:
        [..., D] tangent vectors at ``mu`` (orthogonal to ``mu``, norm = geodesic distance).
    """
    return _log_parts(mu, x)[0]


def sphere_exp(mu: Tensor, v: Tensor) -> Tensor:
    """Riemannian exponential ``Exp_mu(v) = cos|v| mu + sin|v| v/|v|`` on the unit sphere.

    Uses ``sinc`` by series below sqrt(eps) so the gradient is finite at ``v = 0`` and
    re-projects onto the sphere (geoopt ``projx``) to remove rounding drift. A zero ``mu``
    row (used for empty segments) maps to a zero row.

    Args:
        mu: [..., D] unit base points; v: [..., D] tangent vectors at ``mu``.
    Returns:
        [..., D] unit vectors.
    """
    n = torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    big = n > _small(v.dtype)
    n_safe = torch.where(big, n, torch.ones_like(n))
    sinc = torch.where(big, torch.sin(n) / n_safe, 1.0 - n * n / 6.0)
    return _normalize(torch.cos(n) * mu + sinc * v)


def sphere_exp_(mu: Tensor, v: Tensor) -> Tensor:
    """:func:`sphere_exp` computed in the memory of ``mu`` and ``v`` (both overwritten;
    the same operations, so the same bits). Returns ``mu``."""
    n = torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    big = n > _small(v.dtype)
    n_safe = torch.where(big, n, torch.ones_like(n))
    sinc = torch.where(big, torch.sin(n) / n_safe, 1.0 - n * n / 6.0)
    mu.mul_(torch.cos(n)).add_(v.mul_(sinc))
    return mu.div_(torch.linalg.vector_norm(mu, dim=-1, keepdim=True).clamp_min(torch.finfo(mu.dtype).tiny))


# --------------------------------------------------------------------------------------
# robust Frechet mean
# --------------------------------------------------------------------------------------
@dataclass
class FrechetMeanConfig:
    """Settings of robust_frechet_mean() (pass with **cfg.as_kwargs()); docs/method.md, section 1."""

    delta: Annotated[float, Range(gt=0, finite=False)] = math.inf
    """Huber threshold in radians (inf: the Karcher mean; small values approach the geodesic median)."""
    max_iters: Annotated[int, Range(ge=0)] = 50
    """Maximum number of IRLS iterations."""
    tol: Annotated[float, Range(ge=0)] = 1e-7
    """Stop when the largest step angle (radians) is below this (never below 10 machine epsilons)."""
    differentiable: bool = True
    """Return a mean that carries gradients to x (and to weights)."""
    backward: str = "implicit"
    """implicit (fixed-point gradient, memory O(K D)) or unrolled (through every iteration, O(iters K D))."""

    def __post_init__(self) -> None:
        check_fields(self)  # every numeric field against its declared Range (rh3dgs.ranges)
        if self.backward not in ("implicit", "unrolled"):
            raise ConfigError(f"FrechetMeanConfig.backward must be 'implicit' or 'unrolled', got {self.backward!r}")

    def as_kwargs(self) -> Dict[str, Any]:
        return dict(
            delta=self.delta,
            max_iters=self.max_iters,
            tol=self.tol,
            differentiable=self.differentiable,
            backward=self.backward,
        )


@dataclass
class FrechetMeanInfo:
    """Diagnostics of :func:`robust_frechet_mean` (attribute or ``info["key"]`` access).

    Fields:
        iters: number of IRLS iterations run.
        converged: whether the largest step fell below the tolerance.
        max_step: the largest step angle (rad) of the last iteration.
        valid: [S] bool, segment has a positive total weight (its mean is the weighted
            mean). Segments with samples but zero total weight get the unweighted mean.
        nonempty: [S] bool, segment has at least one sample; empty segments get a zero row.
    """

    iters: int
    converged: bool
    max_step: float
    valid: Tensor
    nonempty: Tensor

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)


def robust_frechet_mean(
    x: Tensor,
    weights: Optional[Tensor] = None,
    segment_ids: Optional[Tensor] = None,
    num_segments: Optional[int] = None,
    delta: float = math.inf,
    max_iters: int = 50,
    tol: float = 1e-7,
    init: Optional[Tensor] = None,
    differentiable: bool = True,
    backward: str = "implicit",
) -> Tuple[Tensor, FrechetMeanInfo]:
    """Weighted Huber-robust Frechet mean on the unit sphere, batched over segments.

    Minimises ``f_s(mu) = sum_{k in s} w_k rho_delta(d(mu, x_k))`` for every segment ``s``
    by IRLS / Karcher iterations ``mu <- Exp_mu(sum omega_k Log_mu(x_k) / sum omega_k)``
    with ``omega_k = w_k min(1, delta / d(mu, x_k))``.

    Initialisation: ``normalize(sum_k w_k x_k)`` per segment; when that Euclidean mean is
    (near) zero (e.g. an antipodal pair) the sample with the largest weight is used.
    ``init`` [S, D] overrides this for rows with non-zero norm.

    Degenerate inputs (all give finite values):
      * a segment whose weights are all zero: the unweighted robust mean of its samples,
        flagged ``info.valid[s] = False``;
      * an empty segment (no sample has its id): a zero row, ``info.nonempty[s] = False``;
      * one sample / identical samples: that sample;
      * an exactly antipodal sample has no defined log direction and does not move ``mu``
        (so an antipodal pair returns the heavier sample, a stationary point).

    Args:
        x: [K, D] points; rows are normalised internally (they should be unit already).
        weights: [K] non-negative weights (default ones).
        segment_ids: [K] long in ``0..S-1``; default: one segment.
        num_segments: S (default ``max(segment_ids) + 1``, or 1 without segment ids).
        delta: Huber threshold (rad), ``math.inf`` = Karcher mean.
        max_iters: maximum IRLS iterations; tol: step-angle stopping tolerance (rad).
        init: optional [S, D] starting points.
        differentiable: if False the whole computation runs under ``torch.no_grad``.
        backward: 'implicit' (exact gradient at the fixed point, cheap) or 'unrolled'
            (autograd through the iterations); see :class:`FrechetMeanConfig`.
    Returns:
        ``(mu, info)``: mu [S, D] unit rows (zero rows for empty segments), and a
        :class:`FrechetMeanInfo`.
    """
    cfg = FrechetMeanConfig(delta=delta, max_iters=max_iters, tol=tol, differentiable=differentiable, backward=backward)
    if x.dim() != 2:
        raise ShapeError(f"robust_frechet_mean: x must be [K, D], got {list(x.shape)}")
    if not x.is_floating_point():
        raise ShapeError(f"robust_frechet_mean: x must be a float tensor, got {x.dtype}")
    K, D = x.shape
    out_dtype = x.dtype
    dtype = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    device = x.device
    if not torch.isfinite(x).all():
        raise NonFiniteError("robust_frechet_mean: x contains NaN/Inf")

    w = _checked_weights(weights, K, dtype, device)
    seg, S = _checked_segments(segment_ids, num_segments, K, device)
    if init is not None and init.shape != (S, D):
        raise ShapeError(f"robust_frechet_mean: init must be [S, D]={[S, D]}, got {list(init.shape)}")

    grad_on = cfg.differentiable and torch.is_grad_enabled()
    with torch.set_grad_enabled(grad_on):
        xn = _normalize(x.to(dtype))
        w = w if grad_on else w.detach()

        with torch.no_grad():
            ones = torch.ones(K, dtype=dtype, device=device)
            count = torch.zeros(S, dtype=dtype, device=device).index_add_(0, seg, ones)
            wsum = torch.zeros(S, dtype=dtype, device=device).index_add_(0, seg, w.detach())
            nonempty = count > 0
            valid = wsum > 0
            zero_seg = nonempty & ~valid
        # segments whose weights are all zero: unweighted mean of their samples
        w_eff = torch.where(zero_seg[seg], torch.ones_like(w), w) if bool(zero_seg.any()) else w

        with torch.no_grad():
            mu0 = _initial_mean(xn.detach(), w_eff.detach(), seg, S, nonempty)
            if init is not None:
                i0 = init.detach().to(dtype)
                ok = torch.linalg.vector_norm(i0, dim=-1, keepdim=True) > 0
                mu0 = torch.where(ok & nonempty[:, None], _normalize(i0), mu0)

        tol_eff = max(cfg.tol, 10.0 * torch.finfo(dtype).eps)
        if grad_on and cfg.backward == "unrolled":
            mu, iters, converged, step = _irls(xn, w_eff, seg, S, cfg.delta, mu0, cfg.max_iters, tol_eff)
        else:
            with torch.no_grad():
                mu, iters, converged, step = _irls(xn.detach(), w_eff.detach(), seg, S, cfg.delta, mu0,
                                                   cfg.max_iters, tol_eff)
            if grad_on and (xn.requires_grad or w_eff.requires_grad):
                mu = _attach_implicit_grad(mu, xn, w_eff, seg, S, cfg.delta)

    info = FrechetMeanInfo(iters=iters, converged=converged, max_step=step, valid=valid, nonempty=nonempty)
    return mu.to(out_dtype), info


def _checked_weights(weights: Optional[Tensor], K: int, dtype: torch.dtype, device) -> Tensor:
    """[K] sample weights in ``dtype`` (ones when None), checked: the shape, finite, >= 0."""
    if weights is None:
        return torch.ones(K, dtype=dtype, device=device)
    if weights.shape != (K,):
        raise ShapeError(f"robust_frechet_mean: weights must be [K]={[K]}, got {list(weights.shape)}")
    w = weights.to(dtype)
    if not torch.isfinite(w).all():
        raise NonFiniteError("robust_frechet_mean: weights contain NaN/Inf")
    if (w < 0).any():
        raise ConfigError("robust_frechet_mean: weights must be >= 0")
    return w


def _checked_segments(segment_ids: Optional[Tensor], num_segments: Optional[int], K: int, device) -> Tuple[Tensor, int]:
    """``(seg [K] long, S)``: every sample's segment (all 0 when None) and the number of segments, checked."""
    if segment_ids is None:
        S = 1 if num_segments is None else int(num_segments)
        if S < 1:
            raise ShapeError(f"robust_frechet_mean: num_segments must be >= 1, got {S}")
        return torch.zeros(K, dtype=torch.long, device=device), S
    if segment_ids.shape != (K,) or segment_ids.is_floating_point():
        raise ShapeError(f"robust_frechet_mean: segment_ids must be an integer [K]={[K]} tensor, got "
                         f"{segment_ids.dtype} {list(segment_ids.shape)}")
    seg = segment_ids.to(device=device, dtype=torch.long)
    if num_segments is None:
        S = int(seg.max().item()) + 1 if K > 0 else 0
    else:
        S = int(num_segments)
    if K > 0 and (int(seg.min().item()) < 0 or int(seg.max().item()) >= S):
        raise ShapeError(f"robust_frechet_mean: segment_ids must lie in [0, {S - 1}]")
    return seg, S


def _initial_mean(xn: Tensor, w: Tensor, seg: Tensor, S: int, nonempty: Tensor) -> Tensor:
    """normalize(sum w x) per segment; the heaviest sample where that sum is ~0. [S, D]."""
    K, D = xn.shape
    m = torch.zeros(S, D, dtype=xn.dtype, device=xn.device).index_add_(0, seg, w[:, None] * xn)
    mn = torch.linalg.vector_norm(m, dim=-1, keepdim=True)
    wsum = torch.zeros(S, dtype=xn.dtype, device=xn.device).index_add_(0, seg, w)[:, None]
    rel = max(1e-6, 100.0 * torch.finfo(xn.dtype).eps)
    ok = mn > rel * wsum
    # fallback: first sample with the largest weight in its segment
    wmax = torch.full((S,), -math.inf, dtype=xn.dtype, device=xn.device).scatter_reduce(0, seg, w, "amax")
    ar = torch.arange(K, device=xn.device)
    cand = torch.where(w >= wmax[seg], ar, torch.full_like(ar, K))
    idx = torch.full((S,), K, dtype=torch.long, device=xn.device).scatter_reduce(0, seg, cand, "amin")
    fallback = xn[idx.clamp(max=max(K - 1, 0))] if K > 0 else torch.zeros(S, D, dtype=xn.dtype, device=xn.device)
    mu = torch.where(ok, m / mn.clamp_min(torch.finfo(xn.dtype).tiny), fallback)
    return torch.where(nonempty[:, None], mu, torch.zeros_like(mu))


def _irls(
    xn: Tensor, w: Tensor, seg: Tensor, S: int, delta: float, mu: Tensor, max_iters: int, tol: float
) -> Tuple[Tensor, int, bool, float]:
    """Huber-IRLS / Karcher iterations. Returns (mu [S, D], iters, converged, last max step).

    One step in its weighted-sum form, with ``c_k = <mu, x_k>`` and ``theta_k = atan2(s_k, c_k)``,
    ``s_k = sqrt(1 - c_k^2)``::

        step = sum_k a_k (x_k - c_k mu) / sum_k omega_k,   a_k = omega_k theta_k / s_k

    so an iteration reads the samples twice (``X mu`` and ``X^T a``; one segment: two
    matrix-vector products) instead of building ``Log_mu(x_k)`` row by row. ``s_k`` from
    ``1 - c_k^2`` is exact to ~sqrt(eps) rad, which only moves ``theta_k / s_k = 1 + theta^2/6``
    and a Huber weight that is 1 below ``delta``; samples within ``_ANTIPODAL`` of ``-mu``
    (no defined direction) do not pull.
    """
    D = xn.shape[1]
    one = S == 1
    tiny = torch.finfo(xn.dtype).tiny
    thr = _ANTIPODAL * _small(xn.dtype)
    iters, converged, step_max = 0, False, 0.0
    for it in range(1, max_iters + 1):
        c = (xn @ mu[0]) if one else (xn * mu[seg]).sum(-1)
        c = c.clamp(-1.0, 1.0)
        s = torch.sqrt((1.0 - c * c).clamp_min(tiny))
        theta = torch.atan2(s, c)
        omega = w * huber_weight(theta, delta)
        ratio = torch.where(s > thr, theta / s, (c > 0).to(xn.dtype))  # 0: antipodal, no direction
        a = omega * ratio
        if one:
            num = (a @ xn - (a * c).sum() * mu[0])[None]
            den = omega.sum()[None]
        else:
            num = torch.zeros(S, D, dtype=xn.dtype, device=xn.device).index_add(0, seg, a[:, None] * xn)
            num = num - torch.zeros(S, dtype=xn.dtype, device=xn.device).index_add(0, seg, a * c)[:, None] * mu
            den = torch.zeros(S, dtype=xn.dtype, device=xn.device).index_add(0, seg, omega)
        step = num / den.clamp_min(tiny)[:, None]
        step = step - (step * mu).sum(-1, keepdim=True) * mu  # in the tangent space (rounding)
        mu = sphere_exp(mu, step)
        iters = it
        step_max = float(torch.linalg.vector_norm(step.detach(), dim=-1).max().item()) if S > 0 else 0.0
        if step_max <= tol:
            converged = True
            break
    return mu, iters, converged, step_max


# --------------------------------------------------------------------------------------
# implicit gradient at the fixed point
# --------------------------------------------------------------------------------------
def _attach_implicit_grad(mu_star: Tensor, xn: Tensor, w: Tensor, seg: Tensor, S: int, delta: float) -> Tensor:
    """Return ``mu_star`` (value unchanged) carrying the implicit-function gradient.

    At the fixed point ``F(mu, x) = sum_k omega_k Log_mu(x_k) = -grad f(mu) = 0``, so
    ``d mu = H^{-1} dF`` with ``H`` the Riemannian Hessian of ``f`` at ``mu`` (tangent space).
    ``H = (sum_k w_k b_k) P + sum_k w_k (a_k - b_k) r_k r_k^T`` with ``r_k = Log/theta``,
    ``a_k = [theta_k <= delta]``, ``b_k = min(theta_k, delta) cot(theta_k)``.
    """
    mu_d = mu_star.detach()
    v, theta, defined = _log_parts(mu_d[seg], xn)
    omega = w * huber_weight(theta, delta)
    D = xn.shape[1]
    F = torch.zeros(S, D, dtype=xn.dtype, device=xn.device).index_add(0, seg, omega[:, None] * v)
    with torch.no_grad():
        th = theta.detach()
        wd = w.detach() * defined.to(th.dtype)
        hw = huber_weight(th, delta)
        small = th < 1e-4
        th_cot = torch.where(small, 1.0 - th * th / 3.0, th * torch.cos(th) / torch.sin(th).clamp_min(1e-6))
        b = hw * th_cot
        a = (th <= delta).to(th.dtype) if not math.isinf(delta) else torch.ones_like(th)
        r = v.detach() / torch.where(th > 0, th, torch.ones_like(th))[:, None]
        c = torch.zeros(S, dtype=xn.dtype, device=xn.device).index_add_(0, seg, wd * b)
        beta = wd * (a - b)
    return _ImplicitGrad.apply(F, mu_d, r, beta, c, seg)


def _hvp(v: Tensor, mu: Tensor, r: Tensor, beta: Tensor, c: Tensor, seg: Tensor) -> Tensor:
    """Riemannian Hessian-vector product, per segment. v [S, D] tangent at mu [S, D]."""
    pv = v - (mu * v).sum(-1, keepdim=True) * mu
    rv = (r * pv[seg]).sum(-1)
    low = torch.zeros_like(v).index_add_(0, seg, (beta * rv)[:, None] * r)
    out = c[:, None] * pv + low
    return out - (mu * out).sum(-1, keepdim=True) * mu


def _cg_solve(b: Tensor, mu: Tensor, r: Tensor, beta: Tensor, c: Tensor, seg: Tensor) -> Tensor:
    """Batched (per-segment) conjugate gradients for H x = b; truncated on non-positive curvature."""
    S, D = b.shape
    x = torch.zeros_like(b)
    res = b.clone()
    p = res.clone()
    rs = (res * res).sum(-1)
    rs0 = rs.clone()
    tiny = torch.finfo(b.dtype).tiny
    tol2 = (100.0 * torch.finfo(b.dtype).eps) ** 2
    active = rs > tiny
    for _ in range(min(D + 5, 1000)):
        if not bool(active.any()):
            break
        Ap = _hvp(p, mu, r, beta, c, seg)
        pAp = (p * Ap).sum(-1)
        active = active & (pAp > tiny)
        alpha = torch.where(active, rs / torch.where(active, pAp, torch.ones_like(pAp)), torch.zeros_like(rs))
        x = x + alpha[:, None] * p
        res = res - alpha[:, None] * Ap
        rs_new = (res * res).sum(-1)
        active = active & (rs_new > tol2 * rs0)
        betac = torch.where(active, rs_new / rs.clamp_min(tiny), torch.zeros_like(rs))
        p = res + betac[:, None] * p
        rs = rs_new
    return x


class _ImplicitGrad(torch.autograd.Function):
    """Identity on ``mu`` in the forward pass; maps the output gradient g to ``H^{-1} P g``
    as the gradient of ``F`` (so autograd continues into ``x`` / ``weights``)."""

    @staticmethod
    def forward(ctx, F: Tensor, mu: Tensor, r: Tensor, beta: Tensor, c: Tensor, seg: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(mu, r, beta, c, seg)
        return mu.clone()

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        mu, r, beta, c, seg = ctx.saved_tensors
        g_tan = g - (mu * g).sum(-1, keepdim=True) * mu
        lam = _cg_solve(g_tan, mu, r, beta, c, seg)
        return lam, None, None, None, None, None
