"""Native relevancy op vs its torch reference, and the field / API paths that use it, on every device present (CUDA:
the reference on the device, against the same reference on CPU)."""
import pytest
import torch

from rh3dgs.field import SemanticField
from rh3dgs.ops import relevancy
from rh3dgs.ops._ref import _ref_relevancy
from rh3dgs.query import relevancy_from_cosines


@pytest.mark.parametrize("d,Q,J,P", [(16, 1, 4, 4099), (16, 3, 4, 17), (8, 2, 0, 37), (5, 1, 4, 100), (64, 2, 3, 999)])
def test_native_matches_reference(d, Q, J, P, device):
    g = torch.Generator().manual_seed(d * 100 + P)
    rows = torch.randn(P, d + 3, generator=g)[:, 3:]  # strided rows, as a slice of an RGB + latent render
    pos, neg = torch.randn(Q, d, generator=g), torch.randn(J, d, generator=g)
    R = torch.linalg.qr(torch.randn(32, d, generator=g), mode="r")[1]
    out = relevancy(rows.to(device), pos.to(device), neg.to(device), R.to(device), 10.0)
    assert out.shape == (P, Q) and out.device == rows.to(device).device
    assert torch.allclose(out.cpu(), _ref_relevancy(rows, pos, neg, R, 10.0), atol=1e-5, rtol=0)


def test_field_relevancy_equals_decoded_cosines():
    """Through the decoder: the relevancy of explicitly decoded, normalised features (zero latents: 0.5)."""
    g = torch.Generator().manual_seed(3)
    f = SemanticField(torch.randn(50, 8, generator=g), torch.randn(32, 8, generator=g))
    lat = torch.randn(6, 7, 8, generator=g)
    lat[0, 0] = 0.0
    phi = torch.nn.functional.normalize(torch.randn(2, 32, generator=g), dim=-1)
    neg = torch.nn.functional.normalize(torch.randn(4, 32, generator=g), dim=-1)
    z = f.decode(lat)
    expected = relevancy_from_cosines(z @ phi.T, z @ neg.T, 10.0)
    got = f.relevancy(lat, phi, neg, 10.0)
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(got[0, 0], torch.full((2,), 0.5))
    # per Gaussian, with the valid mask
    f.valid = torch.arange(50) % 2 == 0
    rel = f.gaussian_relevancy(phi, neg, 10.0)
    z_g = f.decode()
    ref = relevancy_from_cosines(z_g @ phi.T, z_g @ neg.T, 10.0).T * f.valid[None]
    assert torch.allclose(rel, ref, atol=1e-5)


def test_rank_deficient_decoder():
    """R from QR also covers decoders of rank < d (and D < d)."""
    g = torch.Generator().manual_seed(4)
    dec = torch.randn(4, 8, generator=g)  # D = 4 < d = 8
    f = SemanticField(torch.randn(10, 8, generator=g), dec)
    lat = torch.randn(20, 8, generator=g)
    phi = torch.nn.functional.normalize(torch.randn(1, 4, generator=g), dim=-1)
    z = f.decode(lat)
    expected = relevancy_from_cosines(z @ phi.T, z.new_zeros(20, 0), 10.0)
    assert torch.allclose(f.relevancy(lat, phi, torch.zeros(0, 4), 10.0), expected, atol=1e-5)
