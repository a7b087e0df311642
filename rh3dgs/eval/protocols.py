"""Benchmark protocols: relevancy map -> mask (LERF-OVS, LangSplat) and class argmax (3D-OVS).

LERF-OVS mask protocol (LangSplat's ``eval/evaluate_iou_loc.py``), for one relevancy
map ``r`` [H, W] of one text query in one frame:

1. smooth: ``s = 0.5 * (r + mean_30x30(r))`` (:func:`lerf_ovs_smooth`);
2. normalise: ``s = (s - min s) / (max(s - min s) + 1e-9)``, then ``clip(2 s - 1, 0, 1)``
   (:func:`lerf_ovs_normalize`);
3. threshold: ``s > 0.4``;
4. 7x7 majority filter (:func:`majority_filter`) -> predicted mask, scored by IoU
   against the ground-truth mask (mIoU over (frame, query) pairs).

``mean_30x30`` (:func:`box_filter`) reproduces ``cv2.filter2D(r, -1, ones((30, 30)) / 900)``:
an even-sized kernel is anchored at ``(15, 15)``, so pixel (i, j) averages rows
``i-15 .. i+14`` and columns ``j-15 .. j+14``; the output has the input's size and the
image is extended by reflection *without* repeating the edge pixel (OpenCV's default
``BORDER_REFLECT_101``, numpy's ``"reflect"``). Localisation (the argmax of the smoothed map
inside a GT box) is :func:`rh3dgs.eval.metrics.localization_accuracy`.

3D-OVS protocol (Liu et al. 2023, ``renderer.py::evaluation_segmentation_test``): for every
test view, scores [Q, H, W] of the Q classes of ``segmentations/classes.txt``; per-pixel
argmax over the classes; per-class IoU of ``argmax == q`` against the class mask; mIoU =
mean over (view, class); accuracy = fraction of pixels whose one-hot prediction equals
the ground-truth one-hot row (sklearn's subset accuracy: a pixel with no or several
ground-truth classes is never correct). See :func:`ovs3d_eval` for the one choice that
differs from the reference code by default (classes absent from both prediction and
ground truth of a view).

All functions take numpy arrays or torch tensors and return numpy arrays / floats.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from ..errors import ShapeError
from .metrics import _np, iou

__all__ = [
    "localization_accuracy",
    "LERF_OVS_THRESHOLD",
    "box_filter",
    "lerf_ovs_smooth",
    "lerf_ovs_normalize",
    "majority_filter",
    "lerf_ovs_mask",
    "lerf_ovs_iou",
    "ovs3d_eval",
]

#: LangSplat's mask threshold on the normalised, smoothed relevancy.
LERF_OVS_THRESHOLD = 0.4


def _map2d(a: Any, fn: str) -> np.ndarray:
    r = _np(a).astype(np.float64)
    if r.ndim != 2:
        raise ShapeError(f"{fn}: expected a 2D map [H, W], got shape {list(r.shape)}")
    return r


def box_filter(r: Any, size: int = 30) -> np.ndarray:
    """Mean over a ``size`` x ``size`` window, same output size, OpenCV ``filter2D`` conventions.

    The window of pixel (i, j) spans rows ``i - size//2 .. i + size - 1 - size//2`` (and the
    same for columns); outside the image the map is reflected without repeating the edge
    (``BORDER_REFLECT_101``).
    """
    x = _map2d(r, "box_filter")
    size = int(size)
    if size < 1:
        raise ValueError(f"box_filter: size must be >= 1, got {size}")
    before, after = size // 2, size - 1 - size // 2
    p = np.pad(x, ((before, after), (before, after)), mode="reflect")
    c = np.zeros((p.shape[0] + 1, p.shape[1] + 1))
    c[1:, 1:] = p.cumsum(0).cumsum(1)
    H, W = x.shape
    s = c[size:size + H, size:size + W] - c[:H, size:size + W] - c[size:size + H, :W] + c[:H, :W]
    return s / float(size * size)


def lerf_ovs_smooth(r: Any) -> np.ndarray:
    """LangSplat's smoothing: ``0.5 * (r + mean_30x30(r))`` (see :func:`box_filter`)."""
    x = _map2d(r, "lerf_ovs_smooth")
    return 0.5 * (x + box_filter(x, 30))


