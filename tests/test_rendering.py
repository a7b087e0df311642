"""rh3dgs.rendering: FixedViews (sparse compositing of fixed geometry) against render(), values and gradients."""
import pytest
import torch

from _scenes import random_lift_scene
from rh3dgs.errors import ShapeError
from rh3dgs.rendering import fixed_views, render


def test_fixed_views_render_equals_render_values_and_gradients():
    gs, cams, _ = random_lift_scene(400, 3, 40, 4, seed=1)
    fv = fixed_views(gs, cams)
    f = torch.randn(len(gs), 5, requires_grad=True)
    out = fv.render(f, [2, 0])
    ref = render(gs, cams[[2, 0]], f, rgb=False)
    torch.testing.assert_close(out, ref.features, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fv.alpha[[2, 0]], ref.alpha, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(fv.d1[[2, 0]], ref.d1, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out)
    (ga,) = torch.autograd.grad((out * g).sum(), f)
    (gb,) = torch.autograd.grad((ref.features * g).sum(), f)
    torch.testing.assert_close(ga, gb, atol=5e-4, rtol=1e-3)  # float32 sums in another order
    assert ga.abs().sum() > 0


def test_render_reuses_a_projection():
    gs, cams, _ = random_lift_scene(200, 2, 32, 4, seed=2)
    a = render(gs, cams, torch.ones(len(gs), 2), rgb=False)
    b = render(gs, cams, torch.ones(len(gs), 2), rgb=False, projection=a.projection)
    assert torch.equal(a.features, b.features) and torch.equal(a.alpha, b.alpha)
    with pytest.raises(ShapeError, match="projection"):
        render(gs, cams[[0]], torch.ones(len(gs), 2), rgb=False, projection=a.projection)
