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

__all__ = ["load_transforms", "load_posed_images", "PosedImages", "save_transforms", "ImageOptions",
           "nerfstudio_downscale", "SUPPORTED_CAMERA_MODELS"]

PathLike = Union[str, os.PathLike]

SUPPORTED_CAMERA_MODELS = ("PINHOLE", "SIMPLE_PINHOLE", "OPENCV", "SIMPLE_RADIAL", "RADIAL")
_DISTORTION_KEYS = ("k1", "k2", "k3", "k4", "p1", "p2")
_MAX_LISTED = 5
SKIP_MISSING_HINT = "--skip-missing-images (load_transforms(skip_missing_images=True))"
"""How the missing-image error names the option that leaves those frames out (the rh3dgs commands')."""


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


@dataclass
class PosedImages:
    """A dataset's cameras and the images they see (:func:`load_posed_images`).

    ``cameras[j]`` sees ``images[j]``, made from ``sources[j]``; ``frames[j]`` is its index in the file's
    ``frames`` list (frames whose image is missing are left out with ``skip_missing_images``).
    """

    cameras: Cameras
    images: Sequence[Path]
    """The images as the cameras see them: the files themselves, their ``images_N`` copies, or the
    undistorted / downscaled PNGs in the cache (with ``lazy=True``, each one made on first access)."""
    frames: List[int]
    sources: List[Path]
    """The files the images are made from (the frame's ``file_path``, or its ``images_N`` copy)."""