def lerf_ovs_normalize(s: Any) -> np.ndarray:
    """Min-max normalise (``/ (max + 1e-9)`` after subtracting the min), then ``clip(2 s - 1, 0, 1)``."""
    x = _map2d(s, "lerf_ovs_normalize")
    x = x - x.min()
    x = x / (x.max() + 1e-9)
    return np.clip(2.0 * x - 1.0, 0.0, 1.0)


def majority_filter(mask: Any, size: int = 7, langsplat_border: bool = False) -> np.ndarray:
    """Binary majority vote over a ``size`` x ``size`` window (odd size), truncated at the border.

    A pixel is set when strictly more than half of the window's pixels inside the image
    are set (ties -> 0, as ``argmax(bincount)`` in LangSplat's ``smooth``). With
    ``langsplat_border=True`` the window's end is additionally capped at ``H - 1`` / ``W - 1``
    (exclusive), reproducing LangSplat's off-by-one that never lets the last row / column
    vote.
    """
    m = _np(mask)
    if m.ndim != 2:
        raise ShapeError(f"majority_filter: mask must be [H, W], got {list(m.shape)}")
    size = int(size)
    if size < 1 or size % 2 == 0:
        raise ValueError(f"majority_filter: size must be a positive odd integer, got {size}")
    m = (m != 0).astype(np.int64)
    H, W = m.shape
    r = size // 2
    c = np.zeros((H + 1, W + 1), dtype=np.int64)
    c[1:, 1:] = m.cumsum(0).cumsum(1)
    cap_h, cap_w = (H - 1, W - 1) if langsplat_border else (H, W)
    i, j = np.arange(H), np.arange(W)
    y0, y1 = np.maximum(i - r, 0), np.maximum(np.minimum(i + r + 1, cap_h), np.maximum(i - r, 0))
    x0, x1 = np.maximum(j - r, 0), np.maximum(np.minimum(j + r + 1, cap_w), np.maximum(j - r, 0))
    ones = c[y1][:, x1] - c[y0][:, x1] - c[y1][:, x0] + c[y0][:, x0]
    n = (y1 - y0)[:, None] * (x1 - x0)[None, :]
    return 2 * ones > n


def lerf_ovs_mask(relevancy: Any, threshold: float = LERF_OVS_THRESHOLD, langsplat_border: bool = False) -> np.ndarray:
    """LERF-OVS predicted mask of one relevancy map [H, W]: smooth, normalise, threshold, 7x7 majority."""
    s = lerf_ovs_normalize(lerf_ovs_smooth(relevancy))
    return majority_filter(s > threshold, 7, langsplat_border)


def lerf_ovs_iou(relevancy: Any, gt_mask: Any, threshold: float = LERF_OVS_THRESHOLD) -> float:
    """IoU of :func:`lerf_ovs_mask` against the ground-truth mask of the query."""
    return iou(lerf_ovs_mask(relevancy, threshold), gt_mask)


