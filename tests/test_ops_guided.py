"""rh3dgs.ops.guided_upsample: the native CPU kernel (CUDA: the reference on the device) against its torch reference on
CPU (values), on every device present, and its errors."""
import pytest
import torch

from rh3dgs.errors import ShapeError
from rh3dgs.ops import guided_upsample
from rh3dgs.ops._ref import _cell_colors, _ref_guided_upsample


@pytest.mark.parametrize("h, w, H, W, D, radius", [(16, 16, 128, 128, 64, 1), (5, 7, 37, 50, 8, 2),
                                                   (4, 6, 16, 24, 128, 1), (3, 3, 3, 3, 4, 1), (2, 9, 11, 40, 5, 0)])
def test_guided_upsample_matches_the_reference(h, w, H, W, D, radius, device):
    g = torch.Generator().manual_seed(h * 100 + w)
    m = torch.nn.functional.normalize(torch.randn(h, w, D, generator=g) + 0.5, dim=-1)
    m[0, 0] = 0.0  # a cell without a feature carries no weight
    # a guide of few colours (pixels match their cells, as on a render) plus noise; one pixel of no cell's colour
    guide = (torch.randint(0, 3, (H, W, 1), generator=g) * 0.4 + 0.02 * torch.rand(H, W, 3, generator=g)).clamp(0, 1)
    guide[H // 2, W // 2] = torch.tensor([5.0, -5.0, 5.0])
    for sc, ss in ((0.05, 0.75), (0.3, 1.5)):
        out = guided_upsample(m.to(device), guide.to(device), sigma_color=sc, sigma_space=ss, radius=radius).cpu()
        ref = _ref_guided_upsample(m, guide, _cell_colors(guide, h, w), sc, ss, radius, 1e-8)
        assert out.shape == (H, W, D) and out.dtype == torch.float32
        assert torch.allclose(out, ref, atol=2e-6), float((out - ref).abs().max())
        zero_out, zero_ref = out.norm(dim=-1) == 0, ref.norm(dim=-1) == 0
        assert torch.equal(zero_out, zero_ref)
        assert bool(zero_out[H // 2, W // 2]) or H == h  # no cell of its colour in reach: no feature
        assert torch.allclose(out[~zero_out].norm(dim=-1), torch.ones(int((~zero_out).sum())), atol=1e-5)


def test_guided_upsample_names_bad_shapes():
    with pytest.raises(ShapeError, match=r"the guide \[4, 4\] is smaller than the map \[8, 8\]"):
        guided_upsample(torch.rand(8, 8, 3), torch.rand(4, 4, 3))
    with pytest.raises(ShapeError, match=r"map must be \[h, w, D\] and guide \[H, W, 3\]"):
        guided_upsample(torch.rand(8, 8, 3), torch.rand(16, 16, 4))


def test_guided_upsample_of_a_batch_is_its_views_one_by_one():
    g = torch.Generator().manual_seed(5)
    m = torch.nn.functional.normalize(torch.randn(3, 6, 5, 16, generator=g), dim=-1)
    guide = torch.rand(3, 24, 20, 3, generator=g)
    out = guided_upsample(m, guide, sigma_color=0.2)
    assert out.shape == (3, 24, 20, 16)
    for b in range(3):
        assert torch.equal(out[b], guided_upsample(m[b], guide[b], sigma_color=0.2))
    with pytest.raises(ShapeError, match=r"or \[B, h, w, D\] and \[B, H, W, 3\]\), got \[3, 6, 5, 16\] and \[2, 24"):
        guided_upsample(m, guide[:2])
