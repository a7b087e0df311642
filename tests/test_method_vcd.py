"""rh3dgs.method.vcd: reliability weights on hand-built render statistics of a two-surface scene."""
from __future__ import annotations

import math

import pytest
import torch

from rh3dgs.errors import ConfigError, NonFiniteError, ShapeError
from rh3dgs.method.vcd import VCDConfig, reliability_weights, render_depth_stats

H, W = 8, 16
Z_FRONT, Z_BACK = 1.0, 3.0


def two_surface(mixed: bool = True, low_alpha: bool = True):
    """Front plane (depth 1) over columns 0..7, back plane (depth 3) everywhere behind.

    Each pixel has compositing weights (w1 on the front plane, w2 on the back plane), and
    A = w1 + w2, D1 = w1 z1 + w2 z2, D2 = w1 z1^2 + w2 z2^2. With ``mixed`` the boundary
    columns 7 and 8 see both planes (partial coverage); ``low_alpha`` makes row 0, columns
    12..15 a thin (A = 0.2) part of the back plane.
    """
    w1 = torch.zeros(H, W, dtype=torch.float64)
    w2 = torch.zeros(H, W, dtype=torch.float64)
    w1[:, :8] = 0.985
    w2[:, :8] = 0.005  # a thin leak of weight onto the back plane
    w2[:, 8:] = 0.99
    if mixed:
        w1[:, 7], w2[:, 7] = 0.5, 0.48
        w1[:, 8], w2[:, 8] = 0.2, 0.78
    if low_alpha:
        w2[0, 12:] = 0.2
    A = w1 + w2
    D1 = w1 * Z_FRONT + w2 * Z_BACK
    D2 = w1 * Z_FRONT**2 + w2 * Z_BACK**2
    return A[None], D1[None], D2[None]


FRONT_IN = (4, 2)  # interior of the front plane
BACK_IN = (4, 13)  # interior of the back plane
LOW = (0, 13)  # low-alpha pixel, back plane, away from edges


def test_depth_stats_are_the_analytic_moments():
    A, D1, D2 = two_surface()
    dbar, var = render_depth_stats(A, D1, D2, eps=0.0)
    # column 7: weights 0.5 @ 1 and 0.48 @ 3
    p = 0.5 / 0.98
    assert math.isclose(float(dbar[0, 3, 7]), p * 1 + (1 - p) * 3, rel_tol=1e-12)
    assert math.isclose(float(var[0, 3, 7]), p * (1 - p) * (3 - 1) ** 2, rel_tol=1e-12)
    assert float(var[0, 3, 13]) == pytest.approx(0.0, abs=1e-12)


def test_mixed_and_boundary_pixels_get_lower_weight():
    A, D1, D2 = two_surface(mixed=True)
    w, t = reliability_weights(A, D1, D2, return_terms=True)
    w = w[0]
    interior = min(float(w[FRONT_IN]), float(w[BACK_IN]))
    for col in (7, 8):  # mixed-depth rays
        assert float(w[4, col]) < 0.05 * interior
    assert float(t["var"][0, 4, 7]) < 0.01  # 51/49 mix of depths 1 and 3
    assert float(t["var"][0, 4, 8]) < 0.2  # 20/80 mix
    assert float(t["var"][0, FRONT_IN[0], FRONT_IN[1]]) > 0.6  # 0.5 % leak onto the back plane
    assert float(t["var"][0, BACK_IN[0], BACK_IN[1]]) > 0.99


def test_hard_occlusion_boundary_is_caught_by_the_edge_term():
    A, D1, D2 = two_surface(mixed=False, low_alpha=False)
    w, t = reliability_weights(A, D1, D2, cfg=VCDConfig(edge_radius=0), return_terms=True)
    w = w[0]
    # no mixing: the variance term is high everywhere (front pixels leak 0.5 % onto the back)
    assert float(t["var"].min()) > 0.6
    # both sides of the edge are down-weighted, the interiors are not
    for col in (7, 8):
        assert float(w[4, col]) < 0.01 * float(w[FRONT_IN])
        assert float(w[4, col]) < 0.01 * float(w[BACK_IN])
    assert float(w[FRONT_IN]) == pytest.approx(float(w[4, 5]), rel=1e-6)
    # g_depth on the edge = |1 - 3| / 3 (symmetric relative step), ~0 inside
    g = t["edge_depth"][0]
    assert float(g[4, 7]) == pytest.approx(float(g[4, 8]), rel=1e-3)
    assert float(g[4, 7]) == pytest.approx((Z_BACK - D1[0, 4, 7] / (A[0, 4, 7] + 1e-6)).item() / Z_BACK, rel=1e-3)
    assert float(g[4, 3]) < 1e-5
    # dilation widens the band by one pixel each side
    _, t1 = reliability_weights(A, D1, D2, cfg=VCDConfig(edge_radius=1), return_terms=True)
    assert float(t1["edge"][0, 4, 6]) < 0.01 and float(t1["edge"][0, 4, 9]) < 0.01
    assert float(t1["edge"][0, 4, 5]) > 0.99 and float(t["edge"][0, 4, 6]) > 0.99


