"""rh3dgs.method.sphere: distances, Huber, robust Frechet means (checked against brute force)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from rh3dgs.errors import ConfigError, NonFiniteError, ShapeError
from rh3dgs.method.sphere import (
    FrechetMeanConfig,
    geodesic_distance,
    huber,
    huber_weight,
    robust_frechet_mean,
    sphere_exp,
    tangent_log,
)

F64 = torch.float64


# ------------------------------------------------------------------ helpers (numpy, independent)
def np_objective(mu: np.ndarray, X: np.ndarray, w: np.ndarray, delta: float) -> float:
    mu = mu / np.linalg.norm(mu)
    t = np.arccos(np.clip(X @ mu, -1.0, 1.0))
    rho = np.where(t <= delta, 0.5 * t * t, delta * (t - 0.5 * delta)) if np.isfinite(delta) else 0.5 * t * t
    return float((w * rho).sum())


def np_exp_chart(p: np.ndarray):
    """Chart v in R^{D-1} -> Exp_p(B v) with B an orthonormal basis of the tangent space at p."""
    D = p.shape[0]
    q, _ = np.linalg.qr(np.concatenate([p[:, None], np.eye(D)], 1))
    B = q[:, 1:D]  # columns orthogonal to p

    def chart(v: np.ndarray) -> np.ndarray:
        u = B @ v
        n = np.linalg.norm(u)
        return p if n == 0 else np.cos(n) * p + np.sin(n) * u / n

    return chart


def brute_force_mean(X: np.ndarray, w: np.ndarray, delta: float, starts) -> np.ndarray:
    """Minimise the Huber objective by Nelder-Mead in exponential charts from several starts."""
    best = None
    for p in starts:
        p = p / np.linalg.norm(p)
        chart = np_exp_chart(p)
        res = minimize(lambda v: np_objective(chart(v), X, w, delta), np.zeros(X.shape[1] - 1), method="Nelder-Mead",
                       options=dict(xatol=1e-10, fatol=1e-14, maxiter=40000, maxfev=40000, adaptive=True))
        # polish from the Nelder-Mead point in a fresh chart
        p2 = chart(res.x)
        chart2 = np_exp_chart(p2)
        res2 = minimize(lambda v: np_objective(chart2(v), X, w, delta), np.zeros(X.shape[1] - 1), method="Nelder-Mead",
                        options=dict(xatol=1e-11, fatol=1e-15, maxiter=40000, maxfev=40000, adaptive=True))
        cand = chart2(res2.x)
        val = np_objective(cand, X, w, delta)
        if best is None or val < best[0]:
            best = (val, cand)
    return best[1]


def fibonacci_sphere(n: int) -> np.ndarray:
    i = np.arange(n) + 0.5
    z = 1 - 2 * i / n
    phi = i * math.pi * (3 - math.sqrt(5))
    r = np.sqrt(1 - z * z)
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], 1)


def cluster(n: int, D: int, sigma: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n unit vectors scattered (tangent Gaussian, std sigma rad) around a random centre, and weights."""
    g = torch.Generator().manual_seed(seed)
    c = torch.nn.functional.normalize(torch.randn(D, generator=g, dtype=F64), dim=0)
    v = torch.randn(n, D, generator=g, dtype=F64) * sigma
    v = v - (v @ c)[:, None] * c
    x = sphere_exp(c.expand(n, D), v)
    w = 0.2 + 0.8 * torch.rand(n, generator=g, dtype=F64)
    return x, w


def angle(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(geodesic_distance(a.reshape(-1), b.reshape(-1)))


# ------------------------------------------------------------------ elementary maps
def test_geodesic_distance_matches_arccos_and_has_finite_grads():
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(100, 5, generator=g, dtype=F64), dim=-1)
    y = torch.nn.functional.normalize(torch.randn(100, 5, generator=g, dtype=F64), dim=-1)
    ref = torch.arccos((x * y).sum(-1).clamp(-1, 1))
    assert torch.allclose(geodesic_distance(x, y), ref, atol=1e-12)
    # tiny angles are accurate (acos would lose them)
    e = torch.tensor([1.0, 0.0, 0.0], dtype=F64)
    t = torch.tensor([math.cos(1e-9), math.sin(1e-9), 0.0], dtype=F64)
    assert abs(float(geodesic_distance(e, t)) - 1e-9) < 1e-15
    for other in (e, -e):
        xx = e.clone().requires_grad_(True)
        d = geodesic_distance(xx, other)
        (huber(d, 0.5) + d).backward()
        assert torch.isfinite(xx.grad).all()
    assert abs(float(geodesic_distance(e, -e)) - math.pi) < 1e-12


