"""``"precomputed"``: bring-your-own teacher features (any model, any resolution).

Layout (``features_dir`` defaults to ``<data>/features``)::

    features/
        <image stem>.npy          # [h, w, D] float array (float16/32/64), any h, w
        <image stem>.npz          #   ... or an .npz holding one array (or one named "features")
        <image stem>.pt           #   ... or a torch tensor saved with torch.save
        text_embeddings.npz       # optional: {query string: [D] vector}

Maps are looked up by the image file's stem (``images/frame_001.jpg`` ->
``features/frame_001.npy``; ``.npy`` wins over ``.npz`` over ``.pt``). Vectors need not be
unit: every map is L2-normalised per pixel, and bilinear upsampling to the image size is
followed by a second normalisation. Every problem raises
:class:`~rh3dgs.errors.FeatureFormatError` naming the file (and the field / pixel).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ConfigError, FeatureFormatError
from ..io.npy import check_torch_zip, load_npy, load_npz, npz_headers
from .base import Teacher, check_images
from .maps import upsample_features

__all__ = ["PrecomputedTeacher", "read_feature_file", "validate_feature_map", "FEATURE_SUFFIXES",
           "TEXT_EMBEDDINGS_NAME"]

FEATURE_SUFFIXES = (".npy", ".npz", ".pt")
TEXT_EMBEDDINGS_NAME = "text_embeddings.npz"
_ZERO_NORM = 1e-8

PathLike = Union[str, Path]


def _as_numpy(obj, path: Path, field: Optional[str] = None) -> np.ndarray:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy()
    if isinstance(obj, np.ndarray):
        return obj
    raise FeatureFormatError(path, f"expected an array / tensor, found {type(obj).__name__}", field=field)


def _map_bytes(shape, dtype) -> int:
    from ..memory import feature_map_bytes

    return feature_map_bytes(shape, dtype.itemsize)


def read_feature_file(path: PathLike) -> np.ndarray:
    """Read one feature array from ``.npy`` / ``.npz`` (one array) / ``.pt``; no validation of values.

    Sized before it is read (:mod:`rh3dgs.io.npy`): the ``.npy`` header, each ``.npz`` member's header (before
    it is decompressed), the records of a ``.pt`` (and their CRC-32), against the memory budget.
    """
    path = Path(path)
    if not path.is_file():
        raise FeatureFormatError(path, "feature file not found")
    suffix = path.suffix.lower()
    what = "feature map"
    if suffix == ".npy":
        return load_npy(path, FeatureFormatError, what, _map_bytes)
    if suffix == ".npz":
        return _read_npz_map(path)
    if suffix != ".pt":
        raise FeatureFormatError(path, f"unsupported feature file type {suffix!r}; use one of {FEATURE_SUFFIXES}")
    check_torch_zip(path, FeatureFormatError, "feature file", factor=3)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # pickle errors of torch.load and the like
        raise FeatureFormatError(path, f"unreadable or corrupt feature file ({type(e).__name__}: {e})") from None
    if isinstance(obj, dict):
        tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if len(tensors) == 1:
            obj = next(iter(tensors.values()))
        elif "features" in tensors:
            obj = tensors["features"]
        else:
            raise FeatureFormatError(path, "a .pt feature file must hold one tensor (or a dict with one "
                                           f"tensor / a 'features' tensor), found keys {list(obj)[:8]}")
    return _as_numpy(obj, path)


def _read_npz_map(path: Path) -> np.ndarray:
    """The one array (or the one named ``features``) of an ``.npz`` feature file, only that member read."""
    try:
        keys = list(npz_headers(path))
    except Exception:  # noqa: BLE001 - zip / header damage: load_npz names it below
        keys = None
    if keys is not None and len(keys) != 1 and "features" not in keys:
        raise FeatureFormatError(path, f"an .npz feature file must hold exactly one array (or one named "
                                       f"'features'), found {len(keys)}: {', '.join(keys[:8])}")
    member = None if keys is None else (keys if len(keys) == 1 else ["features"])
    arrays = load_npz(path, FeatureFormatError, "feature map", members=member, bytes_for=_map_bytes)
    return next(iter(arrays.values()))


def _first_index(mask: np.ndarray) -> Tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def validate_feature_map(arr: np.ndarray, path: PathLike, dim: Optional[int] = None,
                         dim_source: Optional[PathLike] = None) -> np.ndarray:
    """Check an ``[h, w, D]`` map (numeric, finite, no zero vectors, D == ``dim``); returns float32."""
    path = Path(path)
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "fiu":
        kind = getattr(arr, "dtype", type(arr).__name__)
        raise FeatureFormatError(path, f"feature map must be a float array, got {kind}", field="dtype")
    if arr.ndim != 3:
        raise FeatureFormatError(path, f"feature map must have 3 dimensions [h, w, D], got shape {arr.shape} "
                                       f"(ndim {arr.ndim})", field="shape")
    if min(arr.shape) == 0:
        raise FeatureFormatError(path, f"feature map is empty: shape {arr.shape}", field="shape")
    if dim is not None and arr.shape[-1] != dim:
        src = f" (from {dim_source})" if dim_source is not None else ""
        raise FeatureFormatError(path, f"feature dimension D={arr.shape[-1]} does not match D={dim}{src}; "
                                       "all feature maps and text embeddings must share D", field="shape")
    arr = arr.astype(np.float32, copy=False)
    finite = np.isfinite(arr)
    if not finite.all():
        bad = ~finite.all(axis=-1)
        y, x = _first_index(bad)
        raise FeatureFormatError(path, f"{int((~finite).sum())} non-finite values (NaN/Inf) in "
                                       f"{int(bad.sum())} pixels, first at pixel (y={y}, x={x})", field="values")
    norms = np.sqrt(np.square(arr, dtype=np.float64).sum(axis=-1))  # float64: no overflow near 1e38
    zero = norms < _ZERO_NORM
    if zero.any():
        y, x = _first_index(zero)
        raise FeatureFormatError(path, f"{int(zero.sum())} zero-norm feature vectors (cannot be normalised), "
                                       f"first at pixel (y={y}, x={x})", field="values")
    return arr


class PrecomputedTeacher(Teacher):
    """Feature maps computed elsewhere, read from ``features_dir``.

    Args:
        features_dir: folder with the maps; default ``<data_dir>/features``.
        data_dir: scene folder (only used to default ``features_dir``).
        text_embeddings: path of the query -> vector ``.npz``; default
            ``<features_dir>/text_embeddings.npz``.
    """

    name = "precomputed"

    def __init__(self, features_dir: Optional[PathLike] = None, data_dir: Optional[PathLike] = None,
                 text_embeddings: Optional[PathLike] = None) -> None:
        if features_dir is None:
            if data_dir is None:
                raise ConfigError("precomputed teacher: give features_dir (or data_dir with a features/ folder)")
            features_dir = Path(data_dir) / "features"
        self.features_dir = Path(features_dir).expanduser()
        if not self.features_dir.is_dir():
            raise FeatureFormatError(self.features_dir, "features folder not found (expected <image stem>.npy "
                                                        "feature maps [h, w, D] in it)")
        self.text_path = (Path(text_embeddings).expanduser() if text_embeddings is not None
                          else self.features_dir / TEXT_EMBEDDINGS_NAME)
        self._dim: Optional[int] = None
        self._dim_source: Optional[Path] = None
        self._text: Optional[Dict[str, np.ndarray]] = None

    # ------------------------------------------------------------------ building
    @classmethod
    def kwargs_from_config(cls, config: Any, data_dir: Optional[PathLike] = None) -> Dict[str, Any]:
        """``features_dir`` (default ``<data_dir>/features``), as an absolute path."""
        features_dir = config.features_dir or (Path(data_dir) / "features" if data_dir is not None else None)
        if not features_dir:
            raise ConfigError("teacher 'precomputed' needs features_dir "
                              "(the folder with <image stem>.npy feature maps)")
        return dict(features_dir=str(Path(features_dir).expanduser().resolve()))

    def map_files(self, image_paths: Sequence[PathLike]) -> List[Path]:
        """The feature file of every image (the maps are read in place, never cached). Two different images
        whose names lead to one file (``a/0001.png`` and ``b/0001.png`` -> ``0001.npy``) are refused: they
        would silently share one map."""
        files = [self.feature_path(p) for p in image_paths]
        first: Dict[Path, Path] = {}
        for image, f in zip(image_paths, files):
            other = first.setdefault(f, Path(image))
            if os.path.abspath(other) != os.path.abspath(image):
                raise FeatureFormatError(f, f"is the feature map of two different images, {other} and {image} "
                                            "(maps are found by image name): give the images distinct names")
        return files

    # ------------------------------------------------------------------ lookup
    def feature_path(self, stem_or_path: PathLike) -> Path:
        """The feature file for an image (its stem), or the file itself when given one."""
        p = Path(stem_or_path)
        if p.suffix.lower() in FEATURE_SUFFIXES and p.is_file():
            return p
        stems = [p.name, p.stem] if p.suffix else [p.name]  # "a.b" may be a stem with a dot
        for stem in stems:
            for suffix in FEATURE_SUFFIXES:
                cand = self.features_dir / f"{stem}{suffix}"
                if cand.is_file():
                    return cand
        stem = stems[-1]
        raise FeatureFormatError(self.features_dir / f"{stem}.npy",
                                 f"no feature map for image {stem!r} (looked for {stem}.npy / .npz / .pt "
                                 f"in {self.features_dir})")

    def _note_dim(self, d: int, source: Path) -> None:
        if self._dim is None:
            self._dim, self._dim_source = int(d), source

    def load_feature_map(self, stem_or_path: PathLike) -> torch.Tensor:
        """The validated map ``[h, w, D]`` of an image (stem, image path or feature file), unit float32."""
        path = self.feature_path(stem_or_path)
        arr = validate_feature_map(read_feature_file(path), path, self._dim, self._dim_source)
        self._note_dim(arr.shape[-1], path)
        # normalise in float64: the squared norm of float32 vectors near 1e38 overflows float32
        return F.normalize(torch.from_numpy(np.ascontiguousarray(arr)).double(), dim=-1).float()

    def features_for(self, image_path: PathLike, out_size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """Map of ``image_path`` bilinearly resized to ``out_size = (H, W)`` and renormalised."""
        return upsample_features(self.load_feature_map(image_path), out_size)

    def features_for_path(self, image_path: PathLike) -> torch.Tensor:
        return self.load_feature_map(image_path)

    def entry_fingerprint(self, image_path: PathLike) -> str:
        path = self.feature_path(image_path)
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return f"{path.name}:{h.hexdigest()}"

    # ------------------------------------------------------------------ interface
    @property
    def dim(self) -> int:
        if self._dim is None:
            if self.text_path.is_file():
                self._load_text()
            else:
                files = sorted(p for p in self.features_dir.iterdir()
                               if p.suffix.lower() in FEATURE_SUFFIXES and p.name != TEXT_EMBEDDINGS_NAME)
                if not files:
                    raise FeatureFormatError(self.features_dir, "no feature maps (*.npy / *.npz / *.pt) found")
                self.load_feature_map(files[0])
        assert self._dim is not None
        return self._dim

    def cache_key(self) -> str:
        return f"precomputed:{self.features_dir.resolve()}"

    def encode_images(self, images: torch.Tensor, names: Optional[Sequence[PathLike]] = None) -> torch.Tensor:
        """Maps of the images called ``names`` (the pixels are only used for their count).

        The precomputed teacher cannot compute features from pixels: pass the image
        names / paths (or use :meth:`features_for` / :meth:`load_feature_map`). Returns
        ``[B, h, w, D]`` at the maps' own resolution; maps of different sizes are resized
        to the first one's and renormalised.
        """
        if names is None:
            raise ConfigError("the precomputed teacher reads features by image name: call "
                              "encode_images(images, names=[...]) or features_for(image_path, out_size)")
        names = list(names)
        if isinstance(images, torch.Tensor) and images.ndim == 4 and images.shape[0] != len(names):
            check_images(images)
            raise ConfigError(f"encode_images: {images.shape[0]} images but {len(names)} names")
        maps = [self.load_feature_map(n) for n in names]
        if not maps:
            return torch.zeros(0, 1, 1, self.dim)
        size = tuple(maps[0].shape[:2])
        return torch.stack([m if tuple(m.shape[:2]) == size else upsample_features(m, size) for m in maps])

    def _load_text(self) -> Dict[str, np.ndarray]:
        if self._text is not None:
            return self._text
        path = self.text_path
        if not path.is_file():
            raise FeatureFormatError(path, "text embeddings file not found: create an .npz mapping each query "
                                           "string to its D-vector (np.savez(path, **{'red mug': vec, ...}))")
        raw = load_npz(path, FeatureFormatError, "text embeddings")  # each member sized before it is read
        if not raw:
            raise FeatureFormatError(path, "text embeddings file holds no queries")
        text: Dict[str, np.ndarray] = {}
        for key, vec in raw.items():
            if not isinstance(vec, np.ndarray):  # a zip member that is not an .npy array
                raise FeatureFormatError(path, f"expected an .npy array, found {type(vec).__name__}", field=key)
            if vec.dtype.kind not in "fiu":
                raise FeatureFormatError(path, f"embedding must be numeric, got dtype {vec.dtype}", field=key)
            vec = np.asarray(vec, dtype=np.float32)
            if vec.ndim == 2 and vec.shape[0] == 1:
                vec = vec[0]
            if vec.ndim != 1 or vec.size == 0:
                raise FeatureFormatError(path, f"embedding must be a [D] vector, got shape {vec.shape}", field=key)
            dim = self._dim if self._dim is not None else next(iter(text.values())).shape[0] if text else None
            if dim is not None and vec.shape[0] != dim:
                src = self._dim_source if self._dim is not None else path
                raise FeatureFormatError(path, f"embedding has D={vec.shape[0]} but D={dim} (from {src})", field=key)
            if not np.isfinite(vec).all():
                raise FeatureFormatError(path, "embedding contains NaN/Inf", field=key)
            n = float(np.linalg.norm(vec.astype(np.float64)))
            if n < _ZERO_NORM:
                raise FeatureFormatError(path, "embedding has zero norm", field=key)
            text[key] = (vec.astype(np.float64) / n).astype(np.float32)
        self._note_dim(next(iter(text.values())).shape[0], path)
        self._text = text
        return text

    def text_queries(self) -> List[str]:
        """The query strings available in the text embeddings file."""
        return list(self._load_text())

    def encode_text(self, texts: Sequence[str]) -> torch.Tensor:
        """Look the queries up in ``text_embeddings.npz`` -> ``[Q, D]`` unit float32."""
        if isinstance(texts, str):
            texts = [texts]
        table = self._load_text()
        out = []
        for q in texts:
            if q not in table:
                keys = list(table)
                shown = ", ".join(repr(k) for k in keys[:5]) + (", ..." if len(keys) > 5 else "")
                raise FeatureFormatError(self.text_path, f"no embedding for query {q!r}; available "
                                                         f"({len(keys)}): {shown}", field=q)
            out.append(torch.from_numpy(table[q].copy()))
        if not out:
            return torch.zeros(0, self.dim)
        return torch.stack(out)
