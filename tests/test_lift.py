"""Training-free lift vs an independent computation: enumerate every (view, pixel, Gaussian)
contribution with the torch reference, then take the robust Frechet mean per Gaussian."""
import math

import pytest
import torch

from _scenes import random_lift_scene
from rh3dgs.errors import ConfigError, NonFiniteError
from rh3dgs.lift import LiftConfig, lift
from rh3dgs.ops._ref import _ref_tile_contributions
from rh3dgs.render import render
from rh3dgs.sphere import geodesic_distance, robust_frechet_mean
from rh3dgs.vcd import reliability_weights


def _scene(n=300, views=4, size=40, D=8, seed=0):
    return random_lift_scene(n, views, size, D, seed)


def _explicit(gs, cams, maps, cfg):
    """Per-Gaussian samples (z, weight) by enumeration, then sphere.robust_frechet_mean."""
    H = W = cams.width
    up = torch.nn.functional.normalize(torch.nn.functional.interpolate(
        maps.permute(0, 3, 1, 2), size=(H, W), mode="bilinear", align_corners=False).permute(0, 2, 3, 1), dim=-1)
    zs, ws, segs = [], [], []
    for v in range(len(cams)):
        r = render(gs, cams[v], torch.ones(len(gs), 1), rgb=False)
        valid = r.alpha >= cfg.min_coverage
        wbar = reliability_weights(r.alpha, r.d1, r.d2, features=up[v:v + 1], cfg=cfg.vcd, valid_mask=valid) \
            if cfg.use_vcd else valid.float()
        p = r.projection
        for _, pix, ids, w, _ in _ref_tile_contributions(p.means2d, p.conics, p.opacities, W, H, p.tile_size,
                                                         p.isect_offsets, p.flatten_ids):
            w = w * wbar[0].reshape(-1)[pix][:, None]
            pi, ki = torch.nonzero(w > 0, as_tuple=True)
            zs.append(up[v].reshape(-1, up.shape[-1])[pix[pi]])
            ws.append(w[pi, ki])
            segs.append(ids[ki] % len(gs))
    z, w, seg = torch.cat(zs).double(), torch.cat(ws).double(), torch.cat(segs)
    delta = cfg.delta if cfg.method == "robust" else math.inf
    if cfg.method == "euclidean":
        mu = torch.zeros(len(gs), z.shape[1], dtype=torch.float64).index_add_(0, seg, w[:, None] * z)
        mu = torch.nn.functional.normalize(mu, dim=-1)
    else:
        mu, _ = robust_frechet_mean(z, w, seg, len(gs), delta=delta, max_iters=200, tol=1e-10, differentiable=False)
    weight = torch.zeros(len(gs), dtype=torch.float64).index_add_(0, seg, w)
    return mu.float(), weight.float()


@pytest.mark.parametrize("method,use_vcd", [("robust", True), ("karcher", True), ("euclidean", True), ("robust", False)])
def test_lift_matches_explicit_frechet_mean(method, use_vcd):
    gs, cams, maps = _scene()
    cfg = LiftConfig(method=method, use_vcd=use_vcd, iters=60, tol=1e-6, tol_quantile=1.0, views_per_batch=3, latent_dim=4)
    res = lift(gs, cams, maps, cfg, progress=False)
    mu, weight = _explicit(gs, cams, maps, cfg)
    torch.testing.assert_close(res.weight, weight, atol=1e-4, rtol=1e-4)
    ok = res.valid & (weight > 1e-3)
    assert ok.sum() > 100
    ang = geodesic_distance(res.features[ok].double(), mu[ok].double())
    assert ang.max() < 2e-3, float(ang.max())  # radians
    assert torch.allclose(res.features[ok].norm(dim=-1), torch.ones(int(ok.sum())), atol=1e-5)
    # PCA decoder: orthonormal columns, decoding reproduces the features' projection
    torch.testing.assert_close(res.decoder.T @ res.decoder, torch.eye(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(res.latents, res.features @ res.decoder)


def test_lift_streams_maps_and_is_deterministic():
    gs, cams, maps = _scene(seed=3)
    calls = []

    def provider(i):
        calls.append(i)
        return maps[i]

    a = lift(gs, cams, provider, LiftConfig(iters=2, views_per_batch=2, cache_projections=False), progress=False)
    b = lift(gs, cams, maps, LiftConfig(iters=2, views_per_batch=2), progress=False)
    assert torch.equal(a.features, b.features) and torch.equal(a.weight, b.weight)
    assert sorted(set(calls)) == list(range(len(cams)))


def test_lift_rejects_bad_input():
    gs, cams, maps = _scene()
    bad = maps.clone()
    bad[1, 2, 3, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="view 1"):
        lift(gs, cams, bad, progress=False)
    with pytest.raises(ConfigError, match="method"):
        LiftConfig(method="mean")
