"""Native rasterization op vs the pure-torch reference: values and all gradients, on every device present.

On CUDA the op runs csrc/cuda/rasterize.cu (gsplat's rasterizer where rh3dgs was built without CUDA kernels) and
is held to the same reference (computed on CPU) with the same tolerances: the reference sums in yet another order,
so the bounds below hold for any order of the float32 sums, including the CUDA backward's atomics.
"""
import pytest
import torch

from _scenes import on_device, random_projected
from rh3dgs.errors import ShapeError
from rh3dgs.ops import rasterize_to_pixels
from rh3dgs.ops._ref import _ref_rasterize_to_pixels

DIFF = ("means2d", "conics", "features", "opacities", "depths")


def _run(fn, scene, bg, upstream, mean_reduce, device="cpu"):
    """fn's outputs and gradients (on CPU) with the inputs, background and upstream gradients on ``device``."""
    ins = {k: scene[k].to(device).clone().requires_grad_(True) for k in DIFF}
    bgv = None if bg is None else bg.to(device).clone().requires_grad_(True)
    outs = fn(ins, bgv)
    scale = 1.0 / (scene["width"] * scene["height"]) if mean_reduce else 1.0
    loss = sum((o * u.to(device)).sum() for o, u in zip(outs, upstream)) * scale
    loss.backward()
    grads = {k: ins[k].grad.cpu() for k in DIFF}
    if bgv is not None:
        grads["backgrounds"] = bgv.grad.cpu()
    return [o.detach().cpu() for o in outs], grads


def _native(scene, geometry_channels=None):
    def fn(ins, bg):
        dev = ins["means2d"].device
        o = rasterize_to_pixels(**ins, width=scene["width"], height=scene["height"], tile_size=scene["tile_size"],
                                isect_offsets=scene["isect_offsets"].to(dev), flatten_ids=scene["flatten_ids"].to(dev),
                                backgrounds=bg, geometry_channels=geometry_channels)
        return [o.render, o.alpha, o.d1, o.d2]
    return fn


def _reference(scene, geometry_channels=None):
    def fn(ins, bg):
        return list(_ref_rasterize_to_pixels(ins["means2d"], ins["conics"], ins["features"], ins["opacities"],
                                             ins["depths"], bg, scene["width"], scene["height"], scene["tile_size"],
                                             scene["isect_offsets"], scene["flatten_ids"], geometry_channels))
    return fn


CASES = [  # (C, width, height, background, tile_size)
    (1, 32, 32, False, 16),
    (3, 37, 29, True, 16),
    (8, 40, 24, True, 16),  # one 8-channel block (transposed store)
    (11, 33, 41, True, 8),  # 3 scalars + an 8-float block: RGB + rh3dgs-lite's 8 latents
    (16, 50, 33, False, 16),
    (19, 35, 30, True, 16),  # 3 scalars + a 16-float block
    (16, 24, 40, True, 8),
    (32, 45, 31, True, 16),
    (32, 64, 48, False, 16),
]


@pytest.mark.parametrize("C,W,H,use_bg,tile", CASES)
def test_native_matches_reference(C, W, H, use_bg, tile, device):
    scene = random_projected(2, 80, C, W, H, tile_size=tile, seed=C + W)
    bg = torch.rand(2, C, generator=torch.Generator().manual_seed(1)) if use_bg else None
    g = torch.Generator().manual_seed(2)
    upstream = [torch.randn(2, H, W, C, generator=g)] + [torch.randn(2, H, W, generator=g) for _ in range(3)]
    # Mean-reduced loss (as in training): every output and gradient within 1e-4 absolute.
    out_n, grad_n = _run(_native(scene), scene, bg, upstream, mean_reduce=True, device=device)
    out_r, grad_r = _run(_reference(scene), scene, bg, upstream, mean_reduce=True)
    for a, b, name in zip(out_n, out_r, ("render", "alpha", "d1", "d2")):
        assert (a - b).abs().max() <= 1e-4, name
    assert out_n[1].max() > 0.5  # the scene really covers pixels
    for k in grad_r:
        assert (grad_n[k] - grad_r[k]).abs().max() <= 1e-4, k
        assert grad_r[k].abs().max() > 0, k  # non-trivial gradients
    # Sum-reduced loss: large gradients (|g| ~ 1e3 for conics) agree to float32 relative precision.
    _, grad_n = _run(_native(scene), scene, bg, upstream, mean_reduce=False, device=device)
    _, grad_r = _run(_reference(scene), scene, bg, upstream, mean_reduce=False)
    for k in grad_r:
        scale = max(1.0, grad_r[k].abs().max().item())
        assert (grad_n[k] - grad_r[k]).abs().max() <= 1e-5 * scale * 10, k


