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

3D protocols (each with its source and exact settings in ``docs/protocols.md``, and
reported in its own table, :func:`protocol_tables` - the field mixes them up):

* **LERF-OVS 3D selection** (OpenGaussian's ``scripts/compute_lerf_iou.py``, with the per-Gaussian
  relevancy threshold 0.6 of Dr. Splat / VALA): the Gaussians whose relevancy is above 0.6 are
  rendered alone, their accumulated opacity saved as an 8-bit image and binarised ``> 10``; IoU
  against the 2D GT mask of every (frame, category) pair of OpenGaussian's evaluation frames
  (union 0 and a missing prediction score 0); mIoU and Acc@0.25 = the fraction of pairs with IoU
  ``> 0.25`` (:func:`lerf3d_selection_masks`, :func:`lerf3d_summary`, :func:`evaluate_lerf_ovs_3d`).
* **LERF-Mask** (Gaussian Grouping's ``script/eval_lerf_mask.py``): predicted and GT masks
  binarised ``> 128`` (the prediction resized to the GT's size, nearest), IoU and boundary IoU
  (2 % of the image diagonal) per (view, prompt), averaged per prompt, then over the prompts
  (:func:`lerf_mask_scores`, :func:`lerf_mask_summary`, :func:`evaluate_lerf_mask`).
* **ScanNet 19 / 15 / 10 classes** (OpenGaussian's ``scripts/eval_scannet.py``, used by Dr. Splat
  and VALA): NYU40 labels mapped to the subset (others ignored), Gaussians with opacity < 0.1
  ignored, per-Gaussian argmax of the cosine to the class names; IoU and accuracy per class,
  averaged over the classes present in the scene's ground truth (:func:`scannet_gt_labels`,
  :func:`scannet_eval`, :func:`scannet_predict`, :func:`evaluate_scannet`).

All functions take numpy arrays or torch tensors and return numpy arrays / floats.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import numpy as np

from ..errors import ShapeError
from ..query import THRESHOLD as QUERY_THRESHOLD
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
    # 3D protocols
    "to_uint8_image",
    "selection_alpha_masks",
    "LERF_3D_THRESHOLD",
    "LERF_3D_ALPHA_THRESHOLD",
    "LERF_OVS_3D_FRAMES",
    "lerf3d_iou",
    "lerf3d_summary",
    "lerf3d_selection_masks",
    "evaluate_lerf_ovs_3d",
    "LERF_MASK_PROMPTS",
    "LERF_MASK_BINARY_THRESHOLD",
    "lerf_mask_scores",
    "lerf_mask_summary",
    "evaluate_lerf_mask",
    "NYU40_NAMES",
    "SCANNET_SUBSETS",
    "SCANNET_SCENES",
    "SCANNET_MIN_OPACITY",
    "scannet_classes",
    "scannet_gt_labels",
    "scannet_eval",
    "scannet_predict",
    "evaluate_scannet",
    "protocol_tables",
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


# =========================================================================== 3D protocols
# Sources and exact settings: docs/protocols.md. Each protocol is reported in its own table
# (protocol_tables): the field's papers mix them up under one name.

def to_uint8_image(image: Any) -> np.ndarray:
    """A float image in [0, 1] -> uint8, exactly as ``torchvision.utils.save_image`` writes it.

    ``uint8(clamp(x * 255 + 0.5, 0, 255))`` in float32 (round half up; NaN -> 0): the 8-bit
    masks the reference evaluations read back are written this way.
    """
    a = np.nan_to_num(_np(image).astype(np.float32), nan=0.0)
    return np.clip(a * np.float32(255.0) + np.float32(0.5), 0.0, 255.0).astype(np.uint8)


def _camera_at(cam, height: int, width: int):
    """``cam`` (one camera) with its intrinsics scaled to an image of ``width`` x ``height``."""
    from dataclasses import replace

    if (int(cam.height), int(cam.width)) == (int(height), int(width)):
        return cam
    Ks = cam.Ks.clone()
    Ks[:, 0] *= width / cam.width
    Ks[:, 1] *= height / cam.height
    return replace(cam, Ks=Ks, width=int(width), height=int(height))


def _cameras_by_name(cameras, names, what: str) -> Dict[str, Any]:
    from ..errors import ConfigError

    if cameras is None:
        raise ConfigError(f"{what}: the scene has no cameras; pass cameras= (rh3dgs.Cameras with names)")
    have = {n: i for i, n in enumerate(cameras.names or [])}
    missing = [n for n in names if n not in have]
    if missing:
        raise ConfigError(f"{what}: no camera named {missing[0]!r} ({len(missing)} of {len(names)} frames missing; "
                          f"the cameras are named after their image files: {', '.join(list(have)[:4])}...)")
    return {n: cameras[have[n]] for n in names}


def _selected(relevancy: Any, threshold: float) -> np.ndarray:
    """bool [Q, N]: per query, the Gaussians selected by :func:`rh3dgs.query.select_gaussians` (relevancy > threshold)."""
    import torch

    from ..query import select_gaussians

    rel = torch.as_tensor(_np(relevancy), dtype=torch.float64)
    return np.stack([select_gaussians(rel, threshold, q).numpy() for q in range(rel.shape[0])])


def selection_alpha_masks(gaussians, selected: Any, cameras, alpha_threshold: int = 10) -> np.ndarray:
    """Binarised alpha of the selected Gaussians rendered alone: bool [B, H, W].

    ``selected`` is a bool [N] mask; pixels where ``to_uint8_image(alpha) > alpha_threshold``
    (the silhouette PNG read back ``> 10`` in OpenGaussian's evaluation). Nothing selected ->
    all False.
    """
    import torch

    from ..rendering import render

    sel = torch.as_tensor(_np(selected)).bool().reshape(-1)
    if sel.numel() != len(gaussians):
        raise ShapeError(f"selection_alpha_masks: selection has {sel.numel()} entries for {len(gaussians)} Gaussians")
    B, H, W = len(cameras), int(cameras.height), int(cameras.width)
    if not bool(sel.any()):
        return np.zeros((B, H, W), dtype=bool)
    with torch.no_grad():
        alpha = render(gaussians[sel.to(gaussians.device)], cameras).alpha  # [B, H, W]
    return to_uint8_image(alpha) > int(alpha_threshold)


# ----------------------------------------------------------------- LERF-OVS 3D selection
#: per-Gaussian relevancy above which a Gaussian is selected (Dr. Splat / VALA).
LERF_3D_THRESHOLD = 0.6
#: 8-bit alpha of the rendered selection above which a pixel is predicted (OpenGaussian: ``> 10``).
LERF_3D_ALPHA_THRESHOLD = 10
#: OpenGaussian's evaluation frames (``scene_gt_frames`` of ``scripts/compute_lerf_iou.py``).
LERF_OVS_3D_FRAMES: Dict[str, tuple] = {
    "waldo_kitchen": ("frame_00053", "frame_00066", "frame_00089", "frame_00140", "frame_00154"),
    "ramen": ("frame_00006", "frame_00024", "frame_00060", "frame_00065", "frame_00081", "frame_00119",
              "frame_00128"),
    "figurines": ("frame_00041", "frame_00105", "frame_00152", "frame_00195"),
    "teatime": ("frame_00002", "frame_00025", "frame_00043", "frame_00107", "frame_00129", "frame_00140"),
}


def lerf3d_iou(pred: Any, gt: Any) -> float:
    """IoU of two masks with OpenGaussian's convention: 0.0 when the union is empty."""
    p, g = _np(pred) != 0, _np(gt) != 0
    if p.shape != g.shape:
        raise ShapeError(f"lerf3d_iou: pred {list(p.shape)} and gt {list(g.shape)} differ in shape")
    union = int(np.count_nonzero(p | g))
    return 0.0 if union == 0 else float(np.count_nonzero(p & g)) / union


def lerf3d_summary(ious: Sequence[float]) -> Dict[str, float]:
    """mIoU (mean over the (frame, category) pairs) and Acc@0.25 / Acc@0.5 (fraction with IoU **>** 0.25 / 0.5)."""
    v = np.asarray(list(ious), dtype=np.float64)
    if v.size == 0:
        raise ShapeError("lerf3d_summary: no (frame, category) pairs")
    return {"miou": float(v.mean()), "acc@0.25": float(np.mean(v > 0.25)), "acc@0.5": float(np.mean(v > 0.5)),
            "pairs": int(v.size)}


def lerf3d_selection_masks(gaussians, relevancy: Any, cameras, threshold: float = LERF_3D_THRESHOLD,
                           alpha_threshold: int = LERF_3D_ALPHA_THRESHOLD) -> np.ndarray:
    """Predicted masks of the 3D selection protocol: bool [Q, B, H, W].

    For each query q, the Gaussians with ``relevancy[q] > threshold`` (per-Gaussian relevancy
    [Q, N] or [N]) are rendered alone into every camera and their alpha binarised
    (:func:`selection_alpha_masks`).
    """
    rel = _np(relevancy).astype(np.float64)
    rel = rel[None] if rel.ndim == 1 else rel
    if rel.ndim != 2 or rel.shape[1] != len(gaussians):
        raise ShapeError(f"lerf3d_selection_masks: relevancy must be [Q, N] with N = {len(gaussians)}, "
                         f"got {list(rel.shape)}")
    sel = _selected(rel, threshold)
    return np.stack([selection_alpha_masks(gaussians, m, cameras, alpha_threshold) for m in sel])


def evaluate_lerf_ovs_3d(scene, label_dir, scene_name: Optional[str] = None, cameras=None,
                         frames: Optional[Sequence[str]] = None, negatives=None,
                         threshold: float = LERF_3D_THRESHOLD) -> Dict[str, Any]:
    """LERF-OVS 3D selection on one scene: ``scene`` (:class:`rh3dgs.api.Scene` with a semantic field),
    ``label_dir`` = LangSplat's ``label/<scene>`` folder of labelme JSON files.

    Frames: ``frames``, else OpenGaussian's list for ``scene_name`` (default: the folder's name),
    else every labelled frame. Pairs: every category labelled in a frame; the query is the category
    name (relevancy against ``negatives``, default the scene's canonical ones). Each frame is
    rendered at its label's size with the camera of the same name (``cameras``, default the scene's).
    Returns :func:`lerf3d_summary` plus ``per_pair`` [(frame, category, IoU)] and the settings.
    """
    from ..data.readers.lerf_ovs import load_lerf_ovs

    name = scene_name or Path(label_dir).name
    labelled = {f.stem: f for f in load_lerf_ovs(label_dir)}
    wanted = list(frames) if frames is not None else list(LERF_OVS_3D_FRAMES.get(name, sorted(labelled)))
    missing = [f for f in wanted if f not in labelled]
    if missing:
        from ..errors import InputFileError

        raise InputFileError(Path(label_dir) / f"{missing[0]}.json", "evaluation frame has no label file "
                             f"({len(missing)} of {len(wanted)} missing)")
    cams = _cameras_by_name(cameras if cameras is not None else scene.cameras, wanted, "evaluate_lerf_ovs_3d")
    queries = list(dict.fromkeys(c for f in wanted for c in labelled[f].categories))
    rel = _np(scene.relevancy(queries, negatives))  # [Q, N]
    per_pair = []
    for f in wanted:
        fr = labelled[f]
        cam = _camera_at(cams[f], fr.height, fr.width)
        for c in fr.categories:
            pred = lerf3d_selection_masks(scene.gaussians, rel[queries.index(c)], cam, threshold)[0, 0]
            per_pair.append((f, c, lerf3d_iou(pred, fr.mask(c))))
    out: Dict[str, Any] = lerf3d_summary([p[2] for p in per_pair])
    out.update(per_pair=per_pair, scene=name, frames=wanted, threshold=float(threshold),
               alpha_threshold=LERF_3D_ALPHA_THRESHOLD)
    return out


# --------------------------------------------------------------------------- LERF-Mask
#: Gaussian Grouping's text prompts per scene (``render_lerf_mask.py``); GT masks are named after them.
LERF_MASK_PROMPTS: Dict[str, tuple] = {
    "figurines": ("green apple", "green toy chair", "old camera", "porcelain hand", "red apple", "red toy chair",
                  "rubber duck with red hat"),
    "ramen": ("chopsticks", "egg", "glass of water", "pork belly", "wavy noodles in bowl", "yellow bowl"),
    "teatime": ("apple", "bag of cookies", "coffee mug", "cookies on a plate", "paper napkin", "plate", "sheep",
                "spoon handle", "stuffed bear", "tea in a glass"),
}
#: Gaussian Grouping binarises both masks (8-bit grey) with ``> 128``.
LERF_MASK_BINARY_THRESHOLD = 128


def _grey8(mask: Any) -> np.ndarray:
    """A mask as the 8-bit grey image it would be saved as: bool -> 0 / 255, float [0, 1] -> :func:`to_uint8_image`."""
    m = _np(mask)
    if m.dtype == np.bool_:
        return m.astype(np.uint8) * 255
    if m.dtype.kind == "f":
        return to_uint8_image(m)
    return np.clip(m, 0, 255).astype(np.uint8)


def lerf_mask_scores(pred: Any, gt: Any, dilation_ratio: float = 0.02) -> tuple:
    """(IoU, boundary IoU) of one (view, prompt) pair, as Gaussian Grouping's ``eval_lerf_mask.py``.

    Both masks as 8-bit grey images (:func:`_grey8`); a prediction of another size is resized to
    the GT's with nearest neighbour (PIL); both binarised ``> 128``. IoU = |P & G| / |P | G|;
    boundary IoU on the bands of width ``max(1, round(0.02 * diagonal))`` (image border counts as
    background, :func:`rh3dgs.eval.metrics.boundary_band`). An empty union gives NaN (0 / 0, as the
    reference); it cannot happen with a non-empty GT mask.
    """
    from .metrics import boundary_band

    g8, p8 = _grey8(gt), _grey8(pred)
    if g8.ndim != 2 or p8.ndim != 2:
        raise ShapeError(f"lerf_mask_scores: masks must be [H, W], got {list(p8.shape)} and {list(g8.shape)}")
    if p8.shape != g8.shape:
        from PIL import Image

        p8 = np.array(Image.fromarray(p8).resize((g8.shape[1], g8.shape[0]), resample=Image.NEAREST))
    p, g = p8 > LERF_MASK_BINARY_THRESHOLD, g8 > LERF_MASK_BINARY_THRESHOLD

    def ratio(a: np.ndarray, b: np.ndarray) -> float:
        union = int(np.count_nonzero(a | b))
        return float("nan") if union == 0 else float(np.count_nonzero(a & b)) / union

    return ratio(p, g), ratio(boundary_band(p, dilation_ratio), boundary_band(g, dilation_ratio))


def lerf_mask_summary(records: Sequence[tuple]) -> Dict[str, Any]:
    """records (prompt, IoU, boundary IoU) -> mean per prompt, then ``miou`` / ``mbiou`` = mean over the prompts."""
    per: Dict[str, list] = {}
    for prompt, i, b in records:
        per.setdefault(str(prompt), []).append((float(i), float(b)))
    if not per:
        raise ShapeError("lerf_mask_summary: no (view, prompt) pairs")
    per_prompt = {p: {"iou": float(np.mean([x[0] for x in v])), "biou": float(np.mean([x[1] for x in v])),
                      "views": len(v)} for p, v in per.items()}
    return {"miou": float(np.mean([v["iou"] for v in per_prompt.values()])),
            "mbiou": float(np.mean([v["biou"] for v in per_prompt.values()])),
            "prompts": len(per_prompt), "pairs": sum(v["views"] for v in per_prompt.values()),
            "per_prompt": per_prompt}


def evaluate_lerf_mask(scene, dataset, source: str = "relevancy", threshold: Optional[float] = None,
                       negatives=None, cameras=None) -> Dict[str, Any]:
    """LERF-Mask (Gaussian Grouping protocol) on one scene.

    Args:
        scene: :class:`rh3dgs.api.Scene` with a semantic field, in the frame of the dataset's cameras.
        dataset: a :class:`rh3dgs.data.readers.lerf_mask.LerfMaskScene` or its folder
            (``lerf_mask/<scene>`` with ``test_mask/``, ``images/``, ``images_train/``, ``sparse/0``).
        source: how rh3dgs predicts a prompt's mask in a view: ``"relevancy"`` (default: the rendered
            relevancy map above ``threshold``, default :data:`rh3dgs.query.THRESHOLD`, zero where the
            accumulated opacity is below :data:`rh3dgs.query.MIN_ALPHA`) or ``"selection"`` (the 3D
            selection of the
            LERF-OVS 3D protocol: relevancy > 0.6 per Gaussian, rendered alpha > 10/255).
        cameras: the test views' cameras (default: the dataset's, from its COLMAP model).
    Returns :func:`lerf_mask_summary` plus ``per_pair`` [(view, prompt, IoU, boundary IoU)].
    """
    from ..data.readers.lerf_mask import LerfMaskScene, load_lerf_mask

    ds = dataset if isinstance(dataset, LerfMaskScene) else load_lerf_mask(dataset)
    cams = cameras if cameras is not None else ds.cameras
    views = [v.image for v in ds.views]
    by_name = _cameras_by_name(cams, views, "evaluate_lerf_mask")
    prompts = list(dict.fromkeys(p for v in ds.views for p in v.masks))
    if source == "selection":
        thr = LERF_3D_THRESHOLD if threshold is None else float(threshold)
        sel = _selected(scene.relevancy(prompts, negatives), thr)
    elif source == "relevancy":
        thr = QUERY_THRESHOLD if threshold is None else float(threshold)
    else:
        raise ValueError(f"evaluate_lerf_mask: source must be 'relevancy' or 'selection', got {source!r}")
    records = []
    for v in ds.views:
        some = next(iter(v.masks.values()))
        cam = _camera_at(by_name[v.image], some.shape[0], some.shape[1])
        if source == "relevancy":
            maps = _np(scene.render_relevancy(cam, list(v.masks), negatives))  # [Q, H, W]
        for k, (prompt, gt) in enumerate(v.masks.items()):
            if source == "relevancy":
                pred = maps[k] > thr
            else:
                pred = selection_alpha_masks(scene.gaussians, sel[prompts.index(prompt)], cam)[0]
            i, b = lerf_mask_scores(pred, gt)
            records.append((v.name, prompt, i, b))
    out = lerf_mask_summary([(p, i, b) for _, p, i, b in records])
    out.update(per_pair=records, source=source, threshold=thr, scene=ds.root.name)
    return out


# ----------------------------------------------------------------------------- ScanNet
#: NYU40 class names, index = NYU40 id (0 = unlabelled), as OpenGaussian's ``eval_scannet.py``
#: writes them (and queries them: ``"showercurtain"``, ``"otherfurniture"``...).
NYU40_NAMES: tuple = (
    "unlabeled", "wall", "floor", "cabinet", "bed", "chair", "sofa", "table", "door", "window", "bookshelf",
    "picture", "counter", "blinds", "desk", "shelves", "curtain", "dresser", "pillow", "mirror", "floormat",
    "clothes", "ceiling", "books", "refrigerator", "television", "paper", "towel", "showercurtain", "box",
    "whiteboard", "person", "nightstand", "toilet", "sink", "lamp", "bathtub", "bag", "otherstructure",
    "otherfurniture", "otherprop",
)
#: The class subsets (NYU40 ids, in this order: class k of a subset is id ``SCANNET_SUBSETS[n][k - 1]``).
SCANNET_SUBSETS: Dict[int, tuple] = {
    19: (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 16, 24, 28, 33, 34, 36),
    15: (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 33, 34),
    10: (1, 2, 4, 5, 6, 7, 8, 9, 10, 33),
}
#: OpenGaussian's 10 evaluation scenes.
SCANNET_SCENES = ("scene0000_00", "scene0062_00", "scene0070_00", "scene0097_00", "scene0140_00", "scene0200_00",
                  "scene0347_00", "scene0400_00", "scene0590_00", "scene0645_00")
#: Gaussians with an activated opacity below this are left out of the ground truth.
SCANNET_MIN_OPACITY = 0.1


def scannet_classes(subset: int = 19) -> tuple:
    """(NYU40 ids, class names) of a subset (19, 15 or 10)."""
    if subset not in SCANNET_SUBSETS:
        raise ValueError(f"ScanNet subset must be one of {sorted(SCANNET_SUBSETS)}, got {subset!r}")
    ids = SCANNET_SUBSETS[subset]
    return ids, tuple(NYU40_NAMES[i] for i in ids)


def scannet_gt_labels(nyu40: Any, subset: int = 19, opacity: Any = None,
                      min_opacity: float = SCANNET_MIN_OPACITY) -> np.ndarray:
    """NYU40 labels [N] -> subset labels [N] in 0..K (0 = ignored: unlabelled, outside the subset, or
    a Gaussian whose activated ``opacity`` [N] is below ``min_opacity``)."""
    ids, _ = scannet_classes(subset)
    lab = _np(nyu40).astype(np.int64).reshape(-1)
    out = np.zeros_like(lab)
    for k, nid in enumerate(ids, start=1):
        out[lab == nid] = k
    if opacity is not None:
        op = _np(opacity).astype(np.float64).reshape(-1)
        if op.shape != lab.shape:
            raise ShapeError(f"scannet_gt_labels: opacity has {op.size} entries for {lab.size} labels")
        out[op < min_opacity] = 0
    return out


def scannet_eval(pred: Any, gt: Any, num_classes: int) -> Dict[str, Any]:
    """OpenGaussian's ``calculate_metrics``: labels [N] in 0..K, gt 0 ignored (pred 0 = no class).

    Per class c = 1..K: IoU = |pred = c & gt = c| / |pred = c | gt = c| (after ``pred[gt == 0] = 0``)
    and accuracy = |pred = c & gt = c| / |gt = c|; ``miou`` / ``macc`` = their means over the
    classes **present in the ground truth** (a class predicted but absent does not count);
    ``accuracy`` = overall fraction of labelled Gaussians predicted right. Per-class values are
    NaN for classes absent from the ground truth.
    """
    p, g = _np(pred).astype(np.int64).reshape(-1), _np(gt).astype(np.int64).reshape(-1)
    if p.shape != g.shape:
        raise ShapeError(f"scannet_eval: pred has {p.size} labels, gt {g.size}")
    K = int(num_classes)
    if g.size and (g.min() < 0 or g.max() > K):
        raise ShapeError(f"scannet_eval: ground-truth labels must be in 0..{K}, got {g.min()}..{g.max()}")
    p = np.where(g == 0, 0, p)
    c = np.arange(1, K + 1)[:, None]
    inter = np.count_nonzero((g == c) & (p == c), axis=1)
    union = np.count_nonzero((g == c) | (p == c), axis=1)
    total = np.count_nonzero(g == c, axis=1)
    present = total > 0
    iou = np.where(present, inter / np.maximum(union, 1), np.nan)
    acc = np.where(present, inter / np.maximum(total, 1), np.nan)
    labelled = int(np.count_nonzero(g))
    return {"miou": float(np.nanmean(iou)) if present.any() else float("nan"),
            "macc": float(np.nanmean(acc)) if present.any() else float("nan"),
            "accuracy": float(np.count_nonzero((p == g) & (g != 0))) / labelled if labelled else float("nan"),
            "per_class_iou": iou, "per_class_acc": acc, "classes_present": int(present.sum()), "labelled": labelled}


def scannet_predict(field, class_embeddings: Any) -> np.ndarray:
    """Per-Gaussian class [N] in 1..K: argmax of the cosine between each Gaussian's decoded feature and the
    K unit class-name embeddings [K, D]; 0 (no class) for Gaussians without a valid feature."""
    import torch

    phi = torch.as_tensor(_np(class_embeddings), dtype=torch.float32)
    cos = field.cosine(field.latents.float(), phi.to(field.latents.device))  # [N, K]
    pred = cos.argmax(dim=1).cpu().numpy().astype(np.int64) + 1
    if field.valid is not None:
        pred[~_np(field.valid).astype(bool)] = 0
    return pred


def evaluate_scannet(scene, labels: Any, subsets: Sequence[int] = (19, 15, 10), transfer: str = "auto",
                     prompts: Optional[Dict[int, Sequence[str]]] = None) -> Dict[int, Dict[str, Any]]:
    """ScanNet 19 / 15 / 10-class evaluation of one scene, per Gaussian.

    Args:
        scene: :class:`rh3dgs.api.Scene` with a semantic field.
        labels: NYU40 labels per Gaussian [N], or a labelled point cloud file (``*_vh_clean_2.labels.ply``,
            read with :func:`rh3dgs.data.readers.read_labelled_points`).
        transfer: how a file's point labels become Gaussian labels: ``"index"`` (point i is Gaussian
            i: OpenGaussian's set-up, Gaussians initialised from the labelled mesh vertices and never
            densified), ``"nearest"`` (each Gaussian takes its nearest labelled point,
            :func:`rh3dgs.data.readers.transfer_labels_to_gaussians`), ``"auto"`` (index when the
            counts match, else nearest).
        prompts: per subset, the K texts queried (default the NYU40 names, as OpenGaussian).
    Returns {subset: :func:`scannet_eval` result + ``classes``}.
    """
    from ..data.readers.scannet import read_labelled_points, transfer_labels_to_gaussians

    n = len(scene.gaussians)
    if isinstance(labels, (str, Path)):
        pts, lab = read_labelled_points(labels, ignore_labels=())
        if transfer not in ("auto", "index", "nearest"):
            raise ValueError(f"evaluate_scannet: transfer must be 'auto', 'index' or 'nearest', got {transfer!r}")
        if transfer == "index" or (transfer == "auto" and len(lab) == n):
            if len(lab) != n:
                raise ShapeError(f"evaluate_scannet: {labels} has {len(lab)} points for {n} Gaussians (transfer='index')")
            nyu = lab
        else:
            nyu = transfer_labels_to_gaussians(pts, lab, scene.gaussians.means)
        nyu = np.where(nyu < 0, 0, nyu)
    else:
        nyu = _np(labels).astype(np.int64).reshape(-1)
        if nyu.size != n:
            raise ShapeError(f"evaluate_scannet: {nyu.size} labels for {n} Gaussians")
    opacity = scene.gaussians.activated_opacities
    field_ = scene._require_field()
    out: Dict[int, Dict[str, Any]] = {}
    for s in subsets:
        _, names = scannet_classes(s)
        texts = list(prompts[s]) if prompts and s in prompts else list(names)
        if len(texts) != len(names):
            raise ShapeError(f"evaluate_scannet: {len(texts)} prompts for the {len(names)} classes of subset {s}")
        pred = scannet_predict(field_, scene.encode(texts))
        res = scannet_eval(pred, scannet_gt_labels(nyu, s, opacity), len(names))
        res["classes"] = names
        out[int(s)] = res
    return out


# ------------------------------------------------------------------------------ tables
def _pct(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * float(v):.1f}"


def protocol_tables(lerf_ovs_3d: Optional[Dict[str, Dict]] = None, lerf_mask: Optional[Dict[str, Dict]] = None,
                    scannet: Optional[Dict[str, Dict[int, Dict]]] = None) -> str:
    """Markdown: one table per protocol (never merged), rows = scenes + their mean, values in %.

    Inputs are {scene: result} of :func:`evaluate_lerf_ovs_3d` / :func:`evaluate_lerf_mask` and
    {scene: {subset: result}} of :func:`evaluate_scannet`.
    """
    parts = []

    def table(title: str, note: str, cols: Sequence[str], rows: Dict[str, Sequence[float]]) -> str:
        lines = [f"### {title}", "", note, "", "| scene | " + " | ".join(cols) + " |",
                 "|---|" + "---|" * len(cols)]
        for name, vals in rows.items():
            lines.append(f"| {name} | " + " | ".join(_pct(v) for v in vals) + " |")
        if len(rows) > 1:
            mean = np.nanmean(np.array([list(v) for v in rows.values()], dtype=np.float64), axis=0)
            lines.append("| **mean** | " + " | ".join(_pct(v) for v in mean) + " |")
        return "\n".join(lines) + "\n"

    if lerf_ovs_3d:
        parts.append(table("LERF-OVS 3D selection (OpenGaussian protocol, relevancy > 0.6)",
                           "Per-Gaussian relevancy > 0.6, selected Gaussians' alpha rendered and binarised "
                           "(8-bit > 10); IoU per (frame, category); Acc@0.25 = share of pairs with IoU > 0.25.",
                           ["mIoU", "Acc@0.25"], {k: (r["miou"], r["acc@0.25"]) for k, r in lerf_ovs_3d.items()}))
    if lerf_mask:
        parts.append(table("LERF-Mask (Gaussian Grouping protocol)",
                           "Masks binarised > 128; IoU and boundary IoU (2 % of the diagonal) per (view, prompt), "
                           "mean per prompt, then over prompts.",
                           ["mIoU", "mBIoU"], {k: (r["miou"], r["mbiou"]) for k, r in lerf_mask.items()}))
    if scannet:
        subsets = sorted({s for r in scannet.values() for s in r}, reverse=True)
        for s in subsets:
            parts.append(table(f"ScanNet {s} classes (OpenGaussian protocol, per Gaussian)",
                               "NYU40 labels mapped to the subset, opacity < 0.1 ignored, argmax of the cosine to "
                               "the class names; means over the classes present in the scene.",
                               ["mIoU", "mAcc"], {k: (r[s]["miou"], r[s]["macc"]) for k, r in scannet.items()
                                                  if s in r}))
    return "\n".join(parts)
