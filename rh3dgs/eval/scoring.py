"""Scoring a semantic scene against a labelled dataset's ground truth (2D and 3D).

:func:`evaluate_scene` renders the scene's latents in the chosen views and scores them against
the dataset's class masks (``masks/<stem>.png``, 255 = background; :mod:`rh3dgs.data.labelled`),
and its per-Gaussian answers against ``scene.ply``'s ``class_id``.

Protocols (queries = the class names of ``classes.txt``):

``ovs3d`` (default; the 3D-OVS argmax protocol)
    per pixel, argmax over the classes of the cosine between the rendered, decoded feature
    and each class's text embedding (the argmax of LERF relevancy is the same: relevancy
    is monotone in the query cosine for a fixed pixel). **Choice:** only pixels with a
    ground-truth class count (background pixels are ignored, so the silhouette is given:
    every method is scored on semantics, not geometry). ``miou`` = mean IoU over the
    (view, class) pairs where the class occurs in the ground truth or the prediction;
    ``mbiou`` = mean boundary IoU (Cheng et al. 2021, band 2 % of the image diagonal,
    :func:`rh3dgs.eval.metrics.boundary_iou`) over (view, class present in the ground
    truth) of the predicted class mask against the ground-truth mask; ``accuracy`` = pixel
    accuracy over labelled pixels; ``class_iou`` = per class, the mean IoU over the views
    where it occurs.
``lerf``
    (also computed) LERF-OVS mask protocol per (view, class present): relevancy with the
    canonical negatives -> LangSplat smoothing / normalisation / 0.4 threshold / 7x7
    majority (:func:`rh3dgs.eval.protocols.lerf_ovs_mask`) -> IoU; ``lerf_miou`` is their mean.
3D
    per-Gaussian argmax over the classes of the decoded latents vs the dataset's ``class_id``,
    over **every** Gaussian of opacity > ``min_opacity`` (0.1); a Gaussian without a feature
    counts as "no class" (``miou_3d``). ``miou_3d_nofill``: the same with the Gaussians whose
    feature was filled from their 3D neighbours counted as "no class" (what the lift gives
    without filling). ``miou_3d_fill_ceiling``: the same with every filled Gaussian given its true
    class, what a perfect filling would give (a bound for the evaluation; the lift never sees it).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import torch

from ..data.labelled import BACKGROUND, LabelledDataset
from ..errors import ConfigError, InputFileError
from ..query import TEMPERATURE, mask_low_alpha, relevancy_from_cosines
from .metrics import boundary_iou, iou, miou_3d
from .protocols import lerf_ovs_mask

__all__ = ["evaluate_scene", "score_views", "score_gaussians", "scene_report_markdown", "read_gt_dataset"]

PathLike = Union[str, Path]


def read_gt_dataset(dataset_dir: PathLike):
    """(class names, {stem: int64 [H, W] mask, 255 = background}, per-Gaussian class ids or None)."""
    ds = LabelledDataset.open(dataset_dir)
    return ds.classes, ds.masks(), ds.class_ids()


def score_views(field_, latent_maps: Sequence[torch.Tensor], alphas: Sequence[torch.Tensor],
                gt_masks: Sequence[np.ndarray], text: torch.Tensor, negatives: Optional[torch.Tensor] = None,
                temperature: float = TEMPERATURE, dilation_ratio: float = 0.02, return_maps: bool = False):
    """2D scores of rendered latent maps ``[H, W, d]`` against class masks (module docstring, ``ovs3d`` and
    ``lerf``). ``text`` [K, D] class embeddings; ``negatives`` [J, D] for the LERF protocol (None: skip it).
    Returns a dict: miou, mbiou, accuracy, lerf_miou, class_iou [K] (NaN = class never present),
    and with ``return_maps`` ``maps``: per view (argmax [H, W] with -1 on background, relevancy [K, H, W] or None).
    """
    K = text.shape[0]
    ious, bious, lerf_ious, correct, total = [], [], [], 0, 0
    per_class: List[List[float]] = [[] for _ in range(K)]
    maps = []
    for lat, alpha, gt in zip(latent_maps, alphas, gt_masks):
        cos = field_.cosine(lat, text)  # [H, W, K]
        pred = cos.argmax(-1).cpu().numpy()
        fg = gt != BACKGROUND
        pred_fg = np.where(fg, pred, -1)
        correct += int(np.count_nonzero((pred == gt) & fg))
        total += int(np.count_nonzero(fg))
        rel = None
        if negatives is not None:
            ncos = field_.cosine(lat, negatives) if len(negatives) else lat.new_zeros(*lat.shape[:2], 0)
            rel = mask_low_alpha(relevancy_from_cosines(cos, ncos, temperature), alpha).cpu().numpy()
        for k in range(K):
            g, p = gt == k, pred_fg == k
            if g.any() or p.any():
                v = iou(p, g)
                ious.append(v)
                if g.any():
                    per_class[k].append(v)
            if g.any():
                bious.append(boundary_iou(p, g, dilation_ratio))
                if rel is not None:
                    lerf_ious.append(iou(lerf_ovs_mask(rel[..., k]), g))
        if return_maps:
            maps.append((pred_fg, None if rel is None else np.moveaxis(rel, -1, 0)))
    out: Dict[str, object] = {
        "miou": float(np.mean(ious)) if ious else math.nan,
        "mbiou": float(np.mean(bious)) if bious else math.nan,
        "accuracy": correct / total if total else math.nan,
        "lerf_miou": float(np.mean(lerf_ious)) if lerf_ious else math.nan,
        "class_iou": [float(np.mean(v)) if v else math.nan for v in per_class],
    }
    if return_maps:
        out["maps"] = maps
    return out


def score_gaussians(field_, text: torch.Tensor, gt_class_ids: np.ndarray, opacities: torch.Tensor,
                    min_opacity: float = 0.1) -> Dict[str, float]:
    """3D scores (module docstring): ``miou_3d``, ``miou_3d_nofill`` and ``miou_3d_fill_ceiling`` over Gaussians of opacity > ``min_opacity``."""
    K = text.shape[0]
    pred = (field_.decode() @ text.T.to(field_.latents)).argmax(-1)
    keep = (opacities.detach().to(pred.device) > min_opacity).cpu().numpy()
    if field_.valid is not None:
        pred[~field_.valid.to(pred.device)] = -1
    p = pred.cpu().numpy()
    out = {"miou_3d": miou_3d(p[keep], gt_class_ids[keep], num_classes=K)}
    if field_.filled is not None:
        f = field_.filled.cpu().numpy()
        p2 = p.copy()
        p2[f] = -1
        out["miou_3d_nofill"] = miou_3d(p2[keep], gt_class_ids[keep], num_classes=K)
        p2[f] = gt_class_ids[f]
        out["miou_3d_fill_ceiling"] = miou_3d(p2[keep], gt_class_ids[keep], num_classes=K)
    else:
        out["miou_3d_nofill"] = out["miou_3d_fill_ceiling"] = out["miou_3d"]
    return out


def evaluate_scene(scene, dataset_dir: PathLike, views: Optional[Sequence[int]] = None,
                   gt_class_ids: Optional[np.ndarray] = None, lerf: bool = True,
                   dilation_ratio: float = 0.02, return_maps: bool = False, min_opacity: float = 0.1
                   ) -> Dict[str, object]:
    """Score a semantic scene (folder path or :class:`rh3dgs.api.Scene`) against a labelled dataset.

    ``views``: camera indices of the scene to score (default: every camera with a mask; pass the
    held-out ones for a held-out score). Returns :func:`score_views`' dict plus ``miou_3d`` /
    ``miou_3d_nofill`` (when per-Gaussian ground truth is available and matches N), ``num_views``,
    ``classes``, and with ``return_maps`` ``maps``: {view stem: (argmax [H, W], relevancy [K, H, W])}.
    """
    from ..api import load
    from ..io.transforms import load_transforms
    from ..progress import track

    sc = load(scene) if isinstance(scene, (str, Path)) else scene
    field_ = sc._require_field()
    classes, masks, gt3d = read_gt_dataset(dataset_dir)
    if gt_class_ids is not None:
        gt3d = np.asarray(gt_class_ids).astype(np.int64)
    cams = sc.cameras
    if cams is None:
        tj = Path(dataset_dir) / "transforms.json"
        if not tj.is_file():
            raise ConfigError(f"the scene has no cameras and {tj} does not exist")
        cams, _ = load_transforms(tj, check_images=False)
    names = cams.names or [f"frame_{i:05d}" for i in range(len(cams))]
    pairs = [(i, n) for i, n in enumerate(names) if n in masks]
    if views is not None:
        keep = set(int(v) for v in views)
        pairs = [(i, n) for i, n in pairs if i in keep]
    if not pairs:
        raise ConfigError(f"no camera of the scene has a mask in {Path(dataset_dir) / 'masks'} "
                          f"(camera names {names[:3]}..., masks {sorted(masks)[:3]}...)")
    text = sc.encode(list(classes))  # [K, D]
    lats, alphas = [], []
    for i, stem in track(pairs, description="eval: rendering views"):
        lat, alpha, _ = sc.render_latents(cams[i])
        if lat.shape[:2] != masks[stem].shape:
            raise InputFileError(Path(dataset_dir) / "masks" / f"{stem}.png",
                                 f"mask size {list(masks[stem].shape)} != rendered size {list(lat.shape[:2])}")
        lats.append(lat)
        alphas.append(alpha)
    out = score_views(field_, lats, alphas, [masks[s] for _, s in pairs], text,
                      sc._negatives(None) if lerf else None, sc.temperature, dilation_ratio, return_maps)
    if return_maps:
        out["maps"] = {s: m for (_, s), m in zip(pairs, out["maps"])}
    out["num_views"] = len(pairs)
    out["classes"] = list(classes)
    if gt3d is not None and len(gt3d) == len(sc.gaussians):
        out.update(score_gaussians(field_, text, gt3d, sc.gaussians.activated_opacities, min_opacity))
    return out


def scene_report_markdown(result: Dict[str, object], title: str = "Evaluation") -> str:
    keys = [("miou", "mIoU (3D-OVS argmax)"), ("mbiou", "mBIoU"), ("accuracy", "pixel accuracy"),
            ("lerf_miou", "mIoU (LERF-OVS threshold)"), ("miou_3d", "3D mIoU (per Gaussian, opacity > 0.1)"),
            ("miou_3d_nofill", "3D mIoU without filled Gaussians")]
    lines = [f"# {title}", "", "| metric | value |", "| --- | --- |"]
    for k, label in keys:
        if k in result:
            lines.append(f"| {label} | {100 * float(result[k]):.2f} |")
    lines += ["", f"{result['num_views']} views, classes: {', '.join(result['classes'])}", ""]
    ci = result.get("class_iou")
    if ci:
        lines += ["| class | IoU |", "| --- | --- |"]
        lines += [f"| {n} | {'-' if math.isnan(v) else f'{100 * v:.1f}'} |" for n, v in zip(result["classes"], ci)]
        lines.append("")
    return "\n".join(lines)