@pytest.mark.parametrize("C,cg,use_bg", [(19, 3, True), (19, 3, False), (35, 3, False), (16, 0, True), (32, 5, True),
                                        (5, 2, False), (11, 3, True), (11, 3, False), (8, 0, False)])
def test_geometry_channels_match_the_reference_with_detached_weights(C, cg, use_bg, device):
    """geometry_channels = cg: the channels from cg on reach the geometry with no gradient (the reference composites
    them with detached weights); values, their feature / background gradients and the geometry gradients of the
    first cg channels and of A, D1, D2 are those of the reference. C = 19 (RGB + 16 latents) and 16 are the
    compiled channel counts, 5 the generic kernel."""
    W, H = 41, 35
    scene = random_projected(2, 80, C, W, H, tile_size=16, seed=C + cg)
    bg = torch.rand(2, C, generator=torch.Generator().manual_seed(1)) if use_bg else None
    g = torch.Generator().manual_seed(3)
    upstream = [torch.randn(2, H, W, C, generator=g)] + [torch.randn(2, H, W, generator=g) for _ in range(3)]
    out_n, grad_n = _run(_native(scene, cg), scene, bg, upstream, mean_reduce=True, device=device)
    out_r, grad_r = _run(_reference(scene, cg), scene, bg, upstream, mean_reduce=True)
    _, grad_all = _run(_native(scene), scene, bg, upstream, mean_reduce=True, device=device)
    for a, b, name in zip(out_n, out_r, ("render", "alpha", "d1", "d2")):
        assert (a - b).abs().max() <= 1e-4, name
    for k in grad_r:
        assert (grad_n[k] - grad_r[k]).abs().max() <= 1e-4, k
    torch.testing.assert_close(grad_n["features"], grad_all["features"])  # the features' own gradients unchanged
    assert (grad_n["opacities"] - grad_all["opacities"]).abs().max() > 1e-3  # the other channels' share is gone
    with pytest.raises(ShapeError, match="geometry_channels"):
        _native(scene, -2)({k: scene[k].to(device) for k in DIFF}, None)


def test_float64_reference_agrees_with_float32_reference():
    """The reference itself is stable: float32 vs float64 evaluation of the same scene."""
    scene = random_projected(1, 60, 4, 40, 40, seed=7)
    s64 = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in scene.items()}
    a = _ref_rasterize_to_pixels(*(scene[k] for k in DIFF), None, 40, 40, 16, scene["isect_offsets"], scene["flatten_ids"])
    b = _ref_rasterize_to_pixels(*(s64[k] for k in DIFF), None, 40, 40, 16, scene["isect_offsets"], scene["flatten_ids"])
    n = rasterize_to_pixels(*(scene[k] for k in DIFF), 40, 40, 16, scene["isect_offsets"], scene["flatten_ids"])
    assert (a[0].double() - b[0]).abs().max() < 1e-5
    assert (n.render.double() - b[0]).abs().max() < 1e-5


