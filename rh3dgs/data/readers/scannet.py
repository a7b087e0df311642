"""Per-point labels for ScanNet-style 3D evaluation, and nearest-neighbour label transfer.

Inputs: a labelled point cloud, either

* ``.ply`` with a ``vertex`` element holding ``x, y, z`` and an integer label property
  (``label`` as in ScanNet's ``*_vh_clean_2.labels.ply``, or one of ``semantic_label``,
  ``class``, ``category_id``, ``scalar_label``; or the name passed as ``label_field``);
* ``.npy`` float array ``[P, 4+]`` with columns ``x, y, z, ..., label`` (label = last column)
  or a structured array with ``x, y, z`` and a label field;
* ``.npz`` with arrays ``points`` [P, 3] and ``labels`` [P].

Raw labels are mapped with an optional ``label_map`` ({raw id: class index}; unmapped ids
and ``ignore_labels`` - ScanNet's 0 = unannotated by default - become ``-1``, the
``ignore_index`` of :func:`rh3dgs.eval.metrics.miou_3d`).

Transfer (scipy ``cKDTree``):

* :func:`transfer_predictions_to_points` - the ScanNet protocol: each GT point takes the
  predicted label of its nearest Gaussian centre; score with ``miou_3d`` / ``macc_3d``
  over the points.
* :func:`transfer_labels_to_gaussians` - the reverse: each Gaussian takes the label of its
  nearest labelled point (``-1`` beyond ``max_distance``); score per Gaussian.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np

from ...io.npy import load_npy, load_npz
from ...errors import InputFileError

__all__ = ["PointLabelError", "read_labelled_points", "nearest_gaussian", "transfer_predictions_to_points",
           "transfer_labels_to_gaussians"]

PathLike = Union[str, Path]
LABEL_FIELDS = ("label", "semantic_label", "class", "category_id", "scalar_label")


class PointLabelError(InputFileError):
    """A labelled point file is missing, unreadable, or lacks coordinates / labels."""


def _map_labels(raw: np.ndarray, label_map: Optional[Dict[int, int]], ignore_labels: Sequence[int]) -> np.ndarray:
    raw = raw.astype(np.int64)
    if label_map is not None:
        out = np.full(raw.shape, -1, dtype=np.int64)
        for k, v in label_map.items():
            out[raw == int(k)] = int(v)
    else:
        out = raw.copy()
    for ig in ignore_labels:
        out[raw == int(ig)] = -1
    return out


def read_labelled_points(path: PathLike, label_field: Optional[str] = None,
                         label_map: Optional[Dict[int, int]] = None,
                         ignore_labels: Sequence[int] = (0,)) -> Tuple[np.ndarray, np.ndarray]:
    """(points [P, 3] float64, labels [P] int64 with -1 = ignore) from a .ply / .npy / .npz file."""
    p = Path(path)
    if not p.is_file():
        raise PointLabelError(p, "labelled point file not found")
    suf = p.suffix.lower()
    if suf == ".ply":
        from plyfile import PlyData

        try:
            ply = PlyData.read(str(p))
        except Exception as exc:  # plyfile raises several types on corrupt files
            raise PointLabelError(p, f"cannot be read as PLY ({exc})") from exc
        if "vertex" not in [e.name for e in ply.elements]:
            raise PointLabelError(p, "no 'vertex' element", field="vertex")
        v = ply["vertex"].data
        names = v.dtype.names or ()
        for c in "xyz":
            if c not in names:
                raise PointLabelError(p, "missing coordinate property", field=f"vertex.{c}")
        field = label_field or next((f for f in LABEL_FIELDS if f in names), None)
        if field is None or field not in names:
            raise PointLabelError(p, f"no label property (looked for {label_field or ', '.join(LABEL_FIELDS)}; "
                                     f"has {', '.join(names)})", field=f"vertex.{label_field or 'label'}")
        pts = np.stack([np.asarray(v[c], dtype=np.float64) for c in "xyz"], -1)
        raw = np.asarray(v[field])
    elif suf in (".npy", ".npz"):
        data = (load_npz(p, PointLabelError, "labelled points") if suf == ".npz"
                else load_npy(p, PointLabelError, "labelled points"))
        if suf == ".npz":
            keys = set(data)
            for k in ("points", "labels"):
                if k not in keys:
                    raise PointLabelError(p, f"missing array (has {sorted(keys)})", field=k)
            pts, raw = np.asarray(data["points"]), np.asarray(data["labels"])
            if pts.ndim != 2 or pts.shape[1] != 3:
                raise PointLabelError(p, f"must be [P, 3], got {list(pts.shape)}", field="points")
            if raw.shape != (len(pts),):
                raise PointLabelError(p, f"must be [P] = [{len(pts)}], got {list(raw.shape)}", field="labels")
        elif data.dtype.names:
            names = data.dtype.names
            for c in "xyz":
                if c not in names:
                    raise PointLabelError(p, "missing coordinate field", field=c)
            field = label_field or next((f for f in LABEL_FIELDS if f in names), None)
            if field is None or field not in names:
                raise PointLabelError(p, "no label field", field=label_field or "label")
            if data.ndim != 1:
                raise PointLabelError(p, f"must be a 1-D array of records, got shape {list(data.shape)}", field="shape")
            for c in (*"xyz", field):
                if data.dtype[c].shape != () or data.dtype[c].kind not in "biuf":
                    raise PointLabelError(p, f"must be a scalar number, got dtype {data.dtype[c]}", field=c)
            pts = np.stack([data[c] for c in "xyz"], -1)
            raw = np.asarray(data[field])
        else:
            if data.ndim != 2 or data.shape[1] < 4:
                raise PointLabelError(p, f"must be [P, 4+] (x, y, z, ..., label), got shape {list(data.shape)}",
                                      field="shape")
            pts, raw = data[:, :3], data[:, -1]
        pts = pts.astype(np.float64)
    else:
        raise PointLabelError(p, f"unsupported extension {p.suffix!r} (expected .ply, .npy or .npz)")
    if not np.isfinite(pts).all():
        raise PointLabelError(p, f"point {int(np.nonzero(~np.isfinite(pts).all(1))[0][0])} has NaN / Inf coordinates",
                              field="points")
    rawf = np.asarray(raw, dtype=np.float64)
    if not np.isfinite(rawf).all() or (rawf != np.round(rawf)).any():
        raise PointLabelError(p, "labels must be integers", field=label_field or "labels")
    return pts, _map_labels(rawf.astype(np.int64), label_map, ignore_labels)


def _np(a) -> np.ndarray:
    if hasattr(a, "detach"):
        return a.detach().cpu().numpy()
    return np.asarray(a)


def nearest_gaussian(points, means, workers: int = 1) -> Tuple[np.ndarray, np.ndarray]:
    """(index [P] of the nearest Gaussian centre to each point, distance [P])."""
    from scipy.spatial import cKDTree

    m = _np(means).astype(np.float64)
    if m.ndim != 2 or m.shape[1] != 3 or len(m) == 0:
        raise ValueError(f"means must be a non-empty [N, 3] array, got {list(m.shape)}")
    d, i = cKDTree(m).query(_np(points).astype(np.float64), k=1, workers=workers)
    return i.astype(np.int64), d


def transfer_predictions_to_points(pred_gaussians, means, points, max_distance: Optional[float] = None,
                                   workers: int = 1) -> np.ndarray:
    """Predicted label per GT point = prediction of its nearest Gaussian ([P], -1 beyond ``max_distance``)."""
    pred = _np(pred_gaussians).astype(np.int64)
    if pred.shape != (len(_np(means)),):
        raise ValueError(f"pred_gaussians must be [N] = [{len(_np(means))}], got {list(pred.shape)}")
    idx, dist = nearest_gaussian(points, means, workers)
    out = pred[idx]
    if max_distance is not None:
        out = np.where(dist <= max_distance, out, -1)
    return out


def transfer_labels_to_gaussians(points, labels, means, max_distance: Optional[float] = None,
                                 workers: int = 1) -> np.ndarray:
    """GT label per Gaussian = label of the nearest labelled point ([N], -1 beyond ``max_distance`` or ignored)."""
    from scipy.spatial import cKDTree

    pts, lab = _np(points).astype(np.float64), _np(labels).astype(np.int64)
    keep = lab >= 0
    pts, lab = pts[keep], lab[keep]
    m = _np(means).astype(np.float64)
    if len(pts) == 0:
        return np.full(len(m), -1, dtype=np.int64)
    d, i = cKDTree(pts).query(m, k=1, workers=workers)
    out = lab[i]
    if max_distance is not None:
        out = np.where(d <= max_distance, out, -1)
    return out
