"""Images as the cameras see them: lens undistortion and downscaling, done the nerfstudio way.

rh3dgs renders ideal pinhole cameras. Datasets written by instant-ngp, COLMAP or
``ns-process-data`` often carry OpenCV lens distortion (``k1 k2 p1 p2`` [``k3``]) and
full-resolution photos. :func:`rh3dgs.io.transforms.load_transforms` turns them into
pinhole images at the requested resolution with the functions here, exactly as nerfstudio's
splatfacto path does:

* **downscale** (nerfstudio's dataparser ``downscale_factor``): an ``images_N`` folder next to
  the images (``images/0001.jpg`` -> ``images_N/0001.jpg``, as ``ns-process-data`` writes
  them) is used when it holds every frame; otherwise the images are resized here (PIL
  bicubic, as ffmpeg's ``scale=iw/N:ih/N`` default). Sizes round down (``w // N``), the
  intrinsics scale by ``1 / N``;
* **undistort** (nerfstudio's ``full_images_datamanager._undistort_image``, perspective
  cameras): with the principal point moved to OpenCV's pixel-centre convention (``- 0.5``),
  ``newK, roi = cv2.getOptimalNewCameraMatrix(K, d, (w, h), 0)``,
  ``cv2.undistort(image, K, d, None, newK)``, the image cropped to ``roi`` and ``newK``'s
  principal point moved by the crop (and back by ``+ 0.5``). ``d = (k1, k2, p1, p2, k3)``.
  Frames whose crops differ in size (per-frame distortion) are cropped to the smallest.

The results are written once, as PNG (lossless), to a cache folder keyed by everything that
changes them (source file size and time, intrinsics, coefficients, factor), and reused.
"""
from __future__ import annotations

import collections.abc
import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import CameraFormatError, InputFileError

if TYPE_CHECKING:  # pragma: no cover
    import PIL.Image

__all__ = [
    "opencv_coefficients",
    "undistorted_intrinsics",
    "undistort_image",
    "downscale_image",
    "read_rgb",
    "open_image",
    "process_images",
    "LazyImages",
    "default_image_cache",
]

PathLike = Union[str, os.PathLike]
_VERSION = 1


def opencv_coefficients(k1: float = 0.0, k2: float = 0.0, p1: float = 0.0, p2: float = 0.0,
                        k3: float = 0.0) -> np.ndarray:
    """OpenCV's ``(k1, k2, p1, p2, k3)`` distortion vector (float64)."""
    return np.array([k1, k2, p1, p2, k3], dtype=np.float64)


def _K(fx: float, fy: float, cx: float, cy: float) -> np.ndarray:
    return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=np.float64)


def undistorted_intrinsics(K: np.ndarray, coeffs: np.ndarray, width: int, height: int
                           ) -> Tuple[np.ndarray, Tuple[int, int, int, int]]:
    """``(newK, (x, y, w, h))``: the pinhole intrinsics of the undistorted, cropped image and the crop.

    ``K`` uses rh3dgs' / nerfstudio's convention (pixel centres at ``i + 0.5``); so does
    ``newK``. With all coefficients zero: ``(K, (0, 0, width, height))``.
    """
    import cv2

    K = np.asarray(K, dtype=np.float64).copy()
    coeffs = np.asarray(coeffs, dtype=np.float64)
    if not np.any(coeffs):
        return K, (0, 0, int(width), int(height))
    K[0, 2] -= 0.5
    K[1, 2] -= 0.5
    newK, roi = cv2.getOptimalNewCameraMatrix(K, coeffs, (int(width), int(height)), 0)
    x, y, w, h = (int(v) for v in roi)
    if w <= 0 or h <= 0:
        raise ValueError(f"the distortion coefficients {coeffs.tolist()} leave no valid pixel (roi {roi})")
    newK = np.array(newK, dtype=np.float64)
    newK[0, 2] += 0.5 - x
    newK[1, 2] += 0.5 - y
    return newK, (x, y, w, h)