def test_single_gaussian_closed_form(device):
    """One isotropic Gaussian at a pixel centre: alpha = o * exp(-d^2 / (2 s^2)), depth moments exact."""
    s2, o, z = 4.0, 0.8, 2.5
    means2d = torch.tensor([[[8.5, 8.5]]])
    conics = torch.tensor([[[1 / s2, 0.0, 1 / s2]]])
    feats = torch.tensor([[[0.2, -1.0]]])
    offsets = torch.zeros(1, 1, 1, dtype=torch.int32)
    fids = torch.zeros(1, dtype=torch.int32)
    bg = torch.tensor([[1.0, 3.0]])
    out = rasterize_to_pixels(*on_device((means2d, conics, feats, torch.tensor([[o]]), torch.tensor([[z]])), device),
                              16, 16, 16, offsets.to(device), fids.to(device), backgrounds=bg.to(device))
    out = on_device(out, "cpu")
    ys, xs = torch.meshgrid(torch.arange(16) + 0.5, torch.arange(16) + 0.5, indexing="ij")
    a = o * torch.exp(-((xs - 8.5) ** 2 + (ys - 8.5) ** 2) / (2 * s2))
    a = torch.where(a >= 1 / 255, a, torch.zeros_like(a))
    torch.testing.assert_close(out.alpha[0], a)
    torch.testing.assert_close(out.d1[0], a * z)
    torch.testing.assert_close(out.d2[0], a * z * z)
    torch.testing.assert_close(out.render[0], a[..., None] * feats[0, 0] + (1 - a)[..., None] * bg[0])


def test_early_termination_matches_gsplat_rule(device):
    """Opaque stack: a pixel stops before the Gaussian that would push T to <= 1e-4."""
    K = 6
    means2d = torch.full((1, K, 2), 4.5)
    conics = torch.tensor([1e-6, 0.0, 1e-6]).expand(1, K, 3).contiguous()
    opac = torch.full((1, K), 0.995)
    depths = torch.arange(1, K + 1, dtype=torch.float32)[None]
    feats = torch.arange(1, K + 1, dtype=torch.float32).reshape(1, K, 1)
    offsets = torch.zeros(1, 1, 1, dtype=torch.int32)
    fids = torch.arange(K, dtype=torch.int32)
    out = rasterize_to_pixels(*on_device((means2d, conics, feats, opac, depths), device), 8, 8, 16, offsets.to(device),
                              fids.to(device))
    out = on_device(out, "cpu")
    # centre pixel: T after the first Gaussian = 0.005, after the second 2.5e-5 <= 1e-4,
    # so only the first one (feature 1, depth 1) is composited.
    torch.testing.assert_close(out.render[0, 4, 4, 0], torch.tensor(0.995))
    torch.testing.assert_close(out.alpha[0, 4, 4], torch.tensor(0.995))
    torch.testing.assert_close(out.d1[0, 4, 4], torch.tensor(0.995))


def test_empty_scene_gives_background(device):
    offsets = torch.zeros(2, 2, 2, dtype=torch.int32, device=device)
    fids = torch.zeros(0, dtype=torch.int32, device=device)
    z = torch.zeros(2, 0, device=device)
    bg = torch.tensor([[0.1, 0.2, 0.3], [1.0, 2.0, 3.0]], device=device)
    out = rasterize_to_pixels(torch.zeros(2, 0, 2, device=device), torch.zeros(2, 0, 3, device=device),
                              torch.zeros(2, 0, 3, device=device), z, z, 20, 17, 16, offsets, fids, backgrounds=bg)
    assert out.render.shape == (2, 17, 20, 3)
    torch.testing.assert_close(out.render, bg[:, None, None, :].expand(2, 17, 20, 3))
    assert out.alpha.abs().max() == 0


