"""Native CPU projection (CUDA: gsplat's fused kernel) vs gsplat's pure-torch formulation on CPU: values, gradients
(on every device present), determinism (CPU)."""
import math

import pytest
import torch

from rh3dgs import Cameras
from rh3dgs.ops import project_gaussians
from rh3dgs.ops._ref import _ref_project_gaussians


def _scene(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) - 0.5) * 4.0  # some behind / beside the cameras
    quats = torch.randn(n, 4, generator=g) * (0.5 + torch.rand(n, 1, generator=g))  # not normalised
    scales = 0.01 * torch.exp(1.5 * torch.randn(n, 3, generator=g))  # strongly anisotropic
    eyes = torch.tensor([[3.0, 0.2, 0.8], [-2.0, 2.5, -0.5], [0.3, -1.2, 1.9]])
    cams = Cameras.look_at(eyes, torch.zeros(3), fov_deg=70.0, width=96, height=64)
    Ks = cams.Ks.clone()
    Ks[1, 0, 2] += 7.0  # off-centre principal point, different focal lengths
    Ks[2, 1, 1] *= 1.3
    return means, quats, scales, cams.viewmats, Ks, cams.width, cams.height


@pytest.mark.parametrize("seed", [0, 1])
def test_projection_matches_reference(seed, device):
    means, quats, scales, viewmats, Ks, W, H = _scene(3000, seed)
    radii, means2d, depths, conics = (t.cpu() for t in project_gaussians(
        *(t.to(device) for t in (means, quats, scales, viewmats, Ks)), W, H))
    r_radii, r_means2d, r_depths, r_conics = _ref_project_gaussians(means.double(), quats.double(), scales.double(),
                                                                    viewmats.double(), Ks.double(), W, H)
    f_conics = _ref_project_gaussians(means, quats, scales, viewmats, Ks, W, H)[3]  # the float32 formulation
    vis = r_radii > 0
    assert 0.2 < vis.float().mean() < 0.95  # both culled and visible pairs are exercised
    # radii are ceil(3 sqrt(lambda)): equal except where the float32 value sits on an integer
    assert (radii == r_radii).float().mean() > 0.999
    torch.testing.assert_close(depths, r_depths.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(means2d[vis], r_means2d[vis].float(), rtol=1e-5, atol=1e-3)
    # conics of near-degenerate (very anisotropic) Gaussians are ill-conditioned in float32: the
    # native op is as close to the float64 values as gsplat's float32 torch formulation is
    scale = r_conics[vis].abs().amax(-1, keepdim=True)
    err = ((conics[vis].double() - r_conics[vis]) / scale).abs()
    f_err = ((f_conics[vis].double() - r_conics[vis]) / scale).abs()
    assert err.max() <= 3 * f_err.max() + 1e-6
    assert err.quantile(0.99) < 1e-5


def test_projection_matches_float32_reference_radii_and_culling(device):
    # against the exact code rh3dgs ran before (float32 torch): culling decisions identical
    means, quats, scales, viewmats, Ks, W, H = _scene(4000, 3)
    radii = project_gaussians(*(t.to(device) for t in (means, quats, scales, viewmats, Ks)), W, H)[0].cpu()
    r_radii = _ref_project_gaussians(means, quats, scales, viewmats, Ks, W, H)[0]
    assert torch.equal(radii > 0, r_radii > 0)
    assert (radii != r_radii).sum() <= 2


def test_projection_gradients_match_reference(device):
    means, quats, scales, viewmats, Ks, W, H = _scene(800, 4)
    g = torch.Generator().manual_seed(9)
    leaves = [t.double().clone().requires_grad_(True) for t in (means, quats, scales, viewmats)]
    r_radii, *r_outs = _ref_project_gaussians(*leaves, Ks.double(), W, H)
    vis = (r_radii > 0).double()
    ups = [torch.randn(o.shape, generator=g, dtype=torch.float64) * (vis[..., None] if o.dim() == 3 else vis)
           for o in r_outs]
    ref_grads = torch.autograd.grad(sum((o * u).sum() for o, u in zip(r_outs, ups)), leaves)

    nat = [t.to(device).clone().requires_grad_(True) for t in (means, quats, scales, viewmats)]
    radii, *outs = project_gaussians(*nat, Ks.to(device), W, H)
    assert torch.equal(radii.cpu() > 0, r_radii > 0)
    grads = torch.autograd.grad(sum((o * u.float().to(device)).sum() for o, u in zip(outs, ups)), nat)
    for name, a, b in zip(("means", "quats", "scales", "viewmats"), (g.cpu() for g in grads), ref_grads):
        scale = b.abs().max()
        assert scale > 0, name
        torch.testing.assert_close(a.double() / scale, b / scale, rtol=0, atol=2e-4, msg=name)


def test_projection_fov_clamp_gradient(device):
    # a Gaussian far outside the horizontal field of view: the Jacobian uses the clamped mean
    cams = Cameras.look_at(torch.tensor([[0.0, -4.0, 0.0]]), torch.zeros(3), fov_deg=40.0, width=64, height=64)
    means = torch.tensor([[2.6, 0.0, 0.0], [0.0, 0.0, 0.0]])
    quats = torch.tensor([[0.9, 0.1, 0.3, -0.2], [1.0, 0.0, 0.0, 0.0]])
    scales = torch.tensor([[1.0, 0.3, 0.6], [0.2, 0.2, 0.2]])
    leaves = [t.double().clone().requires_grad_(True) for t in (means, quats, scales)]
    r_radii, r_m2, r_d, r_c = _ref_project_gaussians(*leaves, cams.viewmats.double(), cams.Ks.double(), 64, 64)
    assert r_radii[0, 0] > 0 and abs(r_m2[0, 0, 0].item() - 32) > 32 * (1 + math.tan(math.radians(20)) * 0)
    ref = torch.autograd.grad((r_c * torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)).sum() + r_m2.sum(), leaves)
    nat = [t.to(device).clone().requires_grad_(True) for t in (means, quats, scales)]
    _, m2, _, c = project_gaussians(*nat, cams.viewmats.to(device), cams.Ks.to(device), 64, 64)
    got = torch.autograd.grad((c * torch.tensor([1.0, -2.0, 0.5], device=device)).sum() + m2.sum(), nat)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double().cpu(), b, rtol=1e-4, atol=1e-6)


def test_projection_bit_identical_across_runs_and_threads():
    means, quats, scales, viewmats, Ks, W, H = _scene(5000, 6)
    old = torch.get_num_threads()

    def run(threads):
        torch.set_num_threads(threads)
        leaves = [t.clone().requires_grad_(True) for t in (means, quats, scales, viewmats)]
        outs = project_gaussians(*leaves, Ks, W, H)
        loss = outs[1].sum() + outs[2].sum() + (outs[3] ** 2).sum()
        return [o.detach() for o in outs] + list(torch.autograd.grad(loss, leaves))

    try:
        a, b, c = run(2), run(2), run(1)
    finally:
        torch.set_num_threads(old)
    for x, y, z in zip(a, b, c):
        assert torch.equal(x, y) and torch.equal(x, z)
