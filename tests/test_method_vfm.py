"""rh3dgs.method.vfm: Riemannian Huber pixel loss, Frechet-mean loss, delta schedule."""
from __future__ import annotations

import math

import pytest
import torch

from rh3dgs.errors import ConfigError, ShapeError
from rh3dgs.method.vfm import VFMConfig, delta_at, mean_loss, pixel_loss, vfm_loss

F64 = torch.float64


def rotation(D: int, theta: float, i: int = 0, j: int = 1) -> torch.Tensor:
    R = torch.eye(D, dtype=F64)
    c, s = math.cos(theta), math.sin(theta)
    R[i, i], R[i, j], R[j, i], R[j, j] = c, -s, s, c
    return R


def teacher_maps(B: int = 2, H: int = 6, W: int = 7, D: int = 5, seed: int = 0) -> torch.Tensor:
    """Unit features clustered around a direction in the (e0, e1) plane's neighbourhood."""
    g = torch.Generator().manual_seed(seed)
    base = torch.zeros(D, dtype=F64)
    base[2] = 1.0
    f = base + 0.3 * torch.randn(B, H, W, D, generator=g, dtype=F64)
    return torch.nn.functional.normalize(f, dim=-1)


def test_pixel_loss_equals_hand_computation():
    # rendered vectors at known angles from e0 in the (e0, e1) plane
    angles = [0.1, 0.5, 1.0, 2.0]
    teacher = torch.tensor([[1.0, 0.0, 0.0]] * 4, dtype=F64)
    rendered = torch.tensor([[math.cos(a), math.sin(a), 0.0] for a in angles], dtype=F64)
    w = torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=F64)
    delta = 0.6

    def rho(t: float) -> float:
        return 0.5 * t * t if t <= delta else delta * (t - 0.5 * delta)

    expect = sum(wi * rho(a) for wi, a in zip(w.tolist(), angles)) / float(w.sum())
    assert float(pixel_loss(rendered, teacher, w, delta)) == pytest.approx(expect, rel=1e-12)
    # delta = inf: half the weighted mean squared angle
    expect_sq = sum(wi * 0.5 * a * a for wi, a in zip(w.tolist(), angles)) / float(w.sum())
    assert float(pixel_loss(rendered, teacher, w, math.inf)) == pytest.approx(expect_sq, rel=1e-12)
    # un-normalised inputs are normalised first
    assert float(pixel_loss(3.0 * rendered, teacher, w, delta)) == pytest.approx(expect, rel=1e-12)
    # [B, H, W, D] layout gives the same number
    assert float(pixel_loss(rendered.reshape(1, 2, 2, 3), teacher.reshape(1, 2, 2, 3), w.reshape(1, 2, 2), delta)) == \
        pytest.approx(expect, rel=1e-12)


def test_zero_weights_remove_pixels():
    t = teacher_maps(B=1, H=4, W=4)
    r = teacher_maps(B=1, H=4, W=4, seed=1).requires_grad_(True)
    w = torch.ones(1, 4, 4, dtype=F64)
    w[0, :2] = 0.0
    loss = pixel_loss(r, t, w, 0.4)
    ref = pixel_loss(r[:, 2:].detach(), t[:, 2:], None, 0.4)
    assert float(loss.detach()) == pytest.approx(float(ref), rel=1e-12)
    loss.backward()
    assert float(r.grad[0, :2].abs().max()) == 0.0 and float(r.grad[0, 2:].abs().max()) > 0.0
    # all weights zero: an exact 0 that keeps the graph
    r2 = r.detach().clone().requires_grad_(True)
    z = pixel_loss(r2, t, torch.zeros(1, 4, 4, dtype=F64), 0.4)
    z.backward()
    assert float(z.detach()) == 0.0 and r2.grad is not None


def test_mean_loss_zero_for_identical_and_grows_with_rotation():
    t = teacher_maps()
    w = torch.rand(2, 6, 7, generator=torch.Generator().manual_seed(3), dtype=F64) + 0.1
    cfg = VFMConfig(mean_iters=200, mean_tol=1e-12)
    assert float(mean_loss(t.clone(), t, w, 0.3, cfg=cfg)) < 1e-16
    losses = []
    for theta in (0.05, 0.1, 0.2, 0.4):
        R = rotation(5, theta, 2, 3)
        r = t @ R.T  # rotating every rendered pixel rotates its Frechet means by R
        loss, parts = mean_loss(r, t, w, 0.3, cfg=cfg, return_parts=True)
        mu_t = parts["mu_t"]
        assert torch.allclose(parts["mu_s"].detach(), mu_t @ R.T, atol=1e-9)
        expect = torch.arccos((mu_t * (mu_t @ R.T)).sum(-1).clamp(-1, 1)) ** 2  # per view
        assert float(loss.detach()) == pytest.approx(float(expect.mean()), rel=1e-6)
        losses.append(float(loss.detach()))
    assert losses == sorted(losses) and losses[0] > 0
    # 'huber' mean loss: rho_delta of the angle
    cfg_h = VFMConfig(mean_iters=200, mean_tol=1e-12, mean_loss="huber")
    r = t @ rotation(5, 1.2, 2, 3).T
    lh, parts = mean_loss(r, t, w, 0.3, cfg=cfg_h, return_parts=True)
    d = parts["dist"]
    assert bool((d > 0.3).all())
    assert float(lh.detach()) == pytest.approx(float((0.3 * (d - 0.15)).mean()), rel=1e-9)


