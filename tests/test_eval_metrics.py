"""rh3dgs.eval: metrics and benchmark protocols against hand-computed examples."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from rh3dgs.errors import ShapeError
from rh3dgs.eval import (
    boundary_band,
    boundary_dilation,
    boundary_iou,
    box_filter,
    confusion_matrix,
    iou,
    lerf_ovs_iou,
    lerf_ovs_mask,
    lerf_ovs_normalize,
    lerf_ovs_smooth,
    localization_accuracy,
    macc,
    macc_3d,
    majority_filter,
    mbiou,
    miou,
    miou_3d,
    ovs3d_eval,
    per_class_iou,
    pixel_accuracy,
    semantic_miou,
)


def square(top, left, side=6, shape=(20, 20)):
    m = np.zeros(shape, bool)
    m[top:top + side, left:left + side] = True
    return m


# ------------------------------------------------------------------------------- IoU
def test_iou_squares_offset_by_one_pixel():
    g, p = square(5, 5), square(5, 6)
    # overlap 6 x 5 = 30, union 36 + 36 - 30 = 42
    assert iou(p, g) == pytest.approx(30 / 42)
    assert iou(torch.from_numpy(p), torch.from_numpy(g)) == pytest.approx(30 / 42)
    # diagonal offset: overlap 5 x 5 = 25, union 72 - 25 = 47
    assert iou(square(6, 6), g) == pytest.approx(25 / 47)


def test_iou_perfect_disjoint_empty():
    g = square(5, 5)
    assert iou(g, g) == 1.0
    assert iou(square(12, 12), g) == 0.0
    empty = np.zeros_like(g)
    assert iou(empty, empty) == 1.0  # empty vs empty: perfect agreement
    assert iou(empty, g) == 0.0 and iou(g, empty) == 0.0
    assert iou(g.astype(np.uint8) * 255, g) == 1.0  # non-bool masks: nonzero = inside


def test_miou_is_mean_over_pairs():
    g = square(5, 5)
    assert miou([g, g], [g, square(5, 6)]) == pytest.approx((1 + 30 / 42) / 2)
    assert miou(np.stack([g, g]), np.stack([g, g])) == 1.0
    with pytest.raises(ShapeError):
        miou([g], [g, g])


def test_iou_shape_errors():
    with pytest.raises(ShapeError):
        iou(np.zeros((4, 4), bool), np.zeros((4, 5), bool))
    with pytest.raises(ShapeError):
        iou(np.zeros((2, 4, 4), bool), np.zeros((2, 4, 4), bool))


# ------------------------------------------------------------------------ boundary IoU
def test_boundary_dilation_width():
    assert boundary_dilation(20, 20) == 1  # 0.02 * 28.3 = 0.57 -> round 1
    assert boundary_dilation(1280, 720) == 29  # 0.02 * 1468.6 = 29.4
    assert boundary_dilation(128, 128) == 4  # 0.02 * 181 = 3.6
    assert boundary_dilation(8, 8) == 1  # at least one pixel


def test_boundary_band_is_ring_and_includes_image_border():
    g = square(5, 5)
    band = boundary_band(g, dilation=1)
    inner = square(6, 6, side=4)
    assert np.array_equal(band, g & ~inner)  # 36 - 16 = 20 pixels
    assert band.sum() == 20
    assert boundary_band(g, dilation=2).sum() == 36 - 4
    full = np.ones((10, 10), bool)  # touches the image border everywhere
    ring = boundary_band(full, dilation=1)
    assert ring.sum() == 100 - 64 and not ring[1:-1, 1:-1].any()


def test_boundary_iou_square_shifted_by_one_d1():
    g, p = square(5, 5), square(5, 6)
    # rings of width 1 (20 px each). Top and bottom rows overlap in columns 6..10 (5 + 5);
    # the side columns (5, 10 vs 6, 11) never coincide -> |I| = 10, |U| = 20 + 20 - 10 = 30.
    assert boundary_dilation(*g.shape) == 1
    assert boundary_iou(p, g) == pytest.approx(10 / 30)
    assert boundary_iou(p, g, dilation=1) == pytest.approx(1 / 3)
    # d = 2: rings of 32 px; rows 5,6,9,10 overlap in cols 6..10 -> 4 * 5 = 20; side columns
    # (5,6,9,10 vs 6,7,10,11) share cols 6 and 10 in rows 7,8 -> 4 more. |I| = 24, |U| = 40.
    assert boundary_iou(p, g, dilation=2) == pytest.approx(24 / 40)


def test_boundary_iou_perfect_disjoint_empty_and_mean():
    g = square(5, 5)
    assert boundary_iou(g, g) == 1.0
    assert boundary_iou(square(12, 12), g) == 0.0
    empty = np.zeros_like(g)
    assert boundary_iou(empty, empty) == 1.0
    assert boundary_iou(empty, g) == 0.0
    assert mbiou([g, square(5, 6)], [g, g], dilation=1) == pytest.approx((1 + 1 / 3) / 2)


def test_boundary_iou_ignores_interior_errors():
    g = np.zeros((64, 64), bool)
    g[8:56, 8:56] = True
    p = g.copy()
    p[30:34, 30:34] = False  # a hole deep inside: hurts IoU, adds a boundary of its own
    d = boundary_dilation(64, 64)  # 2
    assert iou(p, g) < 1.0
    # the ring of the original square is untouched, the hole's ring is extra
    assert boundary_iou(p, g) == pytest.approx(boundary_band(g, dilation=d).sum() / boundary_band(p, dilation=d).sum())


# ------------------------------------------------------------------------- label maps
GT = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
PRED = np.array([0, 0, 1, 1, 1, 1, 2, 2, 2, 0])


def test_confusion_matrix_macc_and_semantic_miou():
    cm = confusion_matrix(PRED, GT)
    assert cm.tolist() == [[2, 2, 0], [0, 2, 0], [1, 0, 3]]
    # per-class accuracy 2/4, 2/2, 3/4 -> mean 0.75
    assert macc(PRED, GT) == pytest.approx(0.75)
    # IoU: class 0 2/(4+3-2)=0.4, class 1 2/(2+4-2)=0.5, class 2 3/(4+3-3)=0.75
    assert per_class_iou(cm) == pytest.approx([0.4, 0.5, 0.75])
    assert semantic_miou(PRED, GT) == pytest.approx(0.55)
    assert pixel_accuracy(PRED, GT) == pytest.approx(0.7)
    # 2D label maps behave the same
    assert macc(torch.from_numpy(PRED.reshape(2, 5)), torch.from_numpy(GT.reshape(2, 5))) == pytest.approx(0.75)


def test_label_metrics_ignore_index_and_absent_classes():
    gt = np.array([0, 0, 255, 1, 1])
    pred = np.array([0, 1, 2, 1, 1])  # the prediction at the ignored pixel does not count
    assert pixel_accuracy(pred, gt, ignore_index=255) == pytest.approx(3 / 4)
    assert macc(pred, gt) == pytest.approx((1 / 2 + 1) / 2)
    # class 2 is never predicted on a counted pixel, absent from gt -> NaN, left out
    assert semantic_miou(pred, gt, num_classes=3) == pytest.approx((1 / 2 + 2 / 3) / 2)
    # a class predicted but absent from the ground truth scores IoU 0 (not left out)
    assert semantic_miou(np.array([0, 2]), np.array([0, 0]), num_classes=3) == pytest.approx((1 / 2 + 0) / 2)


def test_prediction_outside_class_range_is_a_miss():
    gt = np.array([0, 0, 1, 1])
    pred = np.array([0, 255, 1, 1])  # 255 = "no class" predicted
    assert macc(pred, gt, num_classes=2, ignore_index=None) == pytest.approx((0.5 + 1) / 2)
    assert semantic_miou(pred, gt, num_classes=2, ignore_index=None) == pytest.approx((0.5 + 1) / 2)


def test_3d_metrics_per_gaussian():
    gt = torch.tensor([0, 0, 0, 1, 1, 2, -1, -1])
    pred = torch.tensor([0, 0, 1, 1, 1, 2, 0, 2])
    # class 0: tp 2, fn 1 -> acc 2/3, iou 2/3; class 1: tp 2, fp 1 -> acc 1, iou 2/3; class 2: 1, 1
    assert macc_3d(pred, gt) == pytest.approx((2 / 3 + 1 + 1) / 3)
    assert miou_3d(pred, gt) == pytest.approx((2 / 3 + 2 / 3 + 1) / 3)
    assert miou_3d(gt, gt) == 1.0 and macc_3d(gt, gt) == 1.0
    with pytest.raises(ShapeError):
        miou_3d(pred.reshape(2, 4), gt.reshape(2, 4))


# ---------------------------------------------------------------------- localisation
def test_localization_accuracy_argmax_of_smoothed_map():
    r = np.zeros((80, 100))
    r[40:70, 50:90] = 0.8  # broad plateau (the object)
    r[5, 5] = 1.0  # one-pixel spike elsewhere
    box_obj = [[50, 40, 89, 69]]  # x1 y1 x2 y2
    box_spike = [[0, 0, 10, 10]]
    assert localization_accuracy(r, box_obj) == 1.0  # mean-30 smoothing ignores the spike
    assert localization_accuracy(r, box_spike) == 0.0
    assert localization_accuracy(r, box_spike, smoothing=None) == 1.0  # raw argmax is the spike
    assert localization_accuracy(r, box_spike + box_obj) == 1.0  # inside any box
    assert localization_accuracy(r, [[89, 69, 50, 40]]) == 1.0  # corner order does not matter
    assert localization_accuracy(torch.from_numpy(r), np.array(box_obj)) == 1.0
    assert localization_accuracy(r, np.zeros((0, 4))) == 0.0


# ------------------------------------------------------------------ LERF-OVS protocol
def _reflect101(k: int, n: int) -> int:
    while k < 0 or k >= n:
        k = -k if k < 0 else 2 * (n - 1) - k
    return k


def _direct_smooth(r: np.ndarray) -> np.ndarray:
    """0.5 * (r + mean over rows i-15..i+14, cols j-15..j+14, reflect-101 borders), by loops."""
    H, W = r.shape
    out = np.empty_like(r)
    for i in range(H):
        rows = [_reflect101(k, H) for k in range(i - 15, i + 15)]
        for j in range(W):
            cols = [_reflect101(k, W) for k in range(j - 15, j + 15)]
            out[i, j] = r[np.ix_(rows, cols)].mean()
    return 0.5 * (r + out)


def test_lerf_smoothing_equals_direct_numpy():
    r = np.random.default_rng(0).random((37, 45))
    np.testing.assert_allclose(lerf_ovs_smooth(r), _direct_smooth(r), rtol=0, atol=1e-12)
    np.testing.assert_allclose(lerf_ovs_smooth(torch.from_numpy(r)), _direct_smooth(r), atol=1e-12)


def test_box_filter_matches_opencv_if_available():
    cv2 = pytest.importorskip("cv2")
    r = np.random.default_rng(1).random((50, 61)).astype(np.float32)
    np.testing.assert_allclose(box_filter(r, 30), cv2.filter2D(r, -1, np.ones((30, 30)) / 900.0), atol=1e-6)
    np.testing.assert_allclose(box_filter(r, 7), cv2.blur(r, (7, 7), borderType=cv2.BORDER_REFLECT_101), atol=1e-6)


def test_lerf_normalize():
    s = np.array([[1.0, 2.0], [3.0, 5.0]])
    x = (s - 1) / 4  # 0, .25, .5, 1
    np.testing.assert_allclose(lerf_ovs_normalize(s), np.clip(2 * x - 1, 0, 1), atol=1e-8)


def test_majority_filter_removes_speck_and_fills_hole():
    m = np.zeros((15, 15), bool)
    m[7, 7] = True
    assert not majority_filter(m).any()
    blob = np.zeros((20, 20), bool)
    blob[4:16, 4:16] = True
    holed = blob.copy()
    holed[9, 9] = False
    out = majority_filter(holed)
    assert out[9, 9] and np.array_equal(out[6:14, 6:14], blob[6:14, 6:14])
    assert np.array_equal(majority_filter(np.ones((5, 5), bool)), np.ones((5, 5), bool))


def _langsplat_smooth(mask):
    """LangSplat's eval ``smooth`` (with its end-of-window cap at h - 1 / w - 1)."""
    h, w = mask.shape
    out = mask.copy()
    for i in range(h):
        for j in range(w):
            sq = mask[max(0, i - 3):min(i + 4, h - 1), max(0, j - 3):min(j + 4, w - 1)]
            out[i, j] = np.argmax(np.bincount(sq.reshape(-1)))
    return out


