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
  ``RADIAL`` (all perspective), or absent (instant-ngp). **OpenCV lens distortion**
  (``k1 k2 p1 p2 k3``, top level or per frame, or nerfstudio's ``distortion_params`` =
  ``[k1, k2, k3, k4, p1, p2]``) is removed the way nerfstudio's splatfacto path does it
  (:mod:`rh3dgs.io.images`): the returned cameras are the pinhole cameras of the
  undistorted images, which are written once to a cache folder and returned as the image
  paths. ``undistort=False`` refuses distorted files instead, naming the field. ``k4`` (a
  fisheye / rational-model term nerfstudio does not undistort either), fisheye,
  equirectangular and other non-perspective models raise :class:`CameraFormatError`.
* ``downscale=N`` (nerfstudio's ``downscale_factor``): the images of an ``images_N`` folder
  next to the images (``images/0001.jpg`` -> ``images_N/0001.jpg``, as ``ns-process-data``
  writes them) when it holds every frame, else the images resized into the cache; sizes
  ``w // N`` x ``h // N``, intrinsics divided by N (before undistortion, as nerfstudio).
* Frames whose image file is missing: one :class:`CameraFormatError` with the count and the
  first few paths, or, with ``skip_missing_images=True``, those frames are left out (one
  :class:`UserWarning` with the count).
* All frames must share one image size.
* Frames keep the file's order (nerfstudio sorts them by file name), poses are used as
  they are (nerfstudio re-orients, centres and scales them; a splat exported by
  ``ns-export`` lives in that transformed frame - see its ``dataparser_transforms.json``),
  and ``file_path`` is used as written (or its ``images_N`` copy with ``downscale=N``).
* ``transform_matrix`` is an OpenGL camera-to-world matrix (x right, y up, z backward);
  it is converted to the OpenCV world-to-camera ``viewmats`` gsplat uses (in float64,
  then stored as float32).
"""
from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..cameras import OPENGL_TO_OPENCV, Cameras
from ..errors import CameraFormatError, ConfigError, NonFiniteError, ShapeError
from ..memory import read_text_sized
from ..ranges import Range, check_fields
from .atomic import atomic_save_json

__all__ = ["load_transforms", "save_transforms", "ImageOptions", "SUPPORTED_CAMERA_MODELS"]

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


_NS_DISTORTION_ORDER = ("k1", "k2", "k3", "k4", "p1", "p2")  # nerfstudio's distortion_params


def _distortion(path: Path, levels: Sequence[Tuple[Dict[str, Any], str]]) -> Dict[str, Tuple[float, str]]:
    """Distortion coefficients -> (value, field), later ``levels`` (the frame) overriding earlier ones (the top level)."""
    out: Dict[str, Tuple[float, str]] = {}
    for meta, where in levels:
        if "distortion_params" in meta:
            dp = meta["distortion_params"]
            if not isinstance(dp, list) or len(dp) > len(_NS_DISTORTION_ORDER):
                raise CameraFormatError(path, "expected a list of up to 6 numbers [k1, k2, k3, k4, p1, p2] "
                                              "(nerfstudio's order)", field=where + "distortion_params")
            for j, v in enumerate(dp):
                fld = f"{where}distortion_params[{j}]"
                out[_NS_DISTORTION_ORDER[j]] = (_number(path, v, fld), fld)
        for key in _DISTORTION_KEYS:
            if key in meta:
                out[key] = (_number(path, meta[key], where + key), where + key)
    return out


def _coefficients(path: Path, dist: Dict[str, Tuple[float, str]], undistort: bool):
    """OpenCV (k1, k2, p1, p2, k3) of a frame; refuses k4 and, with ``undistort=False``, any distortion."""
    from .images import opencv_coefficients

    nonzero = [(k, v, f) for k, (v, f) in dist.items() if v != 0.0]
    if not nonzero:
        return opencv_coefficients()
    k, v, f = nonzero[0]
    if "k4" in {n for n, _, _ in nonzero}:
        fld = dist["k4"][1]
        raise CameraFormatError(path, f"k4 = {dist['k4'][0]:g} is a fisheye / rational-model coefficient; OpenCV's "
                                      "perspective model (k1 k2 p1 p2 k3) cannot undistort it (nerfstudio refuses it "
                                      "too). Undistort the images first (COLMAP image_undistorter) and drop the "
                                      "coefficients", field=fld)
    if not undistort:
        raise CameraFormatError(path, f"lens distortion ({k} = {v:g}) but undistort=False: rh3dgs renders pinhole "
                                      "cameras. Load with undistort=True (the default; what the rh3dgs commands do) "
                                      "or undistort the images first (COLMAP image_undistorter) and set the "
                                      "coefficients to 0", field=f)
    g = {n: val for n, (val, _) in dist.items()}
    return opencv_coefficients(g.get("k1", 0.0), g.get("k2", 0.0), g.get("p1", 0.0), g.get("p2", 0.0), g.get("k3", 0.0))


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


def _matrices_fast(frames: List[Any], maybe_bools: bool) -> Optional[np.ndarray]:
    """[V, 4, 4] float64 of every frame's transform_matrix when all are valid, else None (the per-frame
    checks then name the first problem)."""
    try:
        mats = [fr["transform_matrix"] for fr in frames]
        if maybe_bools and any(type(x) is bool or not isinstance(r, list) for m in mats for r in m for x in r):
            return None
        a = np.array(mats, dtype=np.float64)
    except (TypeError, KeyError, ValueError, OverflowError, IndexError):
        return None
    if a.shape != (len(frames), 4, 4) or not np.isfinite(a).all():
        return None
    if np.abs(a[:, 3] - np.array([0.0, 0.0, 0.0, 1.0])).max(initial=0.0) > 1e-4:
        return None
    if (np.abs(np.linalg.det(a[:, :3, :3])) < 1e-9).any():
        return None
    return a


def _read_json(path: Path) -> Any:
    return _read_json_text(path)[0]


def _read_json_text(path: Path) -> Tuple[Any, str]:
    try:
        text = read_text_sized(path, "a transforms.json", encoding="utf-8-sig")  # its size checked first
    except UnicodeDecodeError as e:
        raise CameraFormatError(path, f"not UTF-8 text (byte {e.start}); is this a JSON file?") from e
    except (OSError, ValueError) as e:  # ValueError: not a regular file
        raise CameraFormatError(path, f"cannot read file: {e}") from e
    try:
        return json.loads(text), text
    except json.JSONDecodeError as e:
        raise CameraFormatError(path, f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    except RecursionError as e:  # pragma: no cover - absurdly nested input
        raise CameraFormatError(path, "invalid JSON: nested too deeply") from e
    except ValueError as e:  # e.g. an integer literal over Python's 4300-digit limit
        raise CameraFormatError(path, f"invalid JSON: {e}") from e


@dataclass
class ImageOptions:
    """How :func:`load_transforms` turns a dataset's photos into the images the cameras see
    (the ``rh3dgs`` commands' ``--downscale`` / ``--skip-missing-images`` / ``--no-undistort``)."""

    downscale: Annotated[int, Range(ge=1)] = 1
    """Divide image sizes by this (images_N folders if present)."""
    skip_missing_images: bool = False
    """Leave out frames whose image is missing (one warning)."""
    undistort: bool = True
    """Undistort OpenCV lens distortion (off: refuse it)."""

    def __post_init__(self) -> None:
        check_fields(self)  # --downscale >= 1 (rh3dgs.ranges)


def load_transforms(path_or_dir: PathLike, check_images: bool = True, require_images: bool = True, *,
                    downscale: int = 1, skip_missing_images: bool = False, undistort: bool = True,
                    image_cache: Optional[PathLike] = None, progress: bool = True,
                    preflight: Optional[Callable[[int, int, int], None]] = None) -> Tuple[Cameras, List[Path]]:
    """Load a nerfstudio / instant-ngp ``transforms.json`` (or the folder holding one).

    Args:
        path_or_dir: the json file, or a folder containing ``transforms.json``.
        check_images: also open every image's header (cheap, PIL) and check its size
            equals ``w`` x ``h`` (``images_N``: ``w // N`` x ``h // N``). The images must exist
            either way, unless
        require_images: False, for callers that only need the cameras (a scene folder's
            transforms.json refers to the dataset's images, which may live elsewhere); nothing
            is then read or written, and the paths are the source images.
        downscale: image size divided by this (see the module doc; :class:`ImageOptions`).
        skip_missing_images: leave out frames whose image is missing (one warning) instead of raising.
        undistort: undistort OpenCV lens distortion (default) or refuse it.
        image_cache: folder for the undistorted / downscaled images (default
            :func:`rh3dgs.io.images.default_image_cache`: ``<dataset>/.rh3dgs_cache/images``).
        progress: progress bar while images are processed.
        preflight: called as ``preflight(frames, width, height)`` (the size after ``downscale``)
            right after the JSON is parsed, before any per-frame work or image access: a job's
            memory check (:mod:`rh3dgs.memory`) can stop a 100k-frame or 40000x40000 file there.

    Returns ``(cameras, image_paths)``: :class:`Cameras` (float32, CPU, OpenCV
    world-to-camera ``viewmats``, pinhole intrinsics of the returned images, names = image
    file stems) and the images, in the file's frame order: the files themselves (absolute, or
    joined to the json's folder), their ``images_N`` copies, or the processed PNGs in the cache.
    See the module doc for conventions.

    Raises :class:`CameraFormatError` naming the file and the field (e.g.
    ``frames[3].transform_matrix``) for a missing file, invalid JSON, missing keys, a
    matrix that is not 4x4, non-finite numbers, unsupported camera models or distortion,
    mixed image sizes, missing images and (``check_images``) images of the wrong size.
    """
    p = Path(path_or_dir)
    path = p / "transforms.json" if p.is_dir() else p
    if not path.is_file():
        what = "no transforms.json in this folder" if p.is_dir() else "file not found"
        raise CameraFormatError(path, what)
    if isinstance(downscale, bool) or not isinstance(downscale, int) or downscale < 1:
        raise ConfigError(f"downscale must be a whole number >= 1, got {downscale!r}")
    meta, text = _read_json_text(path)
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
    if preflight is not None:
        f0 = frames[0] if isinstance(frames[0], dict) else {}
        try:
            w0, h0 = (_size(path, f0.get(k, meta.get(k)), k) for k in ("w", "h"))
        except CameraFormatError:  # reported with its frame below
            pass
        else:
            preflight(len(frames), max(1, w0 // downscale), max(1, h0 // downscale))
    root = path.parent
    top_dist = _distortion(path, [(meta, "")])
    top_coeffs = _coefficients(path, top_dist, undistort)
    # every matrix at once (a 100k-frame file in well under a second); any problem: the per-frame path names it
    mats = _matrices_fast(frames, "true" in text or "false" in text)
    top: Dict[str, Any] = {}

    def top_value(key: str, kind: str):
        """The top-level ``key``, validated once (None when absent)."""
        if key not in top:
            if key not in meta:
                top[key] = None
            else:
                v = meta[key]
                top[key] = _size(path, v, key) if kind == "size" else _number(path, v, key, positive=kind == "pos")
        return top[key]

    c2ws: List[List[List[float]]] = []
    intr = {k: [] for k in ("fl_x", "fl_y", "cx", "cy")}
    image_paths: List[Path] = []
    coeffs = []
    size0: Optional[Tuple[int, int]] = None
    kinds = (("w", "size"), ("h", "size"), ("fl_x", "pos"), ("fl_y", "pos"), ("cx", "num"), ("cy", "num"))
    dist_keys = set(_DISTORTION_KEYS) | {"distortion_params"}
    made: Dict[str, Path] = {}
    for i, fr in enumerate(frames):
        where = f"frames[{i}]"
        if not isinstance(fr, dict):
            raise CameraFormatError(path, f"must be a JSON object, got {type(fr).__name__}", field=where)
        if "camera_model" in fr:
            _check_camera_model(path, fr, f"{where}.camera_model")
        if dist_keys.isdisjoint(fr):
            coeffs.append(top_coeffs)
        else:
            coeffs.append(_coefficients(path, _distortion(path, [(meta, ""), (fr, f"{where}.")]), undistort))
        for key in ("file_path", "transform_matrix"):
            if key not in fr:
                raise CameraFormatError(path, f"missing key '{key}'", field=f"{where}.{key}")
        fp = fr["file_path"]
        if not isinstance(fp, str) or not fp:
            raise CameraFormatError(path, "must be a non-empty string (image path relative to the json)", field=f"{where}.file_path")
        if mats is None:
            c2ws.append(_matrix(path, fr["transform_matrix"], f"{where}.transform_matrix"))

        vals: Dict[str, Any] = {}
        for key, kind in kinds:
            if key in fr:
                v = fr[key]
                fld = f"{where}.{key}"
                vals[key] = _size(path, v, fld) if kind == "size" else _number(path, v, fld, positive=kind == "pos")
            else:
                vals[key] = top_value(key, kind)
            if vals[key] is None and key in ("w", "h", "fl_x"):
                hint = ""
                if key == "fl_x" and "camera_angle_x" in meta:
                    hint = " (this looks like a Blender / NeRF-synthetic file with camera_angle_x; convert it to fl_x in pixels)"
                raise CameraFormatError(path, f"missing key '{key}' (neither in the frame nor at the top level){hint}", field=f"{where}.{key}")
        if vals["fl_y"] is None:
            vals["fl_y"] = vals["fl_x"]
        if vals["cx"] is None:
            vals["cx"] = vals["w"] / 2.0
        if vals["cy"] is None:
            vals["cy"] = vals["h"] / 2.0
        for key in intr:
            intr[key].append(vals[key])
        size = (vals["w"], vals["h"])
        if size0 is None:
            size0 = size
        elif size != size0:
            raise CameraFormatError(
                path,
                f"image size {size[0]}x{size[1]} differs from frames[0]'s {size0[0]}x{size0[1]}; "
                "mixed image sizes are not supported (split the dataset or resize the images)",
                field=f"{where}.w",
            )
        ip = made.get(fp)
        if ip is None:
            ip = made[fp] = Path(fp) if os.path.isabs(fp) else root / fp
        image_paths.append(ip)
    c2w_all = mats if mats is not None else np.asarray(c2ws, dtype=np.float64)

    # downscaled copies the nerfstudio way: <json folder>/images_N/<file name>, when every frame has one
    factor = downscale
    if downscale > 1:
        scaled = [root / f"images_{downscale}" / ip.name for ip in image_paths]
        if all(sp.is_file() for sp in scaled):
            image_paths, factor = scaled, 1
    keep = list(range(len(frames)))
    if require_images:
        exists = {ip: ip.is_file() for ip in set(image_paths)}
        missing = [i for i, ip in enumerate(image_paths) if not exists[ip]]
        if missing:
            _missing_images(path, image_paths, missing, skip_missing_images)
            gone = set(missing)
            keep = [i for i in keep if i not in gone]
    w, h = size0
    sw, sh = max(1, w // downscale), max(1, h // downscale)
    if check_images and require_images:
        _check_image_sizes(path, [image_paths[i] for i in keep], (w, h) if factor > 1 else (sw, sh), keep,
                           downscaled=factor == 1 and downscale > 1)

    from .images import undistorted_intrinsics

    s = 1.0 / downscale  # intrinsics scale with the image, as nerfstudio's rescale_output_resolution
    kept = np.asarray(keep, dtype=np.int64)
    Kall = np.zeros((len(keep), 3, 3))
    Kall[:, 0, 0] = np.asarray(intr["fl_x"])[kept] * s
    Kall[:, 1, 1] = np.asarray(intr["fl_y"])[kept] * s
    Kall[:, 0, 2] = np.asarray(intr["cx"])[kept] * s
    Kall[:, 1, 2] = np.asarray(intr["cy"])[kept] * s
    Kall[:, 2, 2] = 1.0
    Ks = list(Kall)
    co = [coeffs[i] for i in keep]
    newKs, crops = Kall.copy(), [(sw, sh)]
    memo: Dict[bytes, Tuple[np.ndarray, Tuple[int, int]]] = {}
    flags: Dict[int, bool] = {}
    for j, i in enumerate(keep):
        nz = flags.get(id(co[j]))
        if nz is None:
            nz = flags[id(co[j])] = bool(np.any(co[j]))
        if not nz:
            continue
        key = Ks[j].tobytes() + co[j].tobytes()
        if key not in memo:
            try:
                nk, roi = undistorted_intrinsics(Ks[j], co[j], sw, sh)
            except ValueError as e:
                raise CameraFormatError(path, str(e), field=f"frames[{i}]") from None
            memo[key] = (nk, roi[2:])
        newKs[j], crop = memo[key]
        crops.append(crop)
    if len(crops) > 1:
        crops = crops[1:]
    out_w, out_h = min(c[0] for c in crops), min(c[1] for c in crops)
    distorted = any(flags.values())
    if require_images and (distorted or factor > 1):
        from .images import default_image_cache, process_images

        names = []
        for i in keep:
            try:
                rel = image_paths[i].relative_to(root)
            except ValueError:
                rel = Path(f"{i:06d}") / image_paths[i].name
            names.append(str(rel.with_suffix(".png")))
        cache = Path(image_cache) if image_cache is not None else default_image_cache(path)
        processed = process_images(path, [image_paths[i] for i in keep], names, Ks, co, [factor] * len(keep),
                                   (out_w, out_h) if distorted else None, cache, progress)
        paths_out = processed
    else:
        paths_out = [image_paths[i] for i in keep]

    c2w = torch.from_numpy(np.ascontiguousarray(c2w_all[kept]))
    viewmats = torch.linalg.inv(c2w @ OPENGL_TO_OPENCV.double()).float()
    Kt = torch.from_numpy(newKs).float()
    for name, t, fld in (("transform_matrix", viewmats, "transform_matrix"), ("intrinsics", Kt, "fl_x")):
        bad = ~torch.isfinite(t).flatten(1).all(1)
        if bad.any():  # finite in the file but beyond float32 range, or an ill-conditioned pose
            i = keep[int(bad.nonzero()[0])]
            raise CameraFormatError(path, f"{name} of frame {i} is out of range (overflows float32 or is "
                                          "numerically singular)", field=f"frames[{i}].{fld}")
    cams = Cameras(viewmats=viewmats, Ks=Kt, width=out_w, height=out_h,
                   names=[image_paths[i].stem for i in keep])
    return cams, paths_out


def _missing_images(path: Path, image_paths: Sequence[Path], missing: Sequence[int], skip: bool) -> None:
    """One message for every frame whose image is missing: raise, or (``skip``) warn once."""
    listed = ", ".join(str(image_paths[i]) for i in missing[:_MAX_LISTED])
    more = f" and {len(missing) - _MAX_LISTED} more" if len(missing) > _MAX_LISTED else ""
    n, total = len(missing), len(image_paths)
    if not skip or n == total:
        hint = (f"; to use the {total - n} frames whose images exist, pass --skip-missing-images "
                "(load_transforms(skip_missing_images=True))") if n < total else ""
        raise CameraFormatError(path, f"{n} of {total} images not found: {listed}{more}{hint}",
                                field=f"frames[{missing[0]}].file_path")
    warnings.warn(f"{path}: skipping {n} of {total} frames whose images are missing: {listed}{more}",
                  UserWarning, stacklevel=3)


def _check_image_sizes(path: Path, image_paths: Sequence[Path], size: Tuple[int, int], index: Sequence[int],
                       downscaled: bool = False) -> None:
    from .images import open_image

    for i, ip in zip(index, image_paths):
        field = f"frames[{i}].file_path"
        with open_image(ip, lambda p, m: CameraFormatError(path, f"image {p}: {m}", field=field)) as im:
            actual = im.size  # the header only
        if actual != size:
            want = "w // N x h // N" if downscaled else "w x h"
            raise CameraFormatError(
                path,
                f"image {ip} is {actual[0]}x{actual[1]} but the json says {want} = {size[0]}x{size[1]}",
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