def test_region_wise_segments():
    t = teacher_maps(B=1)
    regions = torch.zeros(1, 6, 7, dtype=torch.long)
    regions[:, :, 4:] = 5
    regions[:, 0, 0] = -1  # ignored pixel
    r = t.clone()
    R = rotation(5, 0.2, 2, 4)
    r[regions == 5] = r[regions == 5] @ R.T
    cfg = VFMConfig(mean_iters=200, mean_tol=1e-12, region_wise=True, min_region_pixels=4)
    loss, parts = mean_loss(r, t, None, 0.5, regions=regions, cfg=cfg, return_parts=True)
    assert parts["mu_s"].shape == (2, 5) and parts["segment_view"].tolist() == [0, 0]
    # segment 0 = region 0 (untouched), segment 1 = region 5 (rotated)
    mu_t5 = torch.nn.functional.normalize(t[regions == 5], dim=-1)
    from rh3dgs.method.sphere import robust_frechet_mean

    ref5, _ = robust_frechet_mean(mu_t5, delta=0.5, max_iters=200, tol=1e-12)
    assert torch.allclose(parts["mu_t"][1], ref5[0], atol=1e-9)
    d5 = float(torch.arccos((ref5[0] * (ref5[0] @ R.T)).sum().clamp(-1, 1)))
    assert parts["dist"].tolist() == pytest.approx([0.0, d5], abs=1e-7)
    assert float(loss.detach()) == pytest.approx(d5**2 / 2, rel=1e-5)
    # region_wise off: one segment per view, regions ignored
    _, parts1 = mean_loss(r, t, None, 0.5, regions=regions, cfg=VFMConfig(), return_parts=True)
    assert parts1["mu_s"].shape == (1, 5)


def test_gradient_flows_to_rendered_only():
    t = teacher_maps().requires_grad_(True)
    r = (teacher_maps(seed=5) * 2.0).requires_grad_(True)
    w = torch.ones(2, 6, 7, dtype=F64, requires_grad=True)
    total, parts = vfm_loss(r, t, w, step=0, cfg=VFMConfig(lambda_mean=1.0))
    total.backward()
    assert r.grad is not None and float(r.grad.abs().sum()) > 0 and torch.isfinite(r.grad).all()
    assert t.grad is None and w.grad is None
    assert float(total.detach()) == pytest.approx(float(parts["pix"] + 1.0 * parts["mean"]), rel=1e-12)
    assert float(parts["mean"]) > 0


def test_mean_loss_gradient_matches_finite_differences():
    t = teacher_maps(B=1, H=3, W=3, D=4)
    r0 = teacher_maps(B=1, H=3, W=3, D=4, seed=7)
    w = torch.rand(1, 3, 3, generator=torch.Generator().manual_seed(1), dtype=F64) + 0.1
    cfg = VFMConfig(mean_iters=500, mean_tol=1e-14, min_region_pixels=1)
    r = r0.clone().requires_grad_(True)
    mean_loss(r, t, w, 0.4, cfg=cfg).backward()
    d = torch.randn(r0.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
    h = 1e-6
    fd = (float(mean_loss(r0 + h * d, t, w, 0.4, cfg=cfg)) - float(mean_loss(r0 - h * d, t, w, 0.4, cfg=cfg))) / (2 * h)
    assert float((r.grad * d).sum()) == pytest.approx(fd, rel=1e-5, abs=1e-9)


def test_delta_schedule_endpoints():
    cfg = VFMConfig(delta_start=1.0, delta_end=0.2, anneal_steps=100, schedule="cosine")
    assert delta_at(0, cfg) == pytest.approx(1.0)
    assert delta_at(50, cfg) == pytest.approx(0.6)
    assert delta_at(100, cfg) == pytest.approx(0.2)
    assert delta_at(10**6, cfg) == pytest.approx(0.2)
    assert delta_at(25, cfg) > 0.6 + 0.4 * 0.5  # cosine stays high early
    lin = VFMConfig(delta_start=1.0, delta_end=0.2, anneal_steps=100, schedule="linear")
    assert delta_at(25, lin) == pytest.approx(0.8)
    assert delta_at(100, lin) == pytest.approx(0.2)
    const = VFMConfig(delta_start=0.7, delta_end=0.2, anneal_steps=100, schedule="constant")
    assert delta_at(0, const) == delta_at(500, const) == 0.7
    assert delta_at(0, VFMConfig(anneal_steps=0)) == VFMConfig().delta_end
    with pytest.raises(ConfigError):
        VFMConfig(schedule="exp")
    with pytest.raises(ConfigError):
        VFMConfig(delta_end=0.0)


def test_vfm_loss_uses_schedule_and_validates_shapes():
    t = teacher_maps(B=1)
    r = teacher_maps(B=1, seed=2)
    cfg = VFMConfig(delta_start=1.0, delta_end=0.1, anneal_steps=10, lambda_mean=0.0)
    total, parts = vfm_loss(r, t, None, step=10, cfg=cfg)
    assert float(parts["delta"]) == pytest.approx(0.1)
    assert float(total) == pytest.approx(float(pixel_loss(r, t, None, 0.1)), rel=1e-12)
    assert float(parts["mean"]) == 0.0
    with pytest.raises(ShapeError):
        pixel_loss(r, t[..., :3], None, 0.1)
    with pytest.raises(ShapeError):
        pixel_loss(r, t, torch.ones(1, 6, 6), 0.1)
