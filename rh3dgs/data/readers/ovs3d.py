"""3D-OVS scenes (Liu et al., "Weakly Supervised 3D Open-vocabulary Segmentation", 2023).

Layout of one scene::

    images/<stem>.jpg|png                  training / test images (sorted = pose order)
    poses_bounds.npy                       LLFF poses, float [N, 17]
    segmentations/classes.txt              class names, one per line (index = class id)
    segmentations/<view>/<class>.png       0 / 255 mask of each class in the labelled views

LLFF pose convention (``poses_bounds.npy``)
-------------------------------------------
Row i is ``[P (3x5) flattened row-major, near, far]``. ``P[:, :3]`` is the camera-to-world
rotation whose columns are the camera axes **[down, right, backwards]** in world
coordinates (LLFF's "[-u, r, -t]"), ``P[:, 3]`` the camera centre and ``P[:, 4]`` =
``[H, W, focal]`` of the images the poses were computed for. We convert to OpenCV
(x right, y down, z forward - gsplat's ``viewmats``):

    R_cv = [ right | down | forward ] = [ P[:,1] | P[:,0] | -P[:,2] ]
    c2w_cv = [R_cv | P[:,3]],   viewmat = inverse(c2w_cv) = [R_cv^T | -R_cv^T t]

(NeRF's ``load_llff`` first reorders to OpenGL ``[P1, -P0, P2]`` = [right, up, back];
flipping its y and z gives the same R_cv.) Intrinsics: ``fx = focal * W_img / W``,
``fy = focal * H_img / H`` for the actual image size, principal point at the image
centre. No re-centring or rescaling of the poses is applied (the Gaussians must live in
the same world frame as ``poses_bounds.npy``).

Masks: a pixel belongs to a class when its mask value is > 127 (files are 0 / 255; RGB or
RGBA files are converted to grey). A class without a PNG in a view is all-False there and
listed in :attr:`OVS3DScene.missing`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple, Union

import numpy as np
import torch

from ...cameras import Cameras
from ...io.npy import load_npy
from ...errors import InputFileError

__all__ = ["OVS3DFormatError", "OVS3DScene", "read_poses_bounds", "llff_to_opencv_viewmats", "load_ovs3d"]

PathLike = Union[str, Path]
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".JPG", ".JPEG", ".PNG")


class OVS3DFormatError(InputFileError):
    """A 3D-OVS scene file (poses_bounds.npy, classes.txt, a mask PNG, images/) is malformed."""


@dataclass
class OVS3DScene:
    """A loaded 3D-OVS scene.

    cameras: one camera per image (OpenCV viewmats, names = image stems).
    image_paths: the images, in pose order.
    bounds: [N, 2] near / far depth bounds from LLFF.
    class_names: from ``segmentations/classes.txt``.
    masks: {view stem: bool [Q, H, W]} for every labelled view (Q = len(class_names)).
    view_index: {view stem: camera index}.
    missing: [(view, class)] pairs without a PNG (treated as empty).
    """

    root: Path
    cameras: Cameras
    image_paths: List[Path]
    bounds: np.ndarray
    class_names: List[str]
    masks: Dict[str, np.ndarray]
    view_index: Dict[str, int]
    missing: List[Tuple[str, str]] = field(default_factory=list)

    def labels(self, view: str, ignore_index: int = 255) -> np.ndarray:
        """[H, W] int label map of a view: the class index, ``ignore_index`` where no (or >1) class."""
        m = self.masks[view]
        out = np.full(m.shape[1:], ignore_index, dtype=np.int64)
        one = m.sum(0) == 1
        out[one] = m.argmax(0)[one]
        return out


def read_poses_bounds(path: PathLike) -> Tuple[np.ndarray, np.ndarray]:
    """LLFF ``poses_bounds.npy`` -> (poses [N, 3, 5], bounds [N, 2]) as float64."""
    p = Path(path)
    if not p.is_file():
        raise OVS3DFormatError(p, "not found (3D-OVS scenes store LLFF poses in poses_bounds.npy)")
    arr = load_npy(p, OVS3DFormatError, "LLFF pose array")
    if arr.ndim != 2 or arr.shape[1] != 17 or arr.shape[0] < 1:
        raise OVS3DFormatError(p, f"must be a float array [N, 17] (3x5 pose + near, far), got shape {list(arr.shape)}",
                               field="shape")
    if not np.issubdtype(arr.dtype, np.number):
        raise OVS3DFormatError(p, f"must be numeric, got dtype {arr.dtype}", field="dtype")
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        row = int(np.nonzero(~np.isfinite(arr).all(1))[0][0])
        raise OVS3DFormatError(p, "contains NaN / Inf", field=f"row {row}")
    if (np.abs(arr) > 1e30).any():  # finite in float64, but the float32 cameras would overflow
        row = int(np.nonzero((np.abs(arr) > 1e30).any(1))[0][0])
        raise OVS3DFormatError(p, "has values beyond 1e30 (float32 cameras would overflow)", field=f"row {row}")
    poses = arr[:, :15].reshape(-1, 3, 5)
    hwf = poses[:, :, 4]
    if (hwf <= 0).any():
        row = int(np.nonzero((hwf <= 0).any(1))[0][0])
        raise OVS3DFormatError(p, f"H, W, focal must be > 0, got {hwf[row].tolist()}", field=f"row {row} hwf")
    R = poses[:, :, :3]
    err = np.abs(R.transpose(0, 2, 1) @ R - np.eye(3)).max(axis=(1, 2))
    if (err > 1e-3).any():
        row = int(np.argmax(err))
        raise OVS3DFormatError(p, f"rotation is not orthonormal (max |R^T R - I| = {err[row]:.3g})",
                               field=f"row {row} rotation")
    return poses, arr[:, 15:17]


def llff_to_opencv_viewmats(poses: np.ndarray) -> torch.Tensor:
    """LLFF poses [N, 3, 5] (or [N, 3, 4]) with [down, right, backwards] axes -> OpenCV world-to-camera [N, 4, 4]."""
    P = np.asarray(poses, dtype=np.float64)
    R_cv = np.stack([P[:, :, 1], P[:, :, 0], -P[:, :, 2]], axis=-1)  # columns: right, down, forward
    t = P[:, :, 3]
    V = np.tile(np.eye(4), (len(P), 1, 1))
    Rt = R_cv.transpose(0, 2, 1)
    V[:, :3, :3] = Rt
    V[:, :3, 3] = -(Rt @ t[:, :, None])[:, :, 0]
    return torch.from_numpy(V).float()


def _read_classes(path: Path) -> List[str]:
    if not path.is_file():
        raise OVS3DFormatError(path, "not found (one class name per line)")
    try:
        names = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except UnicodeDecodeError as exc:
        raise OVS3DFormatError(path, f"is not UTF-8 text ({exc})") from exc
    if not names:
        raise OVS3DFormatError(path, "no class names")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise OVS3DFormatError(path, f"duplicate class names {dup}")
    return names


def _read_mask(path: Path) -> np.ndarray:
    from ...io.images import open_image

    with open_image(path, OVS3DFormatError) as im:
        im.load()
        a = np.array(im.convert("L") if im.mode not in ("L", "1", "I", "I;16") else im)
    if a.ndim != 2:
        raise OVS3DFormatError(path, f"mask must be single-channel, got shape {list(a.shape)}")
    return a > 127 if a.dtype != bool else a


def load_ovs3d(root: PathLike, image_dir: str = "images", load_masks: bool = True) -> OVS3DScene:
    """Read a 3D-OVS scene folder (layout and conventions in the module docstring)."""
    from ...io.images import open_image

    r = Path(root)
    if not r.is_dir():
        raise OVS3DFormatError(r, "scene folder not found")
    poses, bounds = read_poses_bounds(r / "poses_bounds.npy")
    idir = r / image_dir
    if not idir.is_dir():
        raise OVS3DFormatError(idir, "image folder not found")
    images = sorted(p for p in idir.iterdir() if p.suffix in IMAGE_SUFFIXES)
    if len(images) != len(poses):
        raise OVS3DFormatError(r / "poses_bounds.npy", f"{len(poses)} poses for {len(images)} images in {idir}",
                               field="rows")
    with open_image(images[0], OVS3DFormatError) as im:
        W, H = im.size
    h0, w0, f = poses[:, 0, 4], poses[:, 1, 4], poses[:, 2, 4]
    Ks = torch.zeros(len(poses), 3, 3)
    Ks[:, 0, 0] = torch.from_numpy(f * W / w0).float()
    Ks[:, 1, 1] = torch.from_numpy(f * H / h0).float()
    Ks[:, 0, 2], Ks[:, 1, 2], Ks[:, 2, 2] = W / 2.0, H / 2.0, 1.0
    names = [p.stem for p in images]
    cams = Cameras(llff_to_opencv_viewmats(poses), Ks, int(W), int(H), names=names)
    seg = r / "segmentations"
    class_names = _read_classes(seg / "classes.txt")
    view_index = {n: i for i, n in enumerate(names)}
    masks: Dict[str, np.ndarray] = {}
    missing: List[Tuple[str, str]] = []
    if load_masks:
        for vdir in sorted(p for p in seg.iterdir() if p.is_dir()):
            if vdir.name not in view_index:
                raise OVS3DFormatError(vdir, f"labelled view {vdir.name!r} matches no image stem in {idir}")
            per: List[np.ndarray] = []
            shape = None
            for k, c in enumerate(class_names):
                mp = vdir / f"{c}.png"
                if not mp.is_file():
                    per.append(None)  # type: ignore[arg-type]
                    missing.append((vdir.name, c))
                    continue
                m = _read_mask(mp)
                if shape is not None and m.shape != shape:
                    raise OVS3DFormatError(mp, f"mask size {list(m.shape)} differs from the view's other masks "
                                               f"{list(shape)}")
                shape = m.shape
                per.append(m)
            if shape is None:
                raise OVS3DFormatError(vdir, f"no <class>.png for any class of {seg / 'classes.txt'}")
            masks[vdir.name] = np.stack([np.zeros(shape, bool) if m is None else m for m in per])
    return OVS3DScene(r, cams, images, bounds, class_names, masks, view_index, missing)
