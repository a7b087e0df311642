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


@pytest.mark.parametrize("rgb", [True, False])
def test_features_that_do_not_shape_the_geometry(rgb):
    """render(features_shape_geometry=False): the same images; a loss on the features reaches the features as
    before and the Gaussians' geometry not at all; a loss on RGB reaches the geometry as before."""
    gs, cams, _ = random_lift_scene(300, 2, 36, 4, seed=3)
    for t in (gs.means, gs.opacities):
        t.requires_grad_(True)
    f = torch.randn(len(gs), 4, requires_grad=True)
    g = torch.Generator().manual_seed(0)
    a = render(gs, cams, f, rgb=rgb)
    b = render(gs, cams, f, rgb=rgb, features_shape_geometry=False)
    assert torch.equal(a.features, b.features) and torch.equal(a.alpha, b.alpha)
    up = torch.randn(a.features.shape, generator=g)
    ga = torch.autograd.grad((a.features * up).sum(), [f, gs.means], allow_unused=True, retain_graph=True)
    gb = torch.autograd.grad((b.features * up).sum(), [f, gs.means], allow_unused=True, retain_graph=True)
    torch.testing.assert_close(gb[0], ga[0])
    assert ga[1].abs().sum() > 0 and (gb[1] is None or gb[1].abs().sum() == 0)
    if rgb:
        up = torch.randn(a.rgb.shape, generator=g)
        ra = torch.autograd.grad((a.rgb * up).sum(), gs.means)[0]
        rb = torch.autograd.grad((b.rgb * up).sum(), gs.means)[0]
        torch.testing.assert_close(rb, ra)
