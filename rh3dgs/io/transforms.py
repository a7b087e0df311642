"""Read and write nerfstudio ``transforms.json`` camera files.

Format (https://docs.nerf.studio/quickstart/data_conventions.html)::

    {
      "camera_model": "OPENCV",                 # optional
      "fl_x": 1072.0, "fl_y": 1068.0,           # focal lengths in pixels
      "cx": 1504.0, "cy": 1000.0,               # principal point (pixels)
      "w": 3008, "h": 2000,                     # image size
      "k1": 0.03, "k2": -0.01, "p1": 0, "p2": 0,# distortion (see note)
      "frames": [
        {"file_path": "images/frame_00001.jpg",  # relative to the json's folder
         "transform_matrix": [[...4x4...]],      # camera-to-world, OpenGL axes
         "fl_x": ...}                            # any intrinsic may also be per frame
      ]
    }

Conventions and deliberate differences from nerfstudio's own data parser:

* Intrinsics may be given at the top level and / or per frame; a per-frame value
  overrides the top-level one (nerfstudio itself uses the top-level value when both
  exist; the two only differ for files that give both with different values).
  ``fl_y`` defaults to ``fl_x``, ``cx`` / ``cy`` to ``w / 2`` / ``h / 2``.
* ``camera_model`` may be ``PINHOLE``, ``SIMPLE_PINHOLE``, ``OPENCV``, ``SIMPLE_RADIAL`` or
  ``RADIAL`` (all perspective). **Distortion parameters (k1..k4, p1, p2,
  distortion_params) are read and ignored**: rh3dgs renders ideal pinhole cameras, so
  the images should be undistorted (a :class:`UserWarning` says so when non-zero
  coefficients are present). Fisheye, equirectangular and other non-perspective models
  raise :class:`CameraFormatError`.
* All frames must share one image size.
* Frames keep the file's order (nerfstudio sorts them by file name), poses are used as
  they are (nerfstudio re-orients, centres and scales them; a splat exported by
  ``ns-export`` lives in that transformed frame - see its ``dataparser_transforms.json``),
  and ``file_path`` is used as written (nerfstudio may swap in a downscaled
  ``images_N`` folder).
* ``transform_matrix`` is an OpenGL camera-to-world matrix (x right, y up, z backward);
  it is converted to the OpenCV world-to-camera ``viewmats`` gsplat uses (in float64,
  then stored as float32).
"""
from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..cameras import OPENGL_TO_OPENCV, Cameras
from ..errors import CameraFormatError, NonFiniteError, ShapeError
from .atomic import atomic_save_json

__all__ = ["load_transforms", "save_transforms", "SUPPORTED_CAMERA_MODELS"]

PathLike = Union[str, os.PathLike]

SUPPORTED_CAMERA_MODELS = ("PINHOLE", "SIMPLE_PINHOLE", "OPENCV", "SIMPLE_RADIAL", "RADIAL")
_DISTORTION_KEYS = ("k1", "k2", "k3", "k4", "p1", "p2")
_MAX_LISTED = 5


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(path: Path, v: Any, field: str, positive: bool = False) -> float:
    if not _is_number(v):
        raise CameraFormatError(path, f"expected a number, got {json.dumps(v)[:60]}", field=field)
    try:
        f = float(v)
    except OverflowError:  # an integer beyond the float range
        raise CameraFormatError(path, f"number out of range: {str(v)[:30]}...", field=field) from None
    if not math.isfinite(f):
        raise CameraFormatError(path, f"non-finite value {v}", field=field)
    if positive and f <= 0:
        raise CameraFormatError(path, f"must be > 0, got {v}", field=field)
    return f


def _size(path: Path, v: Any, field: str) -> int:
    f = _number(path, v, field, positive=True)
    if f != int(f):
        raise CameraFormatError(path, f"image size must be a whole number of pixels, got {v}", field=field)
    return int(f)


def _check_camera_model(path: Path, meta: Dict[str, Any], field: str) -> None:
    if "camera_model" not in meta:
        return
    model = meta["camera_model"]
    if not isinstance(model, str):
        raise CameraFormatError(path, f"expected a string, got {json.dumps(model)[:60]}", field=field)
    if model.upper() not in SUPPORTED_CAMERA_MODELS:
        raise CameraFormatError(
            path,
            f"camera model {model!r} is not supported; rh3dgs renders perspective (pinhole) cameras only "
            f"({', '.join(SUPPORTED_CAMERA_MODELS)}). Undistort / reproject the images to a pinhole model first.",
            field=field,
        )


