"""Segmentation metrics for open-vocabulary 3D scene understanding benchmarks.

Inputs may be numpy arrays or torch tensors (any device); results are Python floats
(or numpy arrays for per-class vectors). Everything is computed in numpy.

Conventions (the choices the papers leave open are written here):

* Binary masks (:func:`iou`, :func:`boundary_iou`): two empty masks agree perfectly, so
  empty-vs-empty scores **1.0**; empty vs non-empty scores 0.0.
* :func:`miou` / :func:`mbiou` average per-pair scores (LERF-OVS / LERF-Mask: one pair per
  (frame, query)).
* Label maps (:func:`semantic_miou`, :func:`macc`, :func:`miou_3d`, :func:`macc_3d`) use a
  confusion matrix accumulated over all pixels / Gaussians (ScanNet style). Per-class
  IoU = TP / (TP + FP + FN) is NaN (and left out of the mean) for classes with neither
  ground truth nor prediction; a class that is predicted but absent from the ground truth
  scores 0. Per-class accuracy = TP / (TP + FN) over classes present in the ground truth.
  Elements equal to ``ignore_index`` in the ground truth are ignored (predictions there
  do not count).
* Boundary IoU (Cheng et al., "Boundary IoU: Improving Object-Centric Image Segmentation
  Evaluation", CVPR 2021, reference implementation ``boundary_iou_api``): the boundary
  band of a mask M is ``M minus erode(M, d)``, the mask pixels within ``d`` pixels
  (Chebyshev distance, i.e. a (2d+1) x (2d+1) square structuring element = ``d`` passes
  of the 3x3 erosion in the reference code) of a non-mask pixel **or of the image
  border** (the reference pads with zeros); ``d = max(1, round(dilation_ratio *
  image_diagonal))``, e.g. 2 % of a 1280x720 diagonal = 29 px, of a 128x128 one = 4 px.
  Boundary IoU = ``|(G_d ∩ G) ∩ (P_d ∩ P)| / |(G_d ∩ G) ∪ (P_d ∩ P)|``.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

import numpy as np

from ..errors import ShapeError

__all__ = [
    "iou",
    "miou",
    "boundary_band",
    "boundary_iou",
    "mbiou",
    "pixel_accuracy",
    "confusion_matrix",
    "per_class_iou",
    "per_class_accuracy",
    "semantic_miou",
    "macc",
    "miou_3d",
    "macc_3d",
    "boundary_dilation",
]

ArrayLike = Any


def _np(a: ArrayLike) -> np.ndarray:
    if type(a).__module__.startswith("torch") and hasattr(a, "detach"):
        t = a.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return t.numpy()
    return np.asarray(a)


def _mask(a: ArrayLike, name: str, fn: str) -> np.ndarray:
    m = _np(a)
    if m.ndim != 2:
        raise ShapeError(f"{fn}: {name} must be a 2D mask [H, W], got shape {list(m.shape)}")
    if m.dtype != np.bool_:
        m = m != 0
    return m


def _pair(pred: ArrayLike, gt: ArrayLike, fn: str):
    p, g = _mask(pred, "pred", fn), _mask(gt, "gt", fn)
    if p.shape != g.shape:
        raise ShapeError(f"{fn}: pred {list(p.shape)} and gt {list(g.shape)} differ in shape")
    return p, g


def _ratio(inter: int, union: int) -> float:
    return 1.0 if union == 0 else float(inter) / float(union)


# ------------------------------------------------------------------------- binary masks
def iou(pred: ArrayLike, gt: ArrayLike) -> float:
    """Intersection over union of two boolean masks [H, W]; 1.0 when both are empty."""
    p, g = _pair(pred, gt, "iou")
    return _ratio(int(np.count_nonzero(p & g)), int(np.count_nonzero(p | g)))


def _pairs(preds, gts, fn: str):
    if len(preds) != len(gts):
        raise ShapeError(f"{fn}: {len(preds)} predictions for {len(gts)} ground-truth masks")
    if len(preds) == 0:
        raise ShapeError(f"{fn}: no masks given")
    return zip(preds, gts)


def miou(preds: Union[Sequence[ArrayLike], ArrayLike], gts: Union[Sequence[ArrayLike], ArrayLike]) -> float:
    """Mean of :func:`iou` over pairs (``[N, H, W]`` arrays or sequences of [H, W] masks)."""
    return float(np.mean([iou(p, g) for p, g in _pairs(preds, gts, "miou")]))


def boundary_dilation(height: int, width: int, dilation_ratio: float = 0.02) -> int:
    """Band width d in pixels: ``max(1, round(dilation_ratio * sqrt(H^2 + W^2)))``."""
    return max(1, int(round(dilation_ratio * math.sqrt(height * height + width * width))))


def boundary_band(mask: ArrayLike, dilation_ratio: float = 0.02, dilation: Optional[int] = None) -> np.ndarray:
    """Boundary band of a boolean mask: mask pixels within d px of background or the image border.

    ``d = dilation`` if given, else :func:`boundary_dilation` of the mask's size.
    """
    from scipy.ndimage import minimum_filter

    m = _mask(mask, "mask", "boundary_band")
    d = boundary_dilation(*m.shape, dilation_ratio) if dilation is None else int(dilation)
    if d < 1:
        raise ValueError(f"boundary_band: dilation must be >= 1 pixel, got {d}")
    eroded = minimum_filter(m.astype(np.uint8), size=2 * d + 1, mode="constant", cval=0).astype(bool)
    return m & ~eroded


def boundary_iou(pred: ArrayLike, gt: ArrayLike, dilation_ratio: float = 0.02,
                 dilation: Optional[int] = None) -> float:
    """Boundary IoU (Cheng et al. 2021) of two boolean masks [H, W]; 1.0 when both are empty.

    Band width ``d = max(1, round(dilation_ratio * image diagonal))`` pixels (or
    ``dilation`` if given); see the module docstring.
    """
    p, g = _pair(pred, gt, "boundary_iou")
    bp = boundary_band(p, dilation_ratio, dilation)
    bg = boundary_band(g, dilation_ratio, dilation)
    return _ratio(int(np.count_nonzero(bp & bg)), int(np.count_nonzero(bp | bg)))


def mbiou(preds, gts, dilation_ratio: float = 0.02, dilation: Optional[int] = None) -> float:
    """Mean of :func:`boundary_iou` over pairs."""
    return float(np.mean([boundary_iou(p, g, dilation_ratio, dilation) for p, g in _pairs(preds, gts, "mbiou")]))


# --------------------------------------------------------------------------- label maps
def pixel_accuracy(pred: ArrayLike, gt: ArrayLike, ignore_index: Optional[int] = None) -> float:
    """Fraction of elements where ``pred == gt`` (label maps or boolean masks of any shape).

    Elements with ``gt == ignore_index`` are left out; NaN if nothing is left.
    """
    p, g = _np(pred), _np(gt)
    if p.shape != g.shape:
        raise ShapeError(f"pixel_accuracy: pred {list(p.shape)} and gt {list(g.shape)} differ in shape")
    valid = np.ones(g.shape, bool) if ignore_index is None else g != ignore_index
    n = int(valid.sum())
    return float("nan") if n == 0 else float(np.count_nonzero((p == g) & valid)) / n


def _confusion(pred: ArrayLike, gt: ArrayLike, num_classes: Optional[int], ignore_index: Optional[int],
               fn: str):
    """(cm [C, C], misses [C]): misses = gt elements predicted outside 0..C-1 ("no class")."""
    p, g = _np(pred).astype(np.int64).ravel(), _np(gt).astype(np.int64).ravel()
    if p.shape != g.shape:
        raise ShapeError(f"{fn}: pred and gt must have the same number of elements ({p.size} vs {g.size})")
    valid = np.ones(g.shape, bool) if ignore_index is None else g != ignore_index
    gv, pv = g[valid], p[valid]
    if num_classes is None:
        pk = pv if ignore_index is None else pv[pv != ignore_index]
        num_classes = int(max(gv.max(initial=-1), pk.max(initial=-1))) + 1
    C = int(num_classes)
    if gv.size and (gv.min() < 0 or gv.max() >= C):
        raise ShapeError(f"{fn}: ground-truth label {int(gv[(gv < 0) | (gv >= C)][0])} outside 0..{C - 1} "
                         f"(ignore_index={ignore_index})")
    inside = (pv >= 0) & (pv < C)
    cm = np.bincount(gv[inside] * C + pv[inside], minlength=C * C).reshape(C, C).astype(np.int64)
    misses = np.bincount(gv[~inside], minlength=C).astype(np.int64)
    return cm, misses


def confusion_matrix(pred: ArrayLike, gt: ArrayLike, num_classes: Optional[int] = None,
                     ignore_index: Optional[int] = 255) -> np.ndarray:
    """[C, C] int64 counts, rows = ground truth, columns = prediction (any input shape).

    ``num_classes`` defaults to 1 + the largest label seen (``ignore_index`` excluded).
    Elements whose ground truth is ``ignore_index`` are skipped; predictions outside
    ``0..C-1`` ("no class") have no column and are dropped here, but
    :func:`semantic_miou` / :func:`macc` count them as misses of their ground-truth class.
    """
    return _confusion(pred, gt, num_classes, ignore_index, "confusion_matrix")[0]


def per_class_iou(cm: np.ndarray, misses: Optional[np.ndarray] = None) -> np.ndarray:
    """Per-class IoU TP / (TP + FP + FN) from a confusion matrix; NaN where the union is empty.

    ``misses`` [C]: extra false negatives per class (elements predicted as no class).
    """
    cm_ = np.asarray(cm, dtype=np.float64)
    tp = np.diag(cm_)
    gt_count = cm_.sum(1) + (0 if misses is None else np.asarray(misses, np.float64))
    union = gt_count + cm_.sum(0) - tp
    return np.where(union > 0, tp / np.maximum(union, 1), np.nan)


def per_class_accuracy(cm: np.ndarray, misses: Optional[np.ndarray] = None) -> np.ndarray:
    """Per-class accuracy (recall) TP / (TP + FN); NaN for classes absent from the ground truth."""
    cm_ = np.asarray(cm, dtype=np.float64)
    gt_count = cm_.sum(1) + (0 if misses is None else np.asarray(misses, np.float64))
    return np.where(gt_count > 0, np.diag(cm_) / np.maximum(gt_count, 1), np.nan)


def _nanmean(v: np.ndarray) -> float:
    v = v[~np.isnan(v)]
    return float("nan") if v.size == 0 else float(v.mean())


def semantic_miou(pred: ArrayLike, gt: ArrayLike, num_classes: Optional[int] = None,
                  ignore_index: Optional[int] = 255) -> float:
    """Mean per-class IoU of label maps (any shape) from the accumulated confusion matrix."""
    return _nanmean(per_class_iou(*_confusion(pred, gt, num_classes, ignore_index, "semantic_miou")))


def macc(pred: ArrayLike, gt: ArrayLike, num_classes: Optional[int] = None,
         ignore_index: Optional[int] = 255) -> float:
    """Mean per-class accuracy (ScanNet mAcc): mean over gt classes of TP / (TP + FN)."""
    return _nanmean(per_class_accuracy(*_confusion(pred, gt, num_classes, ignore_index, "macc")))


def miou_3d(pred: ArrayLike, gt: ArrayLike, num_classes: Optional[int] = None, ignore_index: Optional[int] = -1) -> float:
    """Per-Gaussian (or per-point) mIoU: labels [N]; ``gt == ignore_index`` (default -1) is ignored."""
    p, g = _np(pred), _np(gt)
    if p.ndim != 1 or g.ndim != 1:
        raise ShapeError(f"miou_3d: labels must be [N], got {list(p.shape)} and {list(g.shape)}")
    return semantic_miou(p, g, num_classes, ignore_index)


def macc_3d(pred: ArrayLike, gt: ArrayLike, num_classes: Optional[int] = None, ignore_index: Optional[int] = -1) -> float:
    """Per-Gaussian (or per-point) mean class accuracy: labels [N]; ``gt == ignore_index`` ignored."""
    p, g = _np(pred), _np(gt)
    if p.ndim != 1 or g.ndim != 1:
        raise ShapeError(f"macc_3d: labels must be [N], got {list(p.shape)} and {list(g.shape)}")
    return macc(p, g, num_classes, ignore_index)
