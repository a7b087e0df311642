"""Native CPU SH colours (CUDA: gsplat's kernel) vs gsplat's pure-torch evaluation on CPU: values and gradients, on
every device present."""
import pytest
import torch

from rh3dgs.ops import sh_colors
from rh3dgs.ops._ref import _ref_sh_colors


def _inputs(degree: int, n: int = 2000, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(n, 3, generator=g)
    campos = torch.tensor([[3.0, 0.5, -1.0], [0.2, -2.5, 0.7]])
    coeffs = torch.randn(n, (degree + 1) ** 2, 3, generator=g)
    return means, campos, coeffs


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_sh_colors_match_reference(degree, device):
    means, campos, coeffs = _inputs(degree, seed=degree)
    got = sh_colors(degree, means.to(device), campos.to(device), coeffs.to(device)).cpu()
    ref = _ref_sh_colors(degree, means.double(), campos.double(), coeffs.double())
    assert got.shape == (2, len(means), 3)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_sh_colors_use_only_the_degree_s_coefficients():
    means, campos, coeffs = _inputs(3, n=300, seed=7)
    torch.testing.assert_close(sh_colors(1, means, campos, coeffs), sh_colors(1, means, campos, coeffs[:, :4]))


def test_sh_colors_gradients_match_reference(device):
    """CPU: the reference's own backward (equal); CUDA: gsplat's backward, within 1e-5 of the largest gradient."""
    means, campos, coeffs = _inputs(3, n=500, seed=3)
    up = torch.randn(2, 500, 3, generator=torch.Generator().manual_seed(1))
    nat = [t.to(device).clone().requires_grad_(True) for t in (means, campos, coeffs)]
    ref = [t.clone().requires_grad_(True) for t in (means, campos, coeffs)]
    g_nat = torch.autograd.grad((sh_colors(3, *nat) * up.to(device)).sum(), nat)
    g_ref = torch.autograd.grad((_ref_sh_colors(3, *ref) * up).sum(), ref)
    for a, b in zip(g_nat, g_ref):
        if device.type == "cpu":
            torch.testing.assert_close(a, b)
        else:
            assert (a.cpu() - b).abs().max() <= 1e-5 * b.abs().max()