def test_huber_values_and_infinite_delta():
    t = torch.tensor([0.0, 0.1, 0.3, 2.0], dtype=F64, requires_grad=True)
    out = huber(t, 0.3)
    expect = torch.tensor([0.0, 0.005, 0.045, 0.3 * (2.0 - 0.15)], dtype=F64)
    assert torch.allclose(out, expect, atol=1e-15)
    out.sum().backward()
    assert torch.allclose(t.grad, torch.tensor([0.0, 0.1, 0.3, 0.3], dtype=F64))
    t2 = t.detach().clone().requires_grad_(True)
    out2 = huber(t2, math.inf)
    out2.sum().backward()
    assert torch.allclose(out2, 0.5 * t2.detach() ** 2) and torch.allclose(t2.grad, t2.detach())
    assert torch.allclose(huber_weight(t.detach(), 0.3), torch.tensor([1.0, 1.0, 1.0, 0.15], dtype=F64))
    with pytest.raises(ConfigError):
        huber(t, 0.0)


def test_log_exp_agree_with_geoopt_and_invert():
    import geoopt

    S = geoopt.manifolds.Sphere()
    x, _ = cluster(50, 6, 0.8, seed=1)
    mu = torch.nn.functional.normalize(torch.randn(6, generator=torch.Generator().manual_seed(2), dtype=F64), dim=0)
    mu = mu.expand(50, 6)
    v = tangent_log(mu, x)
    assert torch.allclose(v, S.logmap(mu, x), atol=1e-9)
    assert torch.allclose(sphere_exp(mu, v), S.expmap(mu, v), atol=1e-12)
    assert torch.allclose(sphere_exp(mu, v), x, atol=1e-12)
    assert torch.allclose(torch.linalg.vector_norm(v, dim=-1), geodesic_distance(mu, x), atol=1e-12)
    # finite gradient of exp at the zero tangent vector (geoopt's is NaN there)
    z = torch.zeros(1, 6, dtype=F64, requires_grad=True)
    sphere_exp(mu[:1], z).sum().backward()
    assert torch.isfinite(z.grad).all()


# ------------------------------------------------------------------ Frechet mean vs brute force
@pytest.mark.parametrize("delta", [0.25, math.inf])
def test_frechet_mean_matches_brute_force_on_S2(delta):
    x, w = cluster(40, 3, 0.4, seed=3)
    mu, info = robust_frechet_mean(x, w, delta=delta, max_iters=500, tol=1e-12)
    assert info.converged
    X, W = x.numpy(), w.numpy()
    grid = fibonacci_sphere(4000)
    vals = np.array([np_objective(g, X, W, delta) for g in grid])
    starts = [grid[i] for i in np.argsort(vals)[:3]]
    ref = brute_force_mean(X, W, delta, starts)
    assert angle(mu[0], torch.from_numpy(ref)) < 1e-3
    assert np_objective(mu[0].numpy(), X, W, delta) <= np_objective(ref, X, W, delta) + 1e-10


@pytest.mark.parametrize("delta", [0.3, math.inf])
def test_frechet_mean_matches_brute_force_on_S7(delta):
    x, w = cluster(60, 8, 0.35, seed=4)
    mu, info = robust_frechet_mean(x, w, delta=delta, max_iters=500, tol=1e-12)
    assert info.converged
    X, W = x.numpy(), w.numpy()
    starts = [X.mean(0), X[0], X[1]]
    ref = brute_force_mean(X, W, delta, starts)
    assert angle(mu[0], torch.from_numpy(ref)) < 1e-3
    assert np_objective(mu[0].numpy(), X, W, delta) <= np_objective(ref, X, W, delta) + 1e-10