def test_channel_count_64_and_bad_shapes(device):
    ref_scene = random_projected(1, 40, 64, 24, 24, seed=3)
    ref = _ref_rasterize_to_pixels(*(ref_scene[k] for k in DIFF), None, 24, 24, 16, ref_scene["isect_offsets"],
                                   ref_scene["flatten_ids"])
    scene = on_device(ref_scene, device)
    out = rasterize_to_pixels(*(scene[k] for k in DIFF), 24, 24, 16, scene["isect_offsets"], scene["flatten_ids"])
    assert (out.render.cpu() - ref[0]).abs().max() <= 1e-4
    with pytest.raises(ShapeError, match="features"):
        rasterize_to_pixels(scene["means2d"], scene["conics"], scene["features"][:, :5], scene["opacities"],
                            scene["depths"], 24, 24, 16, scene["isect_offsets"], scene["flatten_ids"])
    with pytest.raises(ShapeError, match="backgrounds"):
        rasterize_to_pixels(*(scene[k] for k in DIFF), 24, 24, 16, scene["isect_offsets"], scene["flatten_ids"],
                            backgrounds=torch.zeros(1, 3, device=device))


def test_deterministic_across_runs(device):
    """The forward is bit-identical across runs on every device; the backward on CPU too (per-thread sums added in
    a fixed order), on CUDA within the rounding of its atomics' order (1e-5 of the largest gradient)."""
    scene = on_device(random_projected(1, 200, 8, 64, 64, seed=5), device)
    ins = [scene[k].clone().requires_grad_(True) for k in DIFF]
    o1 = rasterize_to_pixels(*ins, 64, 64, 16, scene["isect_offsets"], scene["flatten_ids"])
    o1.render.sum().backward()
    g1 = [t.grad.clone() for t in ins]
    for t in ins:
        t.grad = None
    o2 = rasterize_to_pixels(*ins, 64, 64, 16, scene["isect_offsets"], scene["flatten_ids"])
    o2.render.sum().backward()
    assert torch.equal(o1.render, o2.render)
    for a, t in zip(g1, ins):
        if device.type == "cpu":
            assert torch.equal(a, t.grad)
        else:
            assert (a - t.grad).abs().max() <= 1e-5 * a.abs().max().clamp_min(1.0)


@pytest.mark.parametrize("cg", [None, 3, 0])
def test_gsplat_fallback_splits_the_geometry_channels(monkeypatch, cg):
    """The CUDA fallback (rh3dgs built without CUDA kernels: gsplat's compositing, stood in for here by the torch
    reference) gives the native op's values and gradients, with ``geometry_channels`` done as two calls."""
    import rh3dgs.ops.rasterize as R

    def fake_gsplat(means2d, conics, colors, opacities, width, height, tile_size, isect_offsets, flatten_ids,
                    backgrounds=None):
        zeros = torch.zeros(opacities.shape)
        out, alpha, _, _ = _ref_rasterize_to_pixels(means2d, conics, colors, opacities, zeros, backgrounds, width,
                                                    height, tile_size, isect_offsets, flatten_ids)
        return out, alpha[..., None]

    monkeypatch.setattr(R, "rasterize_to_pixels_cuda", fake_gsplat)
    W, H, C = 30, 26, 7
    scene = random_projected(1, 50, C, W, H, tile_size=16, seed=11)
    bg = torch.rand(1, C, generator=torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(5)
    upstream = [torch.randn(1, H, W, C, generator=g)] + [torch.randn(1, H, W, generator=g) for _ in range(3)]

    def fallback(ins, b):
        o = R._rasterize_gsplat(*(ins[k] for k in DIFF), b, W, H, 16, scene["isect_offsets"], scene["flatten_ids"],
                                -1 if cg is None else cg)
        return [o.render, o.alpha, o.d1, o.d2]

    out_f, grad_f = _run(fallback, scene, bg, upstream, mean_reduce=True)
    out_n, grad_n = _run(_native(scene, cg), scene, bg, upstream, mean_reduce=True)
    for a, b, name in zip(out_f, out_n, ("render", "alpha", "d1", "d2")):
        assert (a - b).abs().max() <= 1e-4, name
    for k in grad_n:
        assert (grad_f[k] - grad_n[k]).abs().max() <= 1e-4, k
