"""Native LIC ops (InfoNCE, pull) vs their torch references (values and gradients), and their input checks, on every
device present (CUDA: csrc/cuda/lic.cu for the InfoNCE, whose backward scatters with atomics; the pull form's
reference on the device; the same tolerances, which bound float32 sums in any order)."""
import math

import pytest
import torch

from _scenes import on_device
from rh3dgs.errors import ShapeError
from rh3dgs.ops import lic_infonce, lic_pull
from rh3dgs.ops._ref import _ref_lic_infonce, _ref_lic_pull


def random_case(N, d, A, M, R, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, d, generator=g)
    x[3] = 0.0  # a zero row (F.normalize's eps branch)
    x[5] *= 1e-3  # a short row
    anchors = torch.randint(N, (A,), generator=g)
    anchors[0] = 3
    nbr = torch.randint(N, (A, M), generator=g)
    nbr[torch.rand(A, M, generator=g) < 0.3] = -1  # padding
    rnd = torch.randint(N, (A, R), generator=g)
    kinds = torch.cat([(nbr >= 0).to(torch.uint8) * torch.randint(1, 3, (A, M), generator=g, dtype=torch.uint8),
                       torch.randint(0, 2, (A, R), generator=g, dtype=torch.uint8)], 1)
    kinds[4, :M] = (kinds[4, :M] > 0).to(torch.uint8)  # no positive: loss and gradient 0
    kinds[6, :] = 0  # nothing in the set
    kinds[7, :] = 0
    cand = torch.cat([nbr, rnd], 1)
    cand[7, 0], kinds[7, 0] = anchors[7], 2  # only a positive, which is the anchor itself
    cand[1, 0], kinds[1, 0] = anchors[1], 1  # the anchor itself among its negatives
    cand[2, :3], kinds[2, :3] = cand[2, 3].clamp_min(0), 2  # duplicate candidates
    cand[8, 0], kinds[8, 0] = 3, 1  # the zero row as a candidate
    return x, anchors, cand, kinds


@pytest.mark.parametrize("N,d,A,M,R,tau", [(500, 16, 64, 16, 64, 0.1), (300, 5, 40, 7, 9, 0.5), (200, 64, 30, 16, 8, 0.07),
                                           (50, 16, 20, 4, 0, 1.0)])
def test_native_matches_reference_values_and_gradients(N, d, A, M, R, tau, device):
    x, anchors, cand, kinds = random_case(N, d, A, M, R, seed=N + d)
    xa = x.to(device).clone().requires_grad_(True)
    xb = x.double().requires_grad_(True)
    out = lic_infonce(xa, *on_device((anchors, cand, kinds), device), tau)
    ref = _ref_lic_infonce(xb, anchors, cand, kinds, tau)  # float64 torch
    assert out.dtype == torch.float32 and out.shape == (A,) and out.device == xa.device
    assert torch.allclose(out.double().cpu(), ref, atol=2e-5, rtol=1e-5)
    assert out[4] == 0 and out[6] == 0
    w = torch.rand(A, generator=torch.Generator().manual_seed(1)).double()
    (out.double() * w.to(device)).sum().backward()
    (ref * w).sum().backward()
    assert torch.allclose(xa.grad.double().cpu(), xb.grad, atol=1e-4, rtol=1e-4)
    assert xa.grad[3].abs().sum() > 0  # the zero row (anchor 0, candidate of anchor 8) gets a gradient


def test_native_matches_float32_reference_in_the_lic_setting(device):
    """The bench setting (50k rows, 1024 anchors, 16 + 64 candidates) against the torch float32 formula (on CPU)."""
    x, anchors, cand, kinds = random_case(50_000, 16, 1024, 16, 64, seed=7)
    xa, xb = x.to(device).clone().requires_grad_(True), x.clone().requires_grad_(True)
    out = lic_infonce(xa, *on_device((anchors, cand, kinds), device), 0.1)
    ref = _ref_lic_infonce(xb, anchors, cand, kinds, 0.1)
    assert torch.allclose(out.cpu(), ref, atol=1e-5, rtol=1e-5)
    out.mean().backward()
    ref.mean().backward()
    assert torch.allclose(xa.grad.cpu(), xb.grad, atol=1e-6, rtol=1e-4)


def test_value_by_hand_and_deterministic_gradient(device):
    """(One term per gradient row: bit-identical on CUDA too.)"""
    x = torch.tensor([[1.0, 0.0], [math.cos(0.3), math.sin(0.3)], [0.0, 2.0]], device=device, requires_grad=True)
    anchors, cand = torch.tensor([0], device=device), torch.tensor([[1, 2, -1]], device=device)
    kinds = torch.tensor([[2, 1, 0]], dtype=torch.uint8, device=device)
    out = lic_infonce(x, anchors, cand, kinds, 0.5)
    s1, s2 = math.cos(0.3) / 0.5, 0.0
    assert float(out.detach()) == pytest.approx(-math.log(math.exp(s1) / (math.exp(s1) + math.exp(s2))), rel=1e-6)
    out.sum().backward()
    g1 = x.grad.clone()
    x.grad = None
    lic_infonce(x, anchors, cand, kinds, 0.5).sum().backward()
    assert torch.equal(x.grad, g1)