@dataclass
class _Frames:
    """Every frame of a transforms.json, validated (V frames)."""

    c2w: np.ndarray
    """[V, 4, 4] float64 camera-to-world, OpenGL axes."""
    intrinsics: Dict[str, np.ndarray]
    """``fl_x fl_y cx cy`` -> [V] float64, at the file's resolution."""
    coeffs: List[np.ndarray]
    """OpenCV ``(k1, k2, p1, p2, k3)`` of each frame (zeros: none)."""
    images: List[Path]
    """The frames' ``file_path``, joined to the json's folder."""
    size: Tuple[int, int]
    """(w, h) shared by every frame."""


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
    See the module doc for conventions; :func:`load_posed_images` also says which frame each
    camera is.

    Raises :class:`CameraFormatError` naming the file and the field (e.g.
    ``frames[3].transform_matrix``) for a missing file, invalid JSON, missing keys, a
    matrix that is not 4x4, non-finite numbers, unsupported camera models or distortion,
    mixed image sizes, missing images and (``check_images``) images of the wrong size.

    >>> cams, images = load_transforms("data/fox", downscale=8, skip_missing_images=True)  # doctest: +SKIP
    >>> cams.width, cams.height, len(images)                                                 # doctest: +SKIP
    (134, 239, 50)
    """
    posed = load_posed_images(path_or_dir, check_images, require_images, downscale=downscale,
                              skip_missing_images=skip_missing_images, undistort=undistort, image_cache=image_cache,
                              progress=progress, preflight=preflight)
    return posed.cameras, list(posed.images)


def load_posed_images(path_or_dir: PathLike, check_images: bool = True, require_images: bool = True, *,
                      downscale: int = 1, skip_missing_images: bool = False, undistort: bool = True,
                      image_cache: Optional[PathLike] = None, progress: bool = True,
                      preflight: Optional[Callable[[int, int, int], None]] = None,
                      lazy: bool = False, missing_hint: str = SKIP_MISSING_HINT) -> PosedImages:
    """:func:`load_transforms` (same arguments) as a :class:`PosedImages`: also the frame index and the
    source file of every camera. ``lazy=True``: the images are undistorted / downscaled into the cache
    one at a time, on first access to ``images[j]`` (and then reused), not all before returning.
    ``missing_hint``: how the missing-image error names the option that leaves those frames out.

    The steps, in order::

        path, meta = _read_file(path_or_dir)                  # JSON, top-level keys, camera_model
        preflight(frames, w // downscale, h // downscale)     # a job's memory check, before any per-frame work
        frames = _parse_frames(path, meta, undistort)         # poses, intrinsics, distortion, image paths
        sources, factor = _scaled_sources(frames, downscale)  # images_N copies when complete, else resize (factor)
        keep = _present_frames(sources, skip_missing_images)  # frames whose image exists
        _check_image_sizes(sources[keep])                     # headers only
        Ks, pinhole_Ks, size = _pinhole_intrinsics(frames, keep, downscale)  # scaled, then undistorted
        images = _processed_images(...)                       # undistorted / resized PNGs in the cache
        cameras = _cameras(frames.c2w[keep], pinhole_Ks, size)
    """
    if isinstance(downscale, bool) or not isinstance(downscale, int) or downscale < 1:
        raise ConfigError(f"downscale must be a whole number >= 1, got {downscale!r}")
    path, meta, text = _read_file(path_or_dir)
    if preflight is not None:
        _run_preflight(path, meta, downscale, preflight)
    frames = _parse_frames(path, meta, text, undistort)
    sources, factor = _scaled_sources(path.parent, frames.images, downscale)
    keep = list(range(len(sources)))
    if require_images:
        keep = _present_frames(path, sources, skip_missing_images, missing_hint)
        if check_images:
            w, h = frames.size
            size = (w, h) if factor > 1 else (max(1, w // downscale), max(1, h // downscale))
            _check_image_sizes(path, [sources[i] for i in keep], size, keep,
                               downscaled=factor == 1 and downscale > 1)
    Ks, pinhole_Ks, out_size, distorted = _pinhole_intrinsics(path, frames, keep, downscale)
    kept_sources = [sources[i] for i in keep]
    images: Sequence[Path] = kept_sources
    if require_images and (distorted or factor > 1):
        images = _processed_images(path, kept_sources, keep, Ks, [frames.coeffs[i] for i in keep], factor,
                                   out_size if distorted else None, image_cache, progress, lazy)
    cameras = _cameras(path, frames.c2w, keep, pinhole_Ks, out_size, [frames.images[i].stem for i in keep])
    return PosedImages(cameras, images, keep, kept_sources)


def _read_file(path_or_dir: PathLike) -> Tuple[Path, Dict[str, Any], str]:
    """The transforms.json ``path_or_dir`` names, parsed: ``(path, meta, text)``; a non-empty ``frames`` list and a
    supported top-level ``camera_model`` checked."""
    p = Path(path_or_dir)
    path = p / "transforms.json" if p.is_dir() else p
    if not path.is_file():
        what = "no transforms.json in this folder" if p.is_dir() else "file not found"
        raise CameraFormatError(path, what)
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
    return path, meta, text


def _run_preflight(path: Path, meta: Dict[str, Any], downscale: int,
                   preflight: Callable[[int, int, int], None]) -> None:
    """``preflight(frames, w, h)`` with frame 0's size after ``downscale`` (a bad size is reported later,
    with its frame)."""
    frames = meta["frames"]
    f0 = frames[0] if isinstance(frames[0], dict) else {}
    try:
        w0, h0 = (_size(path, f0.get(k, meta.get(k)), k) for k in ("w", "h"))
    except CameraFormatError:
        return
    preflight(len(frames), max(1, w0 // downscale), max(1, h0 // downscale))


_INTRINSIC_KINDS = (("w", "size"), ("h", "size"), ("fl_x", "pos"), ("fl_y", "pos"), ("cx", "num"), ("cy", "num"))
_DISTORTION_FIELDS = frozenset(_DISTORTION_KEYS) | {"distortion_params"}


def _parse_frames(path: Path, meta: Dict[str, Any], text: str, undistort: bool) -> _Frames:
    """Every frame validated: pose, intrinsics (frame value over top-level value), distortion, image path."""
    frames = meta["frames"]
    top_coeffs = _coefficients(path, _distortion(path, [(meta, "")]), undistort)
    # every matrix at once (a 100k-frame file in well under a second); any problem: the per-frame path names it
    mats = _matrices_fast(frames, "true" in text or "false" in text)
    top: Dict[str, Any] = {}
    c2ws: List[List[List[float]]] = []
    intr: Dict[str, List[float]] = {k: [] for k in ("fl_x", "fl_y", "cx", "cy")}
    images: List[Path] = []
    coeffs: List[np.ndarray] = []
    size0: Optional[Tuple[int, int]] = None
    joined: Dict[str, Path] = {}
    for i, fr in enumerate(frames):
        where = f"frames[{i}]"
        if not isinstance(fr, dict):
            raise CameraFormatError(path, f"must be a JSON object, got {type(fr).__name__}", field=where)
        if "camera_model" in fr:
            _check_camera_model(path, fr, f"{where}.camera_model")
        if _DISTORTION_FIELDS.isdisjoint(fr):
            coeffs.append(top_coeffs)
        else:
            coeffs.append(_coefficients(path, _distortion(path, [(meta, ""), (fr, f"{where}.")]), undistort))
        for key in ("file_path", "transform_matrix"):
            if key not in fr:
                raise CameraFormatError(path, f"missing key '{key}'", field=f"{where}.{key}")
        fp = fr["file_path"]
        if not isinstance(fp, str) or not fp:
            raise CameraFormatError(path, "must be a non-empty string (image path relative to the json)",
                                    field=f"{where}.file_path")
        if mats is None:
            c2ws.append(_matrix(path, fr["transform_matrix"], f"{where}.transform_matrix"))
        vals = _frame_intrinsics(path, meta, fr, where, top)
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
        ip = joined.get(fp)
        if ip is None:
            ip = joined[fp] = Path(fp) if os.path.isabs(fp) else path.parent / fp
        images.append(ip)
    assert size0 is not None
    c2w = mats if mats is not None else np.asarray(c2ws, dtype=np.float64)
    return _Frames(c2w, {k: np.asarray(v, dtype=np.float64) for k, v in intr.items()}, coeffs, images, size0)


def _frame_intrinsics(path: Path, meta: Dict[str, Any], fr: Dict[str, Any], where: str,
                      top: Dict[str, Any]) -> Dict[str, Any]:
    """``w h fl_x fl_y cx cy`` of one frame: its own value, else the top level's (validated once, kept in
    ``top``); ``fl_y`` defaults to ``fl_x``, ``cx`` / ``cy`` to the image centre."""
    vals: Dict[str, Any] = {}
    for key, kind in _INTRINSIC_KINDS:
        if key in fr:
            vals[key] = _typed(path, fr[key], f"{where}.{key}", kind)
        else:
            if key not in top:
                top[key] = _typed(path, meta[key], key, kind) if key in meta else None
            vals[key] = top[key]
        if vals[key] is None and key in ("w", "h", "fl_x"):
            hint = ""
            if key == "fl_x" and "camera_angle_x" in meta:
                hint = " (this looks like a Blender / NeRF-synthetic file with camera_angle_x; convert it to fl_x in pixels)"
            raise CameraFormatError(path, f"missing key '{key}' (neither in the frame nor at the top level){hint}",
                                    field=f"{where}.{key}")
    if vals["fl_y"] is None:
        vals["fl_y"] = vals["fl_x"]
    if vals["cx"] is None:
        vals["cx"] = vals["w"] / 2.0
    if vals["cy"] is None:
        vals["cy"] = vals["h"] / 2.0
    return vals


def _typed(path: Path, v: Any, field: str, kind: str):
    """An intrinsic value: ``size`` (whole pixels), ``pos`` (> 0) or ``num``."""
    return _size(path, v, field) if kind == "size" else _number(path, v, field, positive=kind == "pos")


def _scaled_sources(root: Path, images: List[Path], downscale: int) -> Tuple[List[Path], int]:
    """The files to read and the factor still to apply: the ``images_N`` copies the nerfstudio way
    (``<json folder>/images_N/<file name>``) with factor 1 when every frame has one, else the images and
    ``downscale`` (resized into the cache)."""
    if downscale > 1:
        scaled = [root / f"images_{downscale}" / ip.name for ip in images]
        if all(sp.is_file() for sp in scaled):
            return scaled, 1
    return images, downscale


def _present_frames(path: Path, sources: List[Path], skip_missing_images: bool, hint: str) -> List[int]:
    """Indices of the frames whose image exists; missing ones raise, or are left out with a warning."""
    exists = {ip: ip.is_file() for ip in set(sources)}
    missing = [i for i, ip in enumerate(sources) if not exists[ip]]
    if missing:
        _missing_images(path, sources, missing, skip_missing_images, hint)
    gone = set(missing)
    return [i for i in range(len(sources)) if i not in gone]


def _pinhole_intrinsics(path: Path, frames: _Frames, keep: List[int], downscale: int):
    """``(Ks, pinhole_Ks, (w, h), distorted)`` of the kept frames: ``Ks`` [V, 3, 3] scaled by ``1 / downscale``
    (as nerfstudio's ``rescale_output_resolution``), ``pinhole_Ks`` those of the undistorted, cropped images
    (:func:`rh3dgs.io.images.undistorted_intrinsics`, once per distinct camera), and the size every image is
    cropped to (the smallest valid region)."""
    from .images import undistorted_intrinsics

    w, h = frames.size
    sw, sh = max(1, w // downscale), max(1, h // downscale)
    s = 1.0 / downscale
    kept = np.asarray(keep, dtype=np.int64)
    Ks = np.zeros((len(keep), 3, 3))
    Ks[:, 0, 0] = frames.intrinsics["fl_x"][kept] * s
    Ks[:, 1, 1] = frames.intrinsics["fl_y"][kept] * s
    Ks[:, 0, 2] = frames.intrinsics["cx"][kept] * s
    Ks[:, 1, 2] = frames.intrinsics["cy"][kept] * s
    Ks[:, 2, 2] = 1.0
    pinhole, crops = Ks.copy(), []
    memo: Dict[bytes, Tuple[np.ndarray, Tuple[int, int]]] = {}
    for j, i in enumerate(keep):
        co = frames.coeffs[i]
        if not np.any(co):
            continue
        key = Ks[j].tobytes() + co.tobytes()
        if key not in memo:
            try:
                nk, roi = undistorted_intrinsics(Ks[j], co, sw, sh)
            except ValueError as e:
                raise CameraFormatError(path, str(e), field=f"frames[{i}]") from None
            memo[key] = (nk, roi[2:])
        pinhole[j], crop = memo[key]
        crops.append(crop)
    if not crops:
        return Ks, pinhole, (sw, sh), False
    return Ks, pinhole, (min(c[0] for c in crops), min(c[1] for c in crops)), True


def _processed_images(path: Path, sources: List[Path], keep: List[int], Ks: np.ndarray, coeffs: List[np.ndarray],
                      factor: int, crop: Optional[Tuple[int, int]], image_cache: Optional[PathLike],
                      progress: bool, lazy: bool) -> Sequence[Path]:
    """The sources downscaled by ``factor`` and undistorted into the cache (:func:`rh3dgs.io.images.process_images`),
    named by their path under the json's folder (``images/0001.jpg`` -> ``images/0001.png``)."""
    from .images import LazyImages, default_image_cache, process_images

    root = path.parent
    names = []
    for i, src in zip(keep, sources):
        try:
            rel = src.relative_to(root)
        except ValueError:
            rel = Path(f"{i:06d}") / src.name
        names.append(str(rel.with_suffix(".png")))
    cache = Path(image_cache) if image_cache is not None else default_image_cache(path)
    args = (path, sources, names, list(Ks), coeffs, [factor] * len(sources), crop, cache)
    return LazyImages(*args) if lazy else process_images(*args, progress)


def _cameras(path: Path, c2w_all: np.ndarray, keep: List[int], Ks: np.ndarray, size: Tuple[int, int],
             names: List[str]) -> Cameras:
    """:class:`Cameras` of the kept frames: OpenGL camera-to-world -> OpenCV world-to-camera (float64, then float32)."""
    kept = np.asarray(keep, dtype=np.int64)
    c2w = torch.from_numpy(np.ascontiguousarray(c2w_all[kept]))
    viewmats = torch.linalg.inv(c2w @ OPENGL_TO_OPENCV.double()).float()
    Kt = torch.from_numpy(Ks).float()
    for name, t, fld in (("transform_matrix", viewmats, "transform_matrix"), ("intrinsics", Kt, "fl_x")):
        bad = ~torch.isfinite(t).flatten(1).all(1)
        if bad.any():  # finite in the file but beyond float32 range, or an ill-conditioned pose
            i = keep[int(bad.nonzero()[0])]
            raise CameraFormatError(path, f"{name} of frame {i} is out of range (overflows float32 or is "
                                          "numerically singular)", field=f"frames[{i}].{fld}")
    return Cameras(viewmats=viewmats, Ks=Kt, width=size[0], height=size[1], names=names)


NERFSTUDIO_MAX_AUTO_RESOLUTION = 1600
"""nerfstudio 1.1.5's ``MAX_AUTO_RESOLUTION`` (its data parser's automatic downscale)."""


def nerfstudio_downscale(path_or_dir: PathLike, downscale_factor: Optional[int] = None) -> int:
    """The factor ``ns-train``'s data parser uses: ``downscale_factor`` when given, else nerfstudio 1.1.5's
    automatic one: halve while the image's larger side is over 1600 px and an ``images_2^k`` copy of the
    first frame exists (never resizing itself). ``rh3dgs``'s data parser and ``rh3dgs.load(config.yml)`` use it,
    so a run's cameras are at the resolution it trained at.

    >>> nerfstudio_downscale("data/fox"), nerfstudio_downscale("data/fox", 8)     # doctest: +SKIP
    (1, 8)
    """
    path, meta, _ = _read_file(path_or_dir)
    if downscale_factor is not None:
        if isinstance(downscale_factor, bool) or not isinstance(downscale_factor, int) or downscale_factor < 1:
            raise CameraFormatError(path, f"downscale factor must be a whole number >= 1, got {downscale_factor!r}")
        return downscale_factor
    f0 = meta["frames"][0] if isinstance(meta["frames"][0], dict) else {}
    size = [f0.get(k, meta.get(k)) for k in ("w", "h")]
    if not all(_is_number(v) for v in size):
        return 1  # the frame's problem is named where its size is read
    name = Path(str(f0.get("file_path", ""))).name
    max_res, df = max(size), 0
    while max_res / 2 ** df > NERFSTUDIO_MAX_AUTO_RESOLUTION and \
            (path.parent / f"images_{2 ** (df + 1)}" / name).exists():
        df += 1
    return 2 ** df


def _missing_images(path: Path, image_paths: Sequence[Path], missing: Sequence[int], skip: bool,
                    hint: str = "") -> None:
    """One message for every frame whose image is missing: raise, or (``skip``) warn once."""
    listed = ", ".join(str(image_paths[i]) for i in missing[:_MAX_LISTED])
    more = f" and {len(missing) - _MAX_LISTED} more" if len(missing) > _MAX_LISTED else ""
    n, total = len(missing), len(image_paths)
    if not skip or n == total:
        hint = f"; to use the {total - n} frames whose images exist, pass {hint}" if n < total else ""
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