def _has_distortion(path: Path, meta: Dict[str, Any], where: str) -> bool:
    """Validate distortion coefficients (they must be numbers) and say whether any is non-zero."""
    nonzero = False
    for key in _DISTORTION_KEYS:
        if key in meta:
            nonzero |= _number(path, meta[key], where + key) != 0.0
    if "distortion_params" in meta:
        dp = meta["distortion_params"]
        if not isinstance(dp, list):
            raise CameraFormatError(path, "expected a list of numbers", field=where + "distortion_params")
        for j, v in enumerate(dp):
            nonzero |= _number(path, v, f"{where}distortion_params[{j}]") != 0.0
    return nonzero


def _matrix(path: Path, v: Any, field: str) -> List[List[float]]:
    shape_msg = "must be a 4x4 list of lists of numbers (camera-to-world, OpenGL axes)"
    if not isinstance(v, list) or len(v) != 4 or not all(isinstance(r, list) and len(r) == 4 for r in v):
        got = f"{len(v)} rows" if isinstance(v, list) else type(v).__name__
        if isinstance(v, list) and all(isinstance(r, list) for r in v):
            got = "x".join([str(len(v)), "/".join(sorted({str(len(r)) for r in v})) or "0"])
        raise CameraFormatError(path, f"{shape_msg}, got {got}", field=field)
    m = [[_number(path, x, f"{field}[{i}][{j}]") for j, x in enumerate(r)] for i, r in enumerate(v)]
    if max(abs(a - b) for a, b in zip(m[3], (0.0, 0.0, 0.0, 1.0))) > 1e-4:
        raise CameraFormatError(path, f"last row must be [0, 0, 0, 1], got {m[3]}", field=field)
    r3 = [row[:3] for row in m[:3]]
    det = (
        r3[0][0] * (r3[1][1] * r3[2][2] - r3[1][2] * r3[2][1])
        - r3[0][1] * (r3[1][0] * r3[2][2] - r3[1][2] * r3[2][0])
        + r3[0][2] * (r3[1][0] * r3[2][1] - r3[1][1] * r3[2][0])
    )
    if abs(det) < 1e-9:
        raise CameraFormatError(path, "rotation part is singular (determinant ~ 0); not a camera pose", field=field)
    return m


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise CameraFormatError(path, f"not UTF-8 text (byte {e.start}); is this a JSON file?") from e
    except OSError as e:
        raise CameraFormatError(path, f"cannot read file: {e}") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CameraFormatError(path, f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    except RecursionError as e:  # pragma: no cover - absurdly nested input
        raise CameraFormatError(path, "invalid JSON: nested too deeply") from e
    except ValueError as e:  # e.g. an integer literal over Python's 4300-digit limit
        raise CameraFormatError(path, f"invalid JSON: {e}") from e


def load_transforms(path_or_dir: PathLike, check_images: bool = True,
                    require_images: bool = True) -> Tuple[Cameras, List[Path]]:
    """Load a nerfstudio ``transforms.json`` (or the folder holding one).

    Args:
        path_or_dir: the json file, or a folder containing ``transforms.json``.
        check_images: also open every image's header (cheap, PIL) and check its size
            equals ``w`` x ``h``. The images must exist either way, unless
        require_images: False, for callers that only need the cameras (a scene folder's
            transforms.json refers to the dataset's images, which may live elsewhere).

    Returns ``(cameras, image_paths)``: :class:`Cameras` (float32, CPU, OpenCV
    world-to-camera ``viewmats``, names = image file stems) and the absolute-or-json-relative
    resolved image paths, in the file's frame order. See the module doc for conventions.

    Raises :class:`CameraFormatError` naming the file and the field (e.g.
    ``frames[3].transform_matrix``) for a missing file, invalid JSON, missing keys, a
    matrix that is not 4x4, non-finite numbers, unsupported camera models, mixed image
    sizes, missing images and (``check_images``) images of the wrong size.
    """
    p = Path(path_or_dir)
    path = p / "transforms.json" if p.is_dir() else p
    if not path.is_file():
        what = "no transforms.json in this folder" if p.is_dir() else "file not found"
        raise CameraFormatError(path, what)
    meta = _read_json(path)
    if not isinstance(meta, dict):
        raise CameraFormatError(path, f"top level must be a JSON object, got {type(meta).__name__}")
    if "frames" not in meta:
        raise CameraFormatError(path, "missing key 'frames' (the list of images and poses)", field="frames")
    frames = meta["frames"]
    if not isinstance(frames, list):
        raise CameraFormatError(path, f"must be a list, got {type(frames).__name__}", field="frames")
    if not frames:
        raise CameraFormatError(path, "no frames (empty list)", field="frames")

    _check_camera_model(path, meta, "camera_model")
    distorted = _has_distortion(path, meta, "")
    root = path.parent

    c2ws: List[List[List[float]]] = []
    intr = {k: [] for k in ("fl_x", "fl_y", "cx", "cy")}
    sizes: List[Tuple[int, int]] = []
    image_paths: List[Path] = []
    for i, fr in enumerate(frames):
        where = f"frames[{i}]"
        if not isinstance(fr, dict):
            raise CameraFormatError(path, f"must be a JSON object, got {type(fr).__name__}", field=where)
        _check_camera_model(path, fr, f"{where}.camera_model")
        distorted |= _has_distortion(path, fr, f"{where}.")

        def get(key: str):
            if key in fr:
                return fr[key], f"{where}.{key}"
            if key in meta:
                return meta[key], key
            return None, None

        for key in ("file_path", "transform_matrix"):
            if key not in fr:
                raise CameraFormatError(path, f"missing key '{key}'", field=f"{where}.{key}")
        fp = fr["file_path"]
        if not isinstance(fp, str) or not fp:
            raise CameraFormatError(path, "must be a non-empty string (image path relative to the json)", field=f"{where}.file_path")
        c2ws.append(_matrix(path, fr["transform_matrix"], f"{where}.transform_matrix"))

        vals = {}
        for key in ("w", "h", "fl_x"):
            v, fld = get(key)
            if fld is None:
                hint = ""
                if key == "fl_x" and "camera_angle_x" in meta:
                    hint = " (this looks like a Blender / NeRF-synthetic file with camera_angle_x; convert it to fl_x in pixels)"
                raise CameraFormatError(path, f"missing key '{key}' (neither in the frame nor at the top level){hint}", field=f"{where}.{key}")
            vals[key] = _size(path, v, fld) if key in ("w", "h") else _number(path, v, fld, positive=True)
        v, fld = get("fl_y")
        vals["fl_y"] = vals["fl_x"] if fld is None else _number(path, v, fld, positive=True)
        for key, default in (("cx", vals["w"] / 2.0), ("cy", vals["h"] / 2.0)):
            v, fld = get(key)
            vals[key] = default if fld is None else _number(path, v, fld)
        for key in intr:
            intr[key].append(vals[key])
        sizes.append((vals["w"], vals["h"]))
        if sizes[-1] != sizes[0]:
            raise CameraFormatError(
                path,
                f"image size {sizes[-1][0]}x{sizes[-1][1]} differs from frames[0]'s {sizes[0][0]}x{sizes[0][1]}; "
                "mixed image sizes are not supported (split the dataset or resize the images)",
                field=f"{where}.w",
            )
        ip = Path(fp)
        image_paths.append(ip if ip.is_absolute() else root / ip)

    missing = [(i, ip) for i, ip in enumerate(image_paths) if not ip.is_file()] if require_images else []
    if missing:
        listed = ", ".join(str(ip) for _, ip in missing[:_MAX_LISTED])
        more = f" and {len(missing) - _MAX_LISTED} more" if len(missing) > _MAX_LISTED else ""
        raise CameraFormatError(
            path,
            f"{len(missing)} of {len(image_paths)} images not found: {listed}{more}",
            field=f"frames[{missing[0][0]}].file_path",
        )
    if check_images and require_images:
        _check_image_sizes(path, image_paths, sizes[0])

    if distorted:
        warnings.warn(
            f"{path}: non-zero lens distortion coefficients are ignored; rh3dgs assumes undistorted "
            "pinhole images (undistort them first, e.g. with COLMAP's image_undistorter).",
            UserWarning,
            stacklevel=2,
        )

    w, h = sizes[0]
    c2w = torch.tensor(c2ws, dtype=torch.float64)
    viewmats = torch.linalg.inv(c2w @ OPENGL_TO_OPENCV.double()).float()
    Ks = torch.zeros(len(frames), 3, 3, dtype=torch.float32)
    Ks[:, 0, 0] = torch.tensor(intr["fl_x"])
    Ks[:, 1, 1] = torch.tensor(intr["fl_y"])
    Ks[:, 0, 2] = torch.tensor(intr["cx"])
    Ks[:, 1, 2] = torch.tensor(intr["cy"])
    Ks[:, 2, 2] = 1.0
    for name, t, fld in (("transform_matrix", viewmats, "transform_matrix"), ("intrinsics", Ks, "fl_x")):
        bad = ~torch.isfinite(t).flatten(1).all(1)
        if bad.any():  # finite in the file but beyond float32 range, or an ill-conditioned pose
            i = int(bad.nonzero()[0])
            raise CameraFormatError(path, f"{name} of frame {i} is out of range (overflows float32 or is "
                                          "numerically singular)", field=f"frames[{i}].{fld}")
    cams = Cameras(viewmats=viewmats, Ks=Ks, width=w, height=h, names=[ip.stem for ip in image_paths])
    return cams, image_paths


def _check_image_sizes(path: Path, image_paths: Sequence[Path], size: Tuple[int, int]) -> None:
    from PIL import Image, UnidentifiedImageError

    for i, ip in enumerate(image_paths):
        field = f"frames[{i}].file_path"
        try:
            with Image.open(ip) as im:  # reads the header only
                actual = im.size
        except (UnidentifiedImageError, OSError, ValueError) as e:
            raise CameraFormatError(path, f"cannot read image {ip}: {e}", field=field) from e
        if actual != size:
            raise CameraFormatError(
                path,
                f"image {ip} is {actual[0]}x{actual[1]} but the json says w x h = {size[0]}x{size[1]}",
                field=field,
            )


def save_transforms(
    path: PathLike,
    cameras: Cameras,
    image_paths: Sequence[PathLike],
    camera_model: str = "PINHOLE",
    extra: Optional[Dict[str, Any]] = None,
) -> Path:
    """Write ``cameras`` as a nerfstudio-compatible ``transforms.json`` (atomically).

    ``extra`` adds top-level keys (e.g. ``{"ply_file_path": "sparse_pc.ply"}``).

    The inverse of :func:`load_transforms`. If ``path`` is an existing folder,
    ``path/transforms.json`` is written. Intrinsics shared by every camera go to the top
    level, others per frame. ``file_path`` is written relative to the json's folder
    (POSIX separators) when the image is inside it, else absolute. Matrices are computed
    in float64, so ``load_transforms`` reproduces ``viewmats`` to ~1e-7.
    Returns the path written.
    """
    p = Path(path)
    out = p / "transforms.json" if p.is_dir() else p
    if len(image_paths) != len(cameras):
        raise ShapeError(f"save_transforms({out}): {len(image_paths)} image paths for {len(cameras)} cameras")
    if camera_model.upper() not in SUPPORTED_CAMERA_MODELS:
        raise ValueError(f"save_transforms({out}): camera_model must be one of {SUPPORTED_CAMERA_MODELS}, got {camera_model!r}")
    vm = cameras.viewmats.detach().cpu().double()
    if not torch.isfinite(vm).all() or not torch.isfinite(cameras.Ks).all():
        raise NonFiniteError(f"save_transforms({out}): cameras contain NaN / Inf")
    c2w = torch.linalg.inv(vm) @ OPENGL_TO_OPENCV.double()
    Ks = cameras.Ks.detach().cpu().double()
    intr = {
        "fl_x": Ks[:, 0, 0].tolist(),
        "fl_y": Ks[:, 1, 1].tolist(),
        "cx": Ks[:, 0, 2].tolist(),
        "cy": Ks[:, 1, 2].tolist(),
    }
    shared = {k: v[0] for k, v in intr.items() if all(x == v[0] for x in v)}

    root = Path(os.path.abspath(out.parent))
    meta: Dict[str, Any] = {"camera_model": camera_model.upper()}
    meta.update(shared)
    meta.update({"w": int(cameras.width), "h": int(cameras.height)})
    frames = []
    for i, ip in enumerate(image_paths):
        ip_abs = Path(os.path.abspath(ip))
        rel: Optional[str] = None
        for a, b in ((ip_abs, root), (ip_abs.resolve(), root.resolve())):
            try:
                rel = a.relative_to(b).as_posix()
                break
            except ValueError:
                pass
        frame: Dict[str, Any] = {"file_path": rel if rel is not None else str(ip_abs)}
        frame.update({k: v[i] for k, v in intr.items() if k not in shared})
        frame["transform_matrix"] = c2w[i].tolist()
        frames.append(frame)
    meta.update(extra or {})
    meta["frames"] = frames
    return atomic_save_json(out, meta, indent=2, allow_nan=False)
