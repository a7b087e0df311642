"""LERF-Mask (Gaussian Grouping's annotations of LERF figurines / ramen / teatime) and COLMAP cameras.

Layout of one scene, as Gaussian Grouping distributes it (``docs/dataset.md`` of lkeab/gaussian-grouping)::

    lerf_mask/<scene>/
        images/            every photo (frame_00001.jpg, ...)
        images_train/      the training photos (same names); the others are the test views
        sparse/0/          COLMAP model (cameras / images .bin or .txt), undistorted PINHOLE cameras
        test_mask/<view>/<text prompt>.png    8-bit masks of the novel (test) views

``<view>`` is the index of a test view in name order (``0``, ``1``, ...; what Gaussian Grouping's
``render_lerf_mask.py`` writes: its test cameras are the images not in ``images_train``, sorted by
name) or an image name itself; :func:`load_lerf_mask` resolves both to the image and its camera.
Masks are kept as the 8-bit grey images they are (``PIL.Image.convert("L")``, as the reference
evaluation reads them); :func:`rh3dgs.eval.protocols.lerf_mask_scores` binarises them ``> 128``.

COLMAP cameras (:func:`read_colmap_cameras`): ``images.bin`` / ``.txt`` hold world-to-camera
rotations (quaternion ``qw qx qy qz``) and translations in OpenCV axes, which are rh3dgs's
``viewmats`` directly; ``PINHOLE`` (fx fy cx cy) and ``SIMPLE_PINHOLE`` (f cx cy) intrinsics.
Distorted models are refused naming the model (undistort with ``colmap image_undistorter`` first).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from ...errors import InputFileError

__all__ = ["LerfMaskFormatError", "LerfMaskView", "LerfMaskScene", "read_mask_folder", "read_colmap_cameras",
           "load_lerf_mask"]

PathLike = Union[str, Path]
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".JPG", ".JPEG", ".PNG")


class LerfMaskFormatError(InputFileError):
    """A LERF-Mask scene folder, mask or COLMAP model that is missing or malformed."""


@dataclass
class LerfMaskView:
    """One annotated test view: ``name`` (its ``test_mask`` folder), ``image`` (the image stem it is) and
    ``masks`` {prompt: uint8 [H, W]}."""

    name: str
    image: str
    masks: Dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class LerfMaskScene:
    """A LERF-Mask scene: its test views (in folder order) and the COLMAP cameras of those views."""

    root: Path
    views: List[LerfMaskView]
    cameras: Optional[object] = None  # rh3dgs.Cameras named by image stem, one per view

    @property
    def prompts(self) -> List[str]:
        return list(dict.fromkeys(p for v in self.views for p in v.masks))


def read_mask_folder(folder: PathLike) -> Dict[str, np.ndarray]:
    """{prompt: uint8 [H, W] grey mask} of every ``<prompt>.png`` in a folder (sorted by name)."""
    from ...io.images import open_image

    d = Path(folder)
    files = sorted(p for p in d.iterdir() if p.suffix.lower() == ".png") if d.is_dir() else []
    if not files:
        raise LerfMaskFormatError(d, "no <text prompt>.png masks in this test view folder")
    out: Dict[str, np.ndarray] = {}
    shape = None
    for f in files:
        with open_image(f, LerfMaskFormatError) as im:
            m = np.array(im.convert("L"))
        if shape is not None and m.shape != shape:
            raise LerfMaskFormatError(f, f"mask is {m.shape[1]}x{m.shape[0]}, the view's other masks "
                                         f"{shape[1]}x{shape[0]}")
        shape = m.shape
        out[f.stem] = m
    return out


def _colmap_model(sparse: Path):
    from nerfstudio.data.utils import colmap_parsing_utils as cp

    for ext, rc, ri in ((".bin", cp.read_cameras_binary, cp.read_images_binary),
                        (".txt", cp.read_cameras_text, cp.read_images_text)):
        cams, imgs = sparse / f"cameras{ext}", sparse / f"images{ext}"
        if cams.is_file() and imgs.is_file():
            try:
                return rc(str(cams)), ri(str(imgs)), imgs
            except (OSError, ValueError, IndexError, KeyError, UnicodeDecodeError, EOFError) as exc:
                raise LerfMaskFormatError(imgs, f"COLMAP model cannot be read ({type(exc).__name__}: {exc})") from exc
            except Exception as exc:  # struct.error on a truncated .bin
                raise LerfMaskFormatError(imgs, f"COLMAP model truncated or corrupt ({type(exc).__name__}: {exc})") from exc
    raise LerfMaskFormatError(sparse, "no COLMAP model here (cameras.bin + images.bin or cameras.txt + images.txt)")


def read_colmap_cameras(sparse_dir: PathLike, names: Optional[Sequence[str]] = None):
    """rh3dgs :class:`~rh3dgs.cameras.Cameras` of a COLMAP model's images (all, in name order, or ``names``:
    image stems or file names, in that order); one image size, PINHOLE / SIMPLE_PINHOLE cameras."""
    import torch

    from nerfstudio.data.utils.colmap_parsing_utils import qvec2rotmat

    from ...cameras import Cameras

    sparse = Path(sparse_dir)
    cams, imgs, src = _colmap_model(sparse)
    by_stem = {Path(im.name).stem: im for im in imgs.values()}
    wanted = sorted(by_stem) if names is None else [Path(n).stem for n in names]
    missing = [n for n in wanted if n not in by_stem]
    if missing:
        raise LerfMaskFormatError(src, f"no registered image named {missing[0]!r} ({len(missing)} of {len(wanted)} "
                                       "missing)")
    view, K, sizes = [], [], set()
    for n in wanted:
        im = by_stem[n]
        cam = cams[im.camera_id]
        if cam.model == "PINHOLE":
            fx, fy, cx, cy = cam.params[:4]
        elif cam.model == "SIMPLE_PINHOLE":
            fx, cx, cy = cam.params[:3]
            fy = fx
        else:
            raise LerfMaskFormatError(src, f"camera {cam.id} is a {cam.model} camera; only undistorted PINHOLE / "
                                           "SIMPLE_PINHOLE models are read (run colmap image_undistorter first)",
                                      field="camera_model")
        sizes.add((int(cam.width), int(cam.height)))
        m = np.eye(4)
        m[:3, :3] = qvec2rotmat(np.asarray(im.qvec, dtype=np.float64))
        m[:3, 3] = np.asarray(im.tvec, dtype=np.float64)
        view.append(m)
        K.append([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])
    if len(sizes) != 1:
        raise LerfMaskFormatError(src, f"images of several sizes ({sorted(sizes)}); rh3dgs.Cameras holds one size")
    (w, h), = sizes
    return Cameras(torch.tensor(np.stack(view), dtype=torch.float32), torch.tensor(K, dtype=torch.float32), w, h,
                   names=list(wanted))


def _stems(folder: Path) -> List[str]:
    return sorted(p.stem for p in folder.iterdir() if p.suffix in IMAGE_SUFFIXES) if folder.is_dir() else []


def load_lerf_mask(scene_dir: PathLike, cameras: bool = True) -> LerfMaskScene:
    """A LERF-Mask scene folder (module docstring) -> :class:`LerfMaskScene` (masks, and the test views'
    COLMAP cameras unless ``cameras=False``)."""
    root = Path(scene_dir)
    tm = root / "test_mask"
    if not tm.is_dir():
        raise LerfMaskFormatError(tm, "folder not found (expected lerf_mask/<scene>/test_mask/<view>/<prompt>.png)")
    folders = [p for p in tm.iterdir() if p.is_dir()]
    if not folders:
        raise LerfMaskFormatError(tm, "no test view folders")
    folders.sort(key=lambda p: (0, int(p.name), "") if p.name.isdigit() else (1, 0, p.name))
    images = _stems(root / "images")
    train = set(_stems(root / "images_train"))
    test = [s for s in images if s not in train] if train else []
    views = []
    for f in folders:
        if f.name in images:
            image = f.name
        elif f.name.isdigit():
            if not test:
                raise LerfMaskFormatError(root / "images_train", "view folders are numbered, so the test views are "
                                          "the images/ not in images_train/, but that leaves none (or a folder is "
                                          "missing)")
            k = int(f.name)
            if k >= len(test):
                raise LerfMaskFormatError(f, f"test view {k} but only {len(test)} test images (images/ minus "
                                             "images_train/)")
            image = test[k]
        else:
            raise LerfMaskFormatError(f, "view folder is neither a test view number nor an image name in images/")
        views.append(LerfMaskView(f.name, image, read_mask_folder(f)))
    cams = read_colmap_cameras(root / "sparse" / "0", [v.image for v in views]) if cameras else None
    return LerfMaskScene(root, views, cams)
