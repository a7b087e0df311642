"""rh3dgs.rendering: render() against the pipeline of the ops' references, FixedViews (sparse compositing of fixed
geometry) against render(), values and gradients, on every device present (CUDA: gsplat's projection, SH and
binning kernels and rh3dgs's compositing kernel)."""
import math

import pytest
import torch

from _scenes import random_lift_scene
from rh3dgs.errors import ShapeError
from rh3dgs.rendering import fixed_views, render


def _reference_render(gs, cams, features):
    """render() composed of the `_ref` references (CPU, autograd): projection, SH colours + 0.5 clamped at 0, binning,
    compositing of RGB + features."""
    from rh3dgs.ops._ref import _ref_isect_tiles, _ref_project_gaussians, _ref_rasterize_to_pixels, _ref_sh_colors

    W, H, B = int(cams.width), int(cams.height), len(cams)
    radii, means2d, depths, conics = _ref_project_gaussians(gs.means, gs.quats, gs.activated_scales, cams.viewmats,
                                                            cams.Ks, W, H)
    campos = torch.linalg.inv(cams.viewmats)[:, :3, 3]
    rgb = (_ref_sh_colors(gs.sh_degree, gs.means, campos, gs.sh_coeffs) + 0.5).clamp_min(0.0)
    _, offsets, fids = _ref_isect_tiles(means2d, radii, depths, 16, math.ceil(W / 16), math.ceil(H / 16))
    stacked = torch.cat([rgb, features[None].expand(B, -1, -1)], -1)
    out, alpha, d1, _ = _ref_rasterize_to_pixels(means2d, conics, stacked, gs.activated_opacities[None].expand(B, -1),
                                                 depths, None, W, H, 16, offsets, fids)
    return out[..., :3], out[..., 3:], alpha, d1


def test_render_matches_the_reference_pipeline(device):
    """RGB (SH degree 2) + 4 feature channels of 300 Gaussians in 2 views: values within 1e-4, and the gradients of a
    mean-reduced loss w.r.t. means, SH coefficients, opacities and features within 1e-3 of the largest (float32
    projections and sums in other orders)."""
    gs, cams, _ = random_lift_scene(300, 2, 40, 4, seed=4)
    g = torch.Generator().manual_seed(4)
    gs.shN = 0.3 * torch.randn(len(gs), 8, 3, generator=g)
    feats = torch.randn(len(gs), 4, generator=g)
    leaves = {"means": gs.means, "shN": gs.shN, "opacities": gs.opacities}
    ups = [torch.randn(2, 40, 40, c, generator=g) for c in (3, 4)] + [torch.randn(2, 40, 40, generator=g)]

    def run(dev, fn):
        gd = gs.to(dev)
        for name in leaves:
            setattr(gd, name, getattr(gd, name).detach().clone().requires_grad_(True))
        f = feats.to(dev).requires_grad_(True)
        outs = fn(gd, cams.to(dev), f)
        loss = sum((o * u.to(dev)).mean() for o, u in zip(outs, ups))
        grads = torch.autograd.grad(loss, [getattr(gd, n) for n in leaves] + [f])
        return [o.detach().cpu() for o in outs], [t.cpu() for t in grads]

    def rendered(gd, c, f):
        r = render(gd, c, f)
        return r.rgb, r.features, r.alpha, r.d1

    out, grads = run(device, rendered)
    ref_out, ref_grads = run(torch.device("cpu"), _reference_render)
    assert ref_out[2].max() > 0.5 and gs.sh_degree == 2
    for name, a, b in zip(("rgb", "features", "alpha", "d1"), out, ref_out):
        assert (a - b).abs().max() <= 1e-4, name
    for name, a, b in zip(list(leaves) + ["features"], grads, ref_grads):
        scale = b.abs().max()
        assert scale > 0 and (a - b).abs().max() <= 1e-3 * scale, name


def test_fixed_views_render_equals_render_values_and_gradients(device):
    gs, cams, _ = random_lift_scene(400, 3, 40, 4, seed=1)
    gs, cams = gs.to(device), cams.to(device)
    fv = fixed_views(gs, cams)
    f = torch.randn(len(gs), 5, device=device, requires_grad=True)
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


def test_render_reuses_a_projection(device):
    gs, cams, _ = random_lift_scene(200, 2, 32, 4, seed=2)
    gs, cams, ones = gs.to(device), cams.to(device), torch.ones(len(gs), 2, device=device)
    a = render(gs, cams, ones, rgb=False)
    b = render(gs, cams, ones, rgb=False, projection=a.projection)
    assert torch.equal(a.features, b.features) and torch.equal(a.alpha, b.alpha)
    with pytest.raises(ShapeError, match="projection"):
        render(gs, cams[[0]], ones, rgb=False, projection=a.projection)


@pytest.mark.parametrize("rgb", [True, False])
def test_features_that_do_not_shape_the_geometry(rgb, device):
    """render(features_shape_geometry=False): the same images; a loss on the features reaches the features as
    before and the Gaussians' geometry not at all; a loss on RGB reaches the geometry as before (CUDA: within the
    rounding of the backward's atomics)."""
    gs, cams, _ = random_lift_scene(300, 2, 36, 4, seed=3)
    gs, cams = gs.to(device), cams.to(device)
    for t in (gs.means, gs.opacities):
        t.requires_grad_(True)
    f = torch.randn(len(gs), 4, device=device, requires_grad=True)
    g = torch.Generator().manual_seed(0)
    a = render(gs, cams, f, rgb=rgb)
    b = render(gs, cams, f, rgb=rgb, features_shape_geometry=False)
    assert torch.equal(a.features, b.features) and torch.equal(a.alpha, b.alpha)
    up = torch.randn(a.features.shape, generator=g).to(device)
    ga = torch.autograd.grad((a.features * up).sum(), [f, gs.means], allow_unused=True, retain_graph=True)
    gb = torch.autograd.grad((b.features * up).sum(), [f, gs.means], allow_unused=True, retain_graph=True)
    torch.testing.assert_close(gb[0], ga[0])
    assert ga[1].abs().sum() > 0 and (gb[1] is None or gb[1].abs().sum() == 0)
    if rgb:
        up = torch.randn(a.rgb.shape, generator=g).to(device)
        ra = torch.autograd.grad((a.rgb * up).sum(), gs.means)[0]
        rb = torch.autograd.grad((b.rgb * up).sum(), gs.means)[0]
        torch.testing.assert_close(rb, ra)