def test_huber_mean_resists_30_percent_outliers():
    """70 inliers (tangent std 0.05 rad) at the pole, 30 outliers uniform on a 20-deg cap
    centred 100 deg away. Huber is not redescending: its bias is about
    n_out * delta / n_in, i.e. ~0.043 rad = 2.5 deg for delta = 0.1 and ~5 deg for 0.2."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(70, 2, generator=g, dtype=F64) * 0.05
    inl = torch.nn.functional.normalize(torch.cat([v, torch.ones(70, 1, dtype=F64)], -1), dim=-1)
    z = 1 - torch.rand(30, generator=g, dtype=F64) * (1 - math.cos(math.radians(20)))
    phi = torch.rand(30, generator=g, dtype=F64) * 2 * math.pi
    r = torch.sqrt(1 - z * z)
    cap = torch.stack([r * torch.cos(phi), r * torch.sin(phi), z], -1)
    c, s = math.cos(math.radians(100)), math.sin(math.radians(100))
    rot = torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=F64)
    x = torch.cat([inl, cap @ rot.T])
    inlier_mean = torch.nn.functional.normalize(inl.mean(0), dim=0)
    euclid = torch.nn.functional.normalize(x.mean(0), dim=0)
    deg = lambda m: math.degrees(angle(m, inlier_mean))  # noqa: E731
    mu01, _ = robust_frechet_mean(x, delta=0.1, max_iters=300, tol=1e-10)
    mu02, _ = robust_frechet_mean(x, delta=0.2, max_iters=300, tol=1e-10)
    karcher, _ = robust_frechet_mean(x, max_iters=300, tol=1e-10)
    assert deg(mu01[0]) < 3.5
    assert deg(mu02[0]) < 6.0
    assert deg(euclid) > 15.0
    assert deg(karcher[0]) > 15.0


# ------------------------------------------------------------------ batching and degenerate inputs
def test_segments_equal_separate_calls():
    xs, ws = [], []
    for i, n in enumerate([5, 17, 1, 30]):
        x, w = cluster(n, 4, 0.5, seed=10 + i)
        xs.append(x)
        ws.append(w)
    seg = torch.cat([torch.full((x.shape[0],), i, dtype=torch.long) for i, x in enumerate(xs)])
    perm = torch.randperm(seg.numel(), generator=torch.Generator().manual_seed(0))
    X, W, seg = torch.cat(xs)[perm], torch.cat(ws)[perm], seg[perm]
    mu, info = robust_frechet_mean(X, W, seg, delta=0.3, max_iters=400, tol=1e-13)
    assert mu.shape == (4, 4) and bool(info.valid.all())
    for i in range(4):
        ref, _ = robust_frechet_mean(xs[i], ws[i], delta=0.3, max_iters=400, tol=1e-13)
        assert torch.allclose(mu[i], ref[0], atol=1e-10)


def test_degenerate_inputs_are_finite_and_defined():
    x, w = cluster(6, 5, 0.3, seed=5)
    # one sample
    mu, info = robust_frechet_mean(x[:1])
    assert torch.allclose(mu[0], x[0], atol=1e-12) and info.converged
    # identical samples (and a finite gradient through them)
    xi = x[2].expand(7, 5).clone().requires_grad_(True)
    mu, _ = robust_frechet_mean(xi, delta=0.2)
    assert torch.allclose(mu[0], x[2], atol=1e-12)
    mu.sum().backward()
    assert torch.isfinite(xi.grad).all()
    # a segment with all-zero weights -> unweighted mean, flagged invalid; an empty segment -> zeros
    seg = torch.tensor([0, 0, 0, 1, 1, 1])
    wz = torch.tensor([1.0, 2.0, 0.5, 0.0, 0.0, 0.0], dtype=F64)
    mu, info = robust_frechet_mean(x, wz, seg, num_segments=3)
    unweighted, _ = robust_frechet_mean(x[3:])
    assert torch.allclose(mu[1], unweighted[0], atol=1e-9)
    assert info.valid.tolist() == [True, False, False] and info.nonempty.tolist() == [True, True, False]
    assert torch.equal(mu[2], torch.zeros(5, dtype=F64))
    # antipodal pair: Euclidean mean 0 -> start (and stay) at the heavier sample
    e = torch.tensor([[0.0, 1.0, 0.0], [0.0, -1.0, 0.0]], dtype=F64)
    mu, _ = robust_frechet_mean(e, torch.tensor([1.0, 2.0], dtype=F64))
    assert torch.isfinite(mu).all() and torch.allclose(mu[0], e[1])
    mu, _ = robust_frechet_mean(e)
    assert torch.isfinite(mu).all() and abs(float(mu.norm()) - 1) < 1e-12
    # near-pi distances, float32 and float64
    for dt in (torch.float32, F64):
        a = torch.nn.functional.normalize(torch.tensor([[1.0, 1e-7, 0.0], [-1.0, 0.0, 1e-7], [0.0, 1.0, 0.0]], dtype=dt), dim=-1)
        a.requires_grad_(True)
        mu, _ = robust_frechet_mean(a, delta=0.5)
        mu.sum().backward()
        assert torch.isfinite(mu).all() and torch.isfinite(a.grad).all()


def test_input_validation():
    x, w = cluster(4, 3, 0.3, seed=6)
    with pytest.raises(ShapeError):
        robust_frechet_mean(x[0])
    with pytest.raises(ShapeError):
        robust_frechet_mean(x, w[:3])
    with pytest.raises(ShapeError):
        robust_frechet_mean(x, segment_ids=torch.tensor([0, 1, 2, 3]), num_segments=2)
    with pytest.raises(ConfigError):
        robust_frechet_mean(x, -w)
    with pytest.raises(NonFiniteError):
        robust_frechet_mean(x * float("nan"))
    with pytest.raises(ConfigError):
        FrechetMeanConfig(delta=-1.0)
    with pytest.raises(ConfigError):
        robust_frechet_mean(x, backward="magic")


def test_init_and_no_grad_mode():
    x, w = cluster(20, 4, 0.3, seed=7)
    x.requires_grad_(True)
    mu, info = robust_frechet_mean(x, w, differentiable=False, tol=1e-12, max_iters=200)
    assert not mu.requires_grad
    mu2, info2 = robust_frechet_mean(x, w, init=mu, tol=1e-12, max_iters=200, **{})
    assert info2.iters <= 2 and torch.allclose(mu, mu2.detach(), atol=1e-11)
    assert info["iters"] == info.iters and FrechetMeanConfig().as_kwargs()["backward"] == "implicit"


# ------------------------------------------------------------------ gradients
@pytest.mark.parametrize("delta", [0.4, math.inf])
def test_gradcheck_implicit(delta):
    x, w = cluster(6, 4, 0.4, seed=8)
    x = x.clone().requires_grad_(True)
    wr = w.clone().requires_grad_(True)

    def f(xx, ww):
        return robust_frechet_mean(xx, ww, delta=delta, max_iters=2000, tol=1e-14)[0]

    assert torch.autograd.gradcheck(f, (x, wr), atol=1e-6)


def test_gradcheck_unrolled_and_agrees_with_implicit_at_convergence():
    x, w = cluster(5, 3, 0.4, seed=9)
    x = x.clone().requires_grad_(True)

    def f(xx):
        return robust_frechet_mean(xx, w, delta=0.3, max_iters=25, tol=0.0, backward="unrolled")[0]

    assert torch.autograd.gradcheck(f, (x,))
    g = torch.randn(1, 3, generator=torch.Generator().manual_seed(1), dtype=F64)
    (ga,) = torch.autograd.grad((robust_frechet_mean(x, w, delta=0.3, max_iters=300, tol=0.0,
                                                     backward="unrolled")[0] * g).sum(), x)
    (gb,) = torch.autograd.grad((robust_frechet_mean(x, w, delta=0.3, max_iters=300, tol=1e-14)[0] * g).sum(), x)
    assert torch.allclose(ga, gb, atol=1e-8)


def test_segmented_implicit_gradient_matches_unrolled():
    x, w = cluster(24, 6, 0.5, seed=12)
    seg = torch.arange(24) % 3
    x = x.clone().requires_grad_(True)
    g = torch.randn(3, 6, generator=torch.Generator().manual_seed(3), dtype=F64)
    (ga,) = torch.autograd.grad((robust_frechet_mean(x, w, seg, delta=0.35, max_iters=400, tol=0.0,
                                                     backward="unrolled")[0] * g).sum(), x)
    (gb,) = torch.autograd.grad((robust_frechet_mean(x, w, seg, delta=0.35, max_iters=400, tol=1e-14)[0] * g).sum(), x)
    assert torch.allclose(ga, gb, atol=1e-8)