def test_bad_indices_and_shapes_are_rejected(device):
    """The CPU kernel's own check (RuntimeError) and, off the CPU, the Python entry's (ShapeError): the same words."""
    x = torch.randn(10, 4, device=device)
    anchors, cand = torch.tensor([0, 1], device=device), torch.tensor([[2, 3], [4, 10]], device=device)
    kinds = torch.tensor([[2, 1], [2, 1]], dtype=torch.uint8, device=device)
    with pytest.raises((RuntimeError, ShapeError), match="outside"):
        lic_infonce(x, anchors, cand, kinds, 0.1)
    kinds[1, 1] = 0  # an ignored candidate is never read: 10 is fine there
    assert torch.isfinite(lic_infonce(x, anchors, cand, kinds, 0.1)).all()
    with pytest.raises(ShapeError):
        lic_infonce(x, anchors, cand, kinds[:, :1], 0.1)
    with pytest.raises(ShapeError):
        lic_infonce(x[0], anchors, cand, kinds, 0.1)


def test_cpu_gradient_is_bit_identical_for_any_thread_count():
    x, anchors, cand, kinds = random_case(20_000, 16, 512, 16, 32, seed=11)
    grads = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            xa = x.clone().requires_grad_(True)
            lic_infonce(xa, anchors, cand, kinds, 0.1).mean().backward()
            grads.append(xa.grad)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])


@pytest.mark.parametrize("N,d,A,M,R", [(500, 16, 64, 16, 64), (300, 5, 40, 7, 9), (200, 64, 30, 16, 8), (11_000, 8, 2048, 32, 0)])
def test_pull_native_matches_reference_values_and_gradients(N, d, A, M, R, device):
    """The pull form on the same cases (kind 1 entries, padding, duplicates, the zero row, the anchor as its own
    positive): float32 native (CUDA: the reference in float32 on the device) against the float64 torch reference,
    values and gradients."""
    x, anchors, cand, kinds = random_case(N, d, A, M, R, seed=N + d + 1)
    xa, xb = x.to(device).clone().requires_grad_(True), x.double().requires_grad_(True)
    out, ref = lic_pull(xa, *on_device((anchors, cand, kinds), device)), _ref_lic_pull(xb, anchors, cand, kinds)
    assert out.dtype == torch.float32 and out.shape == (A,) and out.device == xa.device
    assert torch.allclose(out.double().cpu(), ref, atol=2e-6, rtol=1e-5)
    assert out[4] == 0 and out[6] == 0 and float(out[7].detach()) == pytest.approx(0.0, abs=1e-6)  # no positive; itself
    w = torch.rand(A, generator=torch.Generator().manual_seed(2)).double()
    (out.double() * w.to(device)).sum().backward()
    (ref * w).sum().backward()
    assert torch.allclose(xa.grad.double().cpu(), xb.grad, atol=1e-5, rtol=1e-4)


def test_pull_value_by_hand_and_negatives_ignored(device):
    x = torch.tensor([[1.0, 0.0], [math.cos(0.3), math.sin(0.3)], [0.0, 2.0], [-5.0, 0.0]], device=device,
                     requires_grad=True)
    anchors, cand = torch.tensor([0], device=device), torch.tensor([[1, 2, 3, 99]], device=device)
    kinds = torch.tensor([[2, 2, 1, 0]], dtype=torch.uint8, device=device)  # 3 a negative (ignored), 99 padding
    out = lic_pull(x, anchors, cand, kinds)
    assert float(out.detach()) == pytest.approx(1.0 - (math.cos(0.3) + 0.0) / 2, rel=1e-6)
    out.sum().backward()
    # d/dx0 of -(<f0, f1> + <f0, f2>) / 2 at |x0| = 1: -(m - f0 <f0, m>), m = (f1 + f2) / 2
    m = torch.tensor([math.cos(0.3), math.sin(0.3) + 1.0]) / 2
    assert torch.allclose(x.grad[0].cpu(), -(m - torch.tensor([1.0, 0.0]) * m[0]), atol=1e-6)
    assert x.grad[3].abs().sum() == 0
    with pytest.raises((RuntimeError, ShapeError), match="lic_pull: an anchor or a used candidate is outside"):
        lic_pull(x.detach(), anchors, cand, torch.tensor([[2, 2, 1, 2]], dtype=torch.uint8, device=device))
