"""The 2D teacher interface and the image helpers every teacher shares.

A *teacher* turns images into dense, L2-normalised D-dimensional feature maps and text
queries into unit D-vectors in the same space. Three are built in:

* ``"clip"``        - open_clip ViT, MaskCLIP-style dense patch features (:mod:`.clip`);
* ``"tiny-clip"``   - a tiny, random-initialised open_clip ViT for tests (:mod:`.tiny`);
* ``"precomputed"`` - bring-your-own feature maps read from disk (:mod:`.precomputed`).

Each teacher class knows how to build itself from a :class:`~rh3dgs.teachers.registry.TeacherConfig`
(:meth:`Teacher.kwargs_from_config`), how to describe its cache key (:meth:`Teacher.cache_key`)
and whether its maps are computed and cached or read in place (:meth:`Teacher.map_files`); the
registry (names -> classes) is :mod:`.registry`. This module imports none of its subclasses.

Heavy dependencies (open_clip, timm) are imported only when a teacher is built.
"""
from __future__ import annotations

import abc
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import torch

from ..errors import ConfigError, InputFileError, NonFiniteError, ShapeError

__all__ = ["Teacher", "load_image", "check_images", "resolve_device"]

PathLike = Union[str, Path]


# ------------------------------------------------------------------------- helpers
def resolve_device(device: Union[str, torch.device, None]) -> torch.device:
    """``None`` / ``"auto"`` -> CUDA when available, else CPU; anything else as given (a CUDA device this
    machine does not have raises :class:`ConfigError`)."""
    if device is None or (isinstance(device, str) and device.lower() == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"teacher device {device!r} is not a valid torch device ({e})") from None
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ConfigError(f"teacher device {device!r} is not on this machine ({torch.cuda.device_count()} CUDA "
                          "devices): set the teacher's device to 'auto' or 'cpu'")
    return dev


def load_image(path: PathLike) -> torch.Tensor:
    """Read an image file as a float tensor ``[1, 3, H, W]`` in ``[0, 1]`` (RGB)."""
    import numpy as np

    from ..io.images import open_image

    path = Path(path)
    if not path.is_file():
        raise InputFileError(path, "image file not found")
    with open_image(path) as im:  # sized from its header before decoding
        im.load()
        if im.mode in ("I;16", "I;16B", "I;16L", "I"):
            arr = np.asarray(im, dtype=np.float32)
            arr = arr / (65535.0 if arr.max() > 255 else 255.0)
            arr = np.repeat(arr[..., None], 3, axis=-1)
        else:
            arr = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1)[None].clamp_(0.0, 1.0)


def check_images(images: torch.Tensor) -> torch.Tensor:
    """Validate a batch ``[B, 3, H, W]`` (float in [0, 1] or uint8); returns float32."""
    if not isinstance(images, torch.Tensor):
        raise ShapeError(f"images must be a torch.Tensor [B, 3, H, W], got {type(images).__name__}")
    if images.ndim == 3:
        raise ShapeError(f"images must be batched [B, 3, H, W], got {tuple(images.shape)} "
                         "(add a batch dimension with images[None])")
    if images.ndim != 4 or images.shape[1] != 3:
        raise ShapeError(f"images must be [B, 3, H, W] (RGB, channels first), got {tuple(images.shape)}")
    if images.shape[0] == 0 or images.shape[2] == 0 or images.shape[3] == 0:
        raise ShapeError(f"images must be non-empty, got {tuple(images.shape)}")
    if images.dtype == torch.uint8:
        return images.float() / 255.0
    if not images.is_floating_point():
        raise ShapeError(f"images must be float in [0, 1] or uint8, got dtype {images.dtype}")
    images = images.float()
    if not bool(torch.isfinite(images).all()):
        raise NonFiniteError("images contain NaN or Inf values")
    lo, hi = float(images.min()), float(images.max())
    if lo < -1e-3 or hi > 1.0 + 1e-3:
        raise ShapeError(f"images must be float in [0, 1], got values in [{lo:.3g}, {hi:.3g}] "
                         "(divide 8-bit images by 255)")
    return images.clamp(0.0, 1.0)


# ------------------------------------------------------------------------- interface
class Teacher(abc.ABC):
    """A frozen 2D teacher: dense unit feature maps for images, unit vectors for text.

    Attributes:
        name: registry name of the teacher kind ("clip", "tiny-clip", "precomputed").
        dim: feature dimension D.
    """

    name: str = "teacher"

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """Feature dimension D."""

    @abc.abstractmethod
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` float in [0, 1] -> ``[B, h, w, D]`` unit vectors at the teacher's resolution."""

    @abc.abstractmethod
    def encode_text(self, texts: Sequence[str]) -> torch.Tensor:
        """``Q`` strings -> ``[Q, D]`` unit vectors."""

    @abc.abstractmethod
    def cache_key(self) -> str:
        """A string that changes whenever the features would (model, weights, settings)."""

    # -- building ------------------------------------------------------------------------
    @classmethod
    def kwargs_from_config(cls, config: Any, data_dir: Optional[PathLike] = None) -> Dict[str, Any]:
        """Constructor keyword arguments from a :class:`~rh3dgs.teachers.registry.TeacherConfig`
        (JSON-able: they are what a teacher spec stores); defaults that depend on the dataset are
        resolved against ``data_dir``. The base teacher takes none."""
        return {}

    # -- hooks with sensible defaults -------------------------------------------------
    def map_files(self, image_paths: Sequence[PathLike]) -> Optional[List[Path]]:
        """Files that already hold these images' maps, read in place with :meth:`features_for_path`
        (never cached), or ``None``: the maps are computed and cached
        (:func:`rh3dgs.teachers.maps.dataset_maps`). Default ``None``."""
        return None

    def features_for_path(self, image_path: PathLike) -> torch.Tensor:
        """Feature map ``[h, w, D]`` (unit, float32, CPU) of one image file."""
        return self.encode_images(load_image(image_path))[0].float().cpu()

    def entry_fingerprint(self, image_path: PathLike) -> str:
        """Extra per-image input to the on-disk cache key besides the image bytes.

        Empty for teachers that only look at the pixels; the precomputed teacher returns
        a digest of the feature file so that editing it invalidates the cache entry.
        """
        return ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.cache_key()})"


def _stable_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
