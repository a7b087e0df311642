"""Readers for real open-vocabulary segmentation benchmarks.

* :mod:`.lerf_ovs` - LERF-OVS labels (LangSplat's ``label/<scene>/frame_XXXXX.json``, labelme style)
  -> per-frame, per-category rasterised masks and boxes.
* :mod:`.lerf_mask` - LERF-Mask (Gaussian Grouping's ``test_mask/<view>/<prompt>.png``) -> per-view
  8-bit masks, the test views' images and their COLMAP cameras (:func:`read_colmap_cameras`).
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
from .lerf_mask import (
    LerfMaskFormatError,
    LerfMaskScene,
    LerfMaskView,
    load_lerf_mask,
    read_colmap_cameras,
    read_mask_folder,
)
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
    "LerfMaskScene", "LerfMaskView", "LerfMaskFormatError", "load_lerf_mask", "read_mask_folder",
    "read_colmap_cameras",
    "OVS3DScene", "OVS3DFormatError", "load_ovs3d", "read_poses_bounds", "llff_to_opencv_viewmats",
    "PointLabelError", "read_labelled_points", "nearest_gaussian", "transfer_labels_to_gaussians",
    "transfer_predictions_to_points",
]