def test_majority_filter_reproduces_langsplat_with_border_quirk():
    rng = np.random.default_rng(2)
    for _ in range(3):
        m = (rng.random((17, 23)) < 0.5).astype(np.uint8)
        assert np.array_equal(majority_filter(m, 7, langsplat_border=True), _langsplat_smooth(m).astype(bool))


def test_lerf_ovs_mask_recovers_region():
    rng = np.random.default_rng(3)
    gt = np.zeros((90, 120), bool)
    gt[30:70, 40:100] = True
    r = 0.45 + 0.3 * gt + 0.03 * rng.standard_normal(gt.shape)
    r[2, 2] = 0.95  # an isolated hot pixel
    mask = lerf_ovs_mask(r)
    assert mask.dtype == np.bool_ and mask.shape == gt.shape
    assert not mask[:10, :10].any()
    # the protocol's smoothing rounds the corners and its threshold (0.7 of the normalised
    # range) shrinks the region a little: high, not perfect, IoU
    assert lerf_ovs_iou(r, gt) > 0.75


# ---------------------------------------------------------------------- 3D-OVS protocol
def test_ovs3d_eval_hand_example():
    # 2 x 3 image, classes a (left two columns) and b (right column)
    gt = np.zeros((2, 2, 3), bool)
    gt[0, :, :2] = True
    gt[1, :, 2] = True
    scores = np.zeros((2, 2, 3))
    scores[0] = [[0.9, 0.9, 0.2], [0.9, 0.1, 0.2]]
    scores[1] = [[0.1, 0.1, 0.8], [0.1, 0.8, 0.8]]
    # argmax: [[a, a, b], [a, b, b]] -> a: I=3, U=4; b: I=2, U=3; accuracy 5/6
    res = ovs3d_eval(scores, gt)
    assert res["pred"].tolist() == [[0, 0, 1], [0, 1, 1]]
    assert res["per_class_iou"] == pytest.approx([3 / 4, 2 / 3])
    assert res["miou"] == pytest.approx((3 / 4 + 2 / 3) / 2)
    assert res["accuracy"] == pytest.approx(5 / 6)
    # batched views and torch input
    res2 = ovs3d_eval(torch.from_numpy(np.stack([scores, scores])), torch.from_numpy(np.stack([gt, gt])))
    assert res2["miou"] == pytest.approx(res["miou"]) and res2["per_class_iou"].shape == (2, 2)


def test_ovs3d_eval_empty_classes_and_unlabeled_pixels():
    gt = np.zeros((3, 1, 4), bool)
    gt[0, 0, :2] = True
    gt[1, 0, 2] = True  # class 2 absent from this view; pixel 3 unlabeled
    scores = np.zeros((3, 1, 4))
    scores[0, 0, :2] = 1
    scores[1, 0, 2:] = 1  # pixel 3 predicted class 1
    res = ovs3d_eval(scores, gt)
    assert np.isnan(res["per_class_iou"][2])
    assert res["miou"] == pytest.approx((1 + 1 / 2) / 2)
    assert ovs3d_eval(scores, gt, empty_iou=0.0)["miou"] == pytest.approx((1 + 1 / 2 + 0) / 3)
    assert res["accuracy"] == pytest.approx(3 / 4)  # the unlabeled pixel counts as wrong
    assert ovs3d_eval(scores, gt, ignore_unlabeled=True)["accuracy"] == pytest.approx(1.0)
    with pytest.raises(ShapeError):
        ovs3d_eval(scores, gt[:2])
