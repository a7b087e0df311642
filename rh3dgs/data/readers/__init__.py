"""Readers for real open-vocabulary segmentation benchmarks.

* :mod:`.lerf_ovs` - LERF-OVS labels (LangSplat's ``label/<scene>/frame_XXXXX.json``, labelme style)
  -> per-frame, per-category rasterised masks and boxes.
* :mod:`.ovs3d` - 3D-OVS scenes (``images/``, LLFF ``poses_bounds.npy``,
  ``segmentations/classes.txt``, ``segmentations/<view>/<class>.png``) -> :class:`rh3dgs.Cameras`
  and per-view class masks.
* :mod:`.scannet` - labelled point clouds (ScanNet-style ``.ply`` / ``.npy``) and
  nearest-Gaussian label transfer for 3D evaluation.

Malformed inputs raise subclasses of :class:`rh3dgs.errors.InputFileError` that name the
file and the field.
"""
from __future__ import annotations

from .lerf_ovs import LerfFrame, LerfLabelError, LerfObject, load_lerf_ovs, rasterize_polygon, read_lerf_label
from .ovs3d import OVS3DFormatError, OVS3DScene, llff_to_opencv_viewmats, load_ovs3d, read_poses_bounds
from .scannet import (
    PointLabelError,
    nearest_gaussian,
    read_labelled_points,
    transfer_labels_to_gaussians,
    transfer_predictions_to_points,
)

__all__ = [
    "LerfFrame", "LerfObject", "LerfLabelError", "read_lerf_label", "load_lerf_ovs", "rasterize_polygon",
    "OVS3DScene", "OVS3DFormatError", "load_ovs3d", "read_poses_bounds", "llff_to_opencv_viewmats",
    "PointLabelError", "read_labelled_points", "nearest_gaussian", "transfer_labels_to_gaussians",
    "transfer_predictions_to_points",
]
