"""VCD on a rendered two-surface scene: weights drop on mixed-depth rays and at the occlusion boundary."""
import math

import torch

from rh3dgs import Cameras, Gaussians
from rh3dgs.rendering import render
from rh3dgs.method.vcd import VCDConfig, reliability_weights


def _plane(x0, x1, y0, y1, z, spacing, sigma):
    xs = torch.arange(x0, x1 + 1e-6, spacing)
    ys = torch.arange(y0, y1 + 1e-6, spacing)
    gx, gy = torch.meshgrid(xs, ys, indexing="ij")
    means = torch.stack([gx.reshape(-1), gy.reshape(-1), torch.full((gx.numel(),), z)], -1)
    n = len(means)
    scales = torch.tensor([sigma, sigma, sigma * 0.05]).expand(n, 3)
    return means, scales


def test_rendered_two_surfaces():
    # camera at the origin looking down +z (OpenCV); front plane covers x < 0 at z = 2,
    # back plane covers everything at z = 4. A semi-transparent strip of the front plane
    # (x in [-0.9, -0.6], low opacity) lets the back plane show through: mixed depth.
    m1, s1 = _plane(-3.0, 0.0, -3.0, 3.0, 2.0, 0.05, 0.04)
    m2, s2 = _plane(-6.0, 6.0, -6.0, 6.0, 4.0, 0.1, 0.08)
    means, scales = torch.cat([m1, m2]), torch.cat([s1, s2])
    op = torch.full((len(means),), 0.95)
    strip = (means[:, 2] < 3) & (means[:, 0] > -0.9) & (means[:, 0] < -0.6)
    op[strip] = 0.35
    quats = torch.tensor([1.0, 0, 0, 0]).expand(len(means), 4)
    g = Gaussians.from_activated(means, scales, quats, op, torch.full((len(means), 3), 0.5))
    W = H = 96
    f = 60.0
    cam = Cameras(viewmats=torch.eye(4)[None], Ks=torch.tensor([[[f, 0, W / 2], [0, f, H / 2], [0, 0, 1]]]), width=W, height=H)
    r = render(g, cam, rgb=True)
    w, terms = reliability_weights(r.alpha, r.d1, r.d2, cfg=VCDConfig(), valid_mask=r.alpha > 0.5, return_terms=True)
    w = w[0]
    # columns: x_pixel = f * X / Z + W/2 ; boundary of the front plane at X = 0 -> column 48
    col = lambda X, Z: int(round(f * X / Z + W / 2))  # noqa: E731
    rows = slice(30, 66)
    interior_front = w[rows, col(-2.0, 2.0)].mean()  # x = -2 on the front plane (col 8)
    interior_back = w[rows, col(2.0, 4.0)].mean()  # back plane only (col 78)
    boundary = w[rows, 47:49].mean()  # occlusion boundary (front edge at col 48)
    mixed = w[rows, col(-0.75, 2.0)].mean()  # semi-transparent strip: rays hit both planes
    assert r.depth_var[0, rows, col(-0.75, 2.0)].mean() > 0.5  # really mixed depth (Var of {2, 4} mixture)
    assert r.depth_var[0, rows, col(-2.0, 2.0)].mean() < 0.01
    assert boundary < 0.5 * min(interior_front, interior_back), (boundary, interior_front, interior_back)
    assert mixed < 0.5 * min(interior_front, interior_back), (mixed, interior_front, interior_back)
    # per-view normalisation: mean over valid pixels is 1
    valid = r.alpha[0] > 0.5
    assert math.isclose(float(w[valid].mean()), 1.0, rel_tol=1e-4)
    # the terms behind it: W_var flags the mixed strip, W_edge the boundary, and neither the interiors
    var, edge = terms["var"][0], terms["edge"][0]
    assert var[rows, col(-0.75, 2.0)].mean() < 0.2 and var[rows, col(-2.0, 2.0)].mean() > 0.9
    assert edge[rows, 47:49].mean() < 0.5 and edge[rows, col(-2.0, 2.0)].mean() > 0.9
    # switching a term off removes its effect
    w_novar = reliability_weights(r.alpha, r.d1, r.d2, cfg=VCDConfig(use_variance=False), valid_mask=valid[None])[0]
    assert w_novar[rows, col(-0.75, 2.0)].mean() > 2 * mixed