def test_low_alpha_pixels_get_lower_weight():
    A, D1, D2 = two_surface()
    w, t = reliability_weights(A, D1, D2, return_terms=True)
    # W_op = (0.2 / 0.9)^2 and (0.99 / 0.9 -> 1)^2
    assert float(t["op"][0, LOW[0], LOW[1]]) == pytest.approx((0.2 / 0.9) ** 2, rel=1e-4)
    assert float(t["op"][0, BACK_IN[0], BACK_IN[1]]) == pytest.approx(1.0)
    assert float(w[0, LOW[0], LOW[1]]) < 0.1 * float(w[0, BACK_IN[0], BACK_IN[1]])


def test_per_view_mean_is_one_and_no_gradient():
    A, D1, D2 = two_surface()
    A2, D12, D22 = two_surface(mixed=False, low_alpha=False)
    A = torch.cat([A, A2]).requires_grad_(True)
    D1, D2 = torch.cat([D1, D12]), torch.cat([D2, D22])
    w = reliability_weights(A, D1, D2)
    assert w.shape == (2, H, W) and not w.requires_grad
    assert torch.allclose(w.mean((1, 2)), torch.ones(2, dtype=w.dtype), atol=1e-12)
    mask = torch.zeros(2, H, W, dtype=torch.bool)
    mask[:, :, 4:12] = True
    wm = reliability_weights(A, D1, D2, valid_mask=mask)
    assert torch.allclose(wm[mask].reshape(2, -1).mean(1), torch.ones(2, dtype=w.dtype), atol=1e-12)
    assert float(wm[~mask].abs().max()) == 0.0
    # [H, W] input works too
    assert reliability_weights(A[0], D1[0], D2[0]).shape == (H, W)


def test_weights_are_scale_free():
    A, D1, D2 = two_surface()
    w = reliability_weights(A, D1, D2)
    w10 = reliability_weights(A, 10 * D1, 100 * D2)
    assert torch.allclose(w, w10, rtol=1e-4, atol=1e-8)


def test_each_switch_removes_its_effect():
    A, D1, D2 = two_surface(mixed=True)
    base = VCDConfig(edge_radius=0)
    _, t = reliability_weights(A, D1, D2, cfg=base, return_terms=True)
    assert torch.allclose(t["raw"], t["op"] * t["var"] * t["edge"])

    # opacity off: the low-alpha pixel weighs as much as its interior neighbour
    w, t = reliability_weights(A, D1, D2, cfg=VCDConfig(edge_radius=0, use_opacity=False), return_terms=True)
    assert torch.equal(t["op"], torch.ones_like(t["op"]))
    assert float(w[0, LOW[0], LOW[1]]) == pytest.approx(float(w[0, 4, 13]), rel=1e-3)

    # variance off: the mixed columns are only down-weighted by the edge term
    w, t = reliability_weights(A, D1, D2, cfg=VCDConfig(edge_radius=0, use_variance=False), return_terms=True)
    assert torch.equal(t["var"], torch.ones_like(t["var"]))
    assert torch.allclose(t["raw"], t["op"] * t["edge"])

    # edge off: a hard boundary pixel weighs as much as the interior
    A2, D12, D22 = two_surface(mixed=False, low_alpha=False)
    w, t = reliability_weights(A2, D12, D22, cfg=VCDConfig(edge_radius=0, use_edge=False), return_terms=True)
    assert torch.equal(t["edge"], torch.ones_like(t["edge"]))
    assert float(w[0, 4, 7]) == pytest.approx(float(w[0, FRONT_IN[0], FRONT_IN[1]]), rel=1e-3)
    assert float(w[0, 4, 8]) == pytest.approx(float(w[0, BACK_IN[0], BACK_IN[1]]), rel=1e-3)

    # all off: uniform weights
    w = reliability_weights(A, D1, D2, cfg=VCDConfig(use_opacity=False, use_edge=False, use_variance=False))
    assert torch.allclose(w, torch.ones_like(w))


def test_feature_edges():
    A, D1, D2 = two_surface(mixed=False, low_alpha=False)
    # constant depth so that only feature edges matter
    A = torch.ones_like(A)
    D1, D2 = 2.0 * A, 4.0 * A
    feats = torch.zeros(1, H, W, 4, dtype=torch.float64)
    feats[:, :, :5, 0] = 1.0
    feats[:, :, 5:, 1] = 1.0  # orthogonal features: 1 - cos = 1 across column 4|5
    w, t = reliability_weights(A, D1, D2, features=feats, cfg=VCDConfig(edge_radius=0), return_terms=True)
    assert float(t["edge_feat"][0, 3, 4]) == pytest.approx(1.0) and float(t["edge_feat"][0, 3, 5]) == pytest.approx(1.0)
    assert float(t["edge_feat"][0, 3, 2]) == pytest.approx(0.0, abs=1e-12)
    assert float(w[0, 3, 4]) < 1e-3 * float(w[0, 3, 1])
    w_off = reliability_weights(A, D1, D2, features=feats, cfg=VCDConfig(edge_radius=0, edge_features=False))
    assert torch.allclose(w_off, torch.ones_like(w_off))
    w_none = reliability_weights(A, D1, D2)
    assert torch.allclose(w_none, torch.ones_like(w_none))