def ovs3d_eval(scores: Any, gt_masks: Any, empty_iou: Optional[float] = None,
               ignore_unlabeled: bool = False) -> Dict[str, Any]:
    """3D-OVS evaluation: per-pixel argmax over the class list -> mIoU and accuracy.

    Args:
        scores: [Q, H, W] per-class scores of one view (any monotone score: cosine,
            relevancy, softmax), or [V, Q, H, W] for V views.
        gt_masks: boolean masks of the same shape (``segmentations/<view>/<class>.png``).
        empty_iou: IoU of a class with neither ground truth nor prediction in a view.
            ``None`` (default) leaves it out of the mean; the reference code (sklearn's
            ``jaccard_score``, ``zero_division`` default) scores it 0.0 - pass
            ``empty_iou=0.0`` to reproduce that exactly.
        ignore_unlabeled: leave pixels without any ground-truth class out of the accuracy
            (the reference code counts them as wrong).

    Returns a dict: ``miou`` (mean over (view, class) entries that count), ``accuracy``
    (over all pixels of all views), ``per_class_iou`` ([Q] or [V, Q], NaN where left out),
    ``pred`` (argmax labels [H, W] or [V, H, W]; ties -> lowest class index).
    """
    s, g = _np(scores), _np(gt_masks)
    if s.shape != g.shape or s.ndim not in (3, 4):
        raise ShapeError(f"ovs3d_eval: scores and gt_masks must both be [Q, H, W] or [V, Q, H, W], "
                         f"got {list(s.shape)} and {list(g.shape)}")
    single = s.ndim == 3
    if single:
        s, g = s[None], g[None]
    g = g != 0
    V, Q = s.shape[:2]
    if Q < 1:
        raise ShapeError("ovs3d_eval: no classes")
    pred = np.argmax(s, axis=1)  # [V, H, W]
    onehot = pred[:, None] == np.arange(Q)[None, :, None, None]  # [V, Q, H, W]
    inter = np.count_nonzero(onehot & g, axis=(2, 3))
    union = np.count_nonzero(onehot | g, axis=(2, 3))
    fill = np.nan if empty_iou is None else float(empty_iou)
    per_class = np.where(union > 0, inter / np.maximum(union, 1), fill)
    valid = ~np.isnan(per_class)
    miou = float(per_class[valid].mean()) if valid.any() else float("nan")
    n_gt = g.sum(1)  # [V, H, W] ground-truth labels per pixel
    correct = (n_gt == 1) & np.take_along_axis(g, pred[:, None], 1)[:, 0]
    counted = n_gt > 0 if ignore_unlabeled else np.ones_like(correct)
    n = int(counted.sum())
    accuracy = float(np.count_nonzero(correct & counted)) / n if n else float("nan")
    return {
        "miou": miou,
        "accuracy": accuracy,
        "per_class_iou": per_class[0] if single else per_class,
        "pred": pred[0] if single else pred,
    }


# --------------------------------------------------------------------------- localisation
def localization_accuracy(relevancy: Any, boxes: Any, smoothing: Optional[str] = "mean30") -> float:
    """LERF-OVS localisation hit (1.0 / 0.0): is the argmax of the smoothed map inside a GT box?

    Args:
        relevancy: [H, W] relevancy map of one query in one frame.
        boxes: [M, 4] ground-truth boxes ``x1, y1, x2, y2`` in pixels (x = column,
            y = row; corner order free, bounds inclusive), as in the labelme JSON.
        smoothing: ``"mean30"`` (default, LangSplat's evaluation code: the 30x30 box mean
            of the map, :func:`box_filter`), ``"lerf"``
            (``0.5 * (r + mean30(r))``, :func:`lerf_ovs_smooth`)
            or ``None`` (raw map).

    Every pixel attaining the maximum is a candidate (ties as in LangSplat); it is a hit
    if any candidate lies in any box. Dataset accuracy is the mean over (frame, query).
    """
    r = _np(relevancy).astype(np.float64)
    if r.ndim != 2:
        raise ShapeError(f"localization_accuracy: relevancy must be [H, W], got {list(r.shape)}")
    b = _np(boxes).astype(np.float64).reshape(-1, 4) if np.size(_np(boxes)) else np.zeros((0, 4))
    if smoothing == "mean30":
        s = box_filter(r, 30)
    elif smoothing == "lerf":
        s = lerf_ovs_smooth(r)
    elif smoothing is None:
        s = r
    else:
        raise ValueError(f"localization_accuracy: smoothing must be 'mean30', 'lerf' or None, got {smoothing!r}")
    ys, xs = np.nonzero(s == s.max())
    for x1, y1, x2, y2 in b:
        x_lo, x_hi, y_lo, y_hi = min(x1, x2), max(x1, x2), min(y1, y2), max(y1, y2)
        if np.any((xs >= x_lo) & (xs <= x_hi) & (ys >= y_lo) & (ys <= y_hi)):
            return 1.0
    return 0.0