def undistort_image(image: np.ndarray, K: np.ndarray, coeffs: np.ndarray,
                    crop: Optional[Tuple[int, int]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Undistort an ``[H, W, C]`` (uint8 / float32) image; returns ``(image, newK)``.

    ``crop = (w, h)`` cuts the result to that size from the crop's top-left (a common size
    for frames with different distortion; never larger than the valid region).
    """
    import cv2

    h0, w0 = image.shape[:2]
    newK, (x, y, w, h) = undistorted_intrinsics(K, coeffs, w0, h0)
    if np.any(coeffs):
        Kc = np.asarray(K, dtype=np.float64).copy()
        Kc[0, 2] -= 0.5
        Kc[1, 2] -= 0.5
        Pc = newK.copy()
        Pc[0, 2] += x - 0.5
        Pc[1, 2] += y - 0.5
        image = cv2.undistort(image, Kc, np.asarray(coeffs, np.float64), None, Pc)
    if crop is not None:
        w, h = min(w, crop[0]), min(h, crop[1])
    return np.ascontiguousarray(image[y:y + h, x:x + w]), newK


def downscale_image(image: np.ndarray, factor: int) -> np.ndarray:
    """``[H, W, 3]`` uint8 -> ``[H // factor, W // factor, 3]`` (PIL bicubic, antialiased)."""
    from PIL import Image

    if factor == 1:
        return image
    h, w = image.shape[:2]
    out = Image.fromarray(image).resize((max(1, w // factor), max(1, h // factor)), Image.Resampling.BICUBIC)
    return np.asarray(out)


@contextlib.contextmanager
def open_image(path: PathLike, error: Callable[[Path, str], Exception] = InputFileError,
               undistort: bool = False) -> Iterator["PIL.Image.Image"]:
    """The PIL image of ``path`` with only its header read, once its size is known to fit: every image rh3dgs
    reads is opened here.

    PIL reads the size lazily; before any pixel is decoded, an image over PIL's decompression-bomb limit
    (``DecompressionBombError``) is refused with one ``error(path, message)`` line, and one whose decoding
    (:func:`rh3dgs.memory.image_memory_estimate`) exceeds the memory budget with a
    :class:`~rh3dgs.errors.MemoryLimitError`. A file PIL cannot open or decode (in the ``with`` body too) is
    ``error(path, "cannot read image (...)")``.

    Example::

        with open_image("images/0001.png") as im:
            rgb = np.asarray(im.convert("RGB"))
    """
    from PIL import Image, UnidentifiedImageError

    from ..memory import check_memory, image_memory_estimate

    path = Path(path)
    try:
        im = Image.open(path)
    except Image.DecompressionBombError as e:
        raise error(path, f"refused before decoding: {e}") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise error(path, f"cannot read image ({type(e).__name__}: {e})") from None
    with im:
        w, h = im.size
        check_memory(image_memory_estimate(h, w, undistort=undistort), f"{path}: decoding a {w}x{h} image",
                     knobs=["a downscaled copy of the images (--downscale N, images_N folders)"])
        try:
            yield im
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as e:
            raise error(path, f"cannot read image ({type(e).__name__}: {e})") from None


def read_rgb(path: PathLike) -> np.ndarray:
    """An image file as ``[H, W, 3]`` uint8 RGB (sized first: :func:`open_image`); :class:`InputFileError`
    naming it if unreadable."""
    with open_image(path) as im:
        return np.asarray(im.convert("RGB"))


def default_image_cache(json_path: Path) -> Path:
    """``<dataset>/.rh3dgs_cache/images`` (next to the feature cache), or, when the dataset folder is
    not writable, ``$XDG_CACHE_HOME/rh3dgs/images/<hash of the dataset path>`` (default ``~/.cache``)."""
    root = json_path.parent
    if os.access(root, os.W_OK):
        return root / ".rh3dgs_cache" / "images"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    tag = hashlib.sha256(str(json_path.resolve()).encode()).hexdigest()[:16]
    return base / "rh3dgs" / "images" / tag


def _stamp(p: Path) -> List[int]:
    st = p.stat()
    return [int(st.st_size), int(st.st_mtime_ns)]


def process_images(json_path: Path, sources: Sequence[Path], out_names: Sequence[str], Ks: Sequence[np.ndarray],
                   coeffs: Sequence[np.ndarray], factors: Sequence[int], crop: Optional[Tuple[int, int]],
                   cache: Path, progress: bool = True) -> List[Path]:
    """Downscale (``factors[i]``, 1 = as is) then undistort (``coeffs[i]`` with the downscaled ``Ks[i]``)
    every source image into ``cache``; returns the PNG paths. Up-to-date results are reused.

    ``out_names[i]`` is the output's path relative to the cache folder (keeps the image stem).
    Raises :class:`CameraFormatError` naming ``json_path`` when the cache cannot be written.
    """
    from ..progress import track
    from .atomic import atomic_save_json, atomic_save_png

    key = hashlib.sha256(json.dumps({"v": _VERSION, "json": str(json_path.resolve()), "crop": crop}).encode())
    folder = cache / key.hexdigest()[:16]
    manifest_path = folder / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
        if not isinstance(manifest, dict):
            manifest = {}
    except (OSError, ValueError):
        manifest = {}
    records: Dict[str, object] = {}
    todo: List[int] = []
    outs: List[Path] = []
    for i, src in enumerate(sources):
        rec = {"source": str(src), "stamp": _stamp(src), "K": np.round(Ks[i], 9).tolist(),
               "coeffs": np.asarray(coeffs[i]).tolist(), "factor": int(factors[i])}
        out = folder / out_names[i]
        outs.append(out)
        records[out_names[i]] = rec
        if manifest.get(out_names[i]) != rec or not out.is_file():
            todo.append(i)
    if not todo:
        return outs
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CameraFormatError(json_path, f"cannot write the undistorted / downscaled images to {folder} ({e}); "
                                           "pass another cache folder (--cache DIR, load_transforms(image_cache=...))"
                                ) from None
    for i in track(todo, description="undistorting / downscaling images", total=len(todo), disable=not progress):
        with open_image(sources[i], undistort=bool(np.any(coeffs[i]))) as im:  # sized before decoding
            img = np.asarray(im.convert("RGB"))
        img = downscale_image(img, factors[i])
        img, _ = undistort_image(img, Ks[i], coeffs[i], crop)
        outs[i].parent.mkdir(parents=True, exist_ok=True)
        atomic_save_png(outs[i], img)
    atomic_save_json(manifest_path, {**manifest, **records})
    return outs


class LazyImages(collections.abc.Sequence):
    """:func:`process_images`' results made one at a time: ``images[j]`` downscales and undistorts source ``j``
    into the cache on first access (reusing an up-to-date result), then returns its path. Same arguments as
    :func:`process_images` (without ``progress``). For readers that need few of a dataset's images, or none
    (``rh3dgs.load`` of a trained run: its cameras need no pixels).

    >>> imgs = LazyImages(json_path, sources, names, Ks, coeffs, factors, crop, cache)  # doctest: +SKIP
    >>> imgs[3]            # only image 3 is processed (once)                            # doctest: +SKIP
    PosixPath('data/fox/.rh3dgs_cache/images/4e1c.../images/0004.png')
    """

    def __init__(self, json_path: Path, sources: Sequence[Path], out_names: Sequence[str], Ks: Sequence[np.ndarray],
                 coeffs: Sequence[np.ndarray], factors: Sequence[int], crop: Optional[Tuple[int, int]],
                 cache: Path) -> None:
        self._args = (json_path, list(sources), list(out_names), list(Ks), list(coeffs), list(factors), crop, cache)
        self._done: Dict[int, Path] = {}

    def __len__(self) -> int:
        return len(self._args[1])

    def __getitem__(self, j):  # type: ignore[override]
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        j = range(len(self))[j]  # negative indices, IndexError
        if j not in self._done:
            json_path, sources, names, Ks, coeffs, factors, crop, cache = self._args
            self._done[j] = process_images(json_path, [sources[j]], [names[j]], [Ks[j]], [coeffs[j]], [factors[j]],
                                           crop, cache, progress=False)[0]
        return self._done[j]

    def __repr__(self) -> str:
        return f"LazyImages({len(self)} images, {len(self._done)} made)"