def test_degenerate_view_and_validation():
    A = torch.zeros(1, 4, 4)
    w = reliability_weights(A, A.clone(), A.clone())
    assert torch.allclose(w, torch.ones_like(w))  # empty view: uniform fallback
    with pytest.raises(ShapeError):
        reliability_weights(A, A[:, :3], A)
    with pytest.raises(ShapeError):
        reliability_weights(A, A, A, features=torch.zeros(1, 4, 4))
    with pytest.raises(NonFiniteError):
        reliability_weights(A * float("nan"), A, A)
    with pytest.raises(ConfigError):
        VCDConfig(variance_scale=0.0)
    with pytest.raises(ConfigError):
        VCDConfig(edge_radius=-1)


def test_mask_specificity_term():
    """W_seg = (frac / the view's smallest frac) ** -gamma; no effect when every pixel's region has the same share."""
    A = torch.ones(2, 4, 6, dtype=torch.float64)
    D1, D2 = 2.0 * A, 4.0 * A
    frac = torch.full((2, 4, 6), 0.5, dtype=torch.float64)
    frac[0, :, :2] = 1 / 24  # view 0: a small region (2 px... as a share) next to a large one
    frac[0, 0, 5] = 0.0  # no teacher region (no feature): weight 0
    cfg = VCDConfig.rh3dgs(segment_power=0.25)
    w, t = reliability_weights(A, D1, D2, cfg=cfg, region_fraction=frac, return_terms=True)
    assert float(t["segment"][0, 1, 0]) == pytest.approx(1.0)
    assert float(t["segment"][0, 1, 3]) == pytest.approx(12.0 ** -0.25)
    assert float(w[0, 1, 0] / w[0, 1, 3]) == pytest.approx(12.0 ** 0.25)
    assert float(w[0, 0, 5]) == 0.0
    assert torch.allclose(w[1], torch.ones(4, 6, dtype=torch.float64))  # one share everywhere: uniform
    w0 = reliability_weights(A, D1, D2, cfg=VCDConfig.rh3dgs(segment_power=0.0), region_fraction=frac)
    assert torch.allclose(w0, torch.ones_like(w0))  # gamma 0: the term is off
    assert torch.allclose(reliability_weights(A, D1, D2, cfg=cfg), torch.ones_like(w0))  # no region map: off
    with pytest.raises(ShapeError):
        reliability_weights(A, D1, D2, cfg=cfg, region_fraction=frac[:, :3])
    with pytest.raises(ConfigError):
        VCDConfig(segment_power=-0.1)


def test_mixing_terms_only_against_a_teacher_coarser_than_the_render():
    """mixing_coarse_only: W_op and W_var apply for a footprint > 1 px (a patch teacher), not at the render's
    resolution (footprint 0 or 1: a mask teacher), where only the other terms remain."""
    from rh3dgs.method.vcd import pixel_weights, teacher_footprint

    A, D1, D2 = two_surface(mixed=True, low_alpha=True)
    A, D1, D2 = A.float(), D1.float(), D2.float()
    frac = torch.full_like(A, 0.5)
    frac[:, :, :8] = 0.05
    on = VCDConfig.rh3dgs()  # the lift's: both terms always
    coarse_only = VCDConfig.rh3dgs(mixing_coarse_only=True)  # the objective's
    without = VCDConfig.rh3dgs(use_opacity=False, use_variance=False)
    kw = dict(min_coverage=0.0, region_fraction=frac)
    for fp in (0.0, 1.0):
        w = pixel_weights(A, D1, D2, vcd=coarse_only, footprint=fp, **kw)
        assert torch.equal(w, pixel_weights(A, D1, D2, vcd=without, footprint=fp, **kw))
        assert float(w[0, 4, 7]) > 0.5 * float(w[0, FRONT_IN[0], FRONT_IN[1]])  # the mixed pixel keeps its weight
    w8 = pixel_weights(A, D1, D2, vcd=coarse_only, footprint=8.0, **kw)
    assert torch.equal(w8, pixel_weights(A, D1, D2, vcd=on, footprint=8.0, **kw))
    assert float(w8[0, 4, 7]) < 0.05 * float(w8[0, FRONT_IN[0], FRONT_IN[1]])
    assert teacher_footprint((16, 16), (128, 128)) == 8.0 and teacher_footprint((16, 12), (128, 128)) == 128 / 12
    assert teacher_footprint((128, 128), (128, 128)) == 0.0 and teacher_footprint((256, 256), (128, 128)) == 0.0
