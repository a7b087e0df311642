"""The 2D teacher interface, its configuration and the teacher registry.

A *teacher* turns images into dense, L2-normalised D-dimensional feature maps and text
queries into unit D-vectors in the same space. Three are built in:

* ``"clip"``        - open_clip ViT, MaskCLIP-style dense patch features (:mod:`.clip`);
* ``"tiny-clip"``   - a tiny, random-initialised open_clip ViT for tests (:mod:`.tiny`);
* ``"precomputed"`` - bring-your-own feature maps read from disk (:mod:`.precomputed`).

Heavy dependencies (open_clip, timm) are imported only when a teacher is built.
"""
from __future__ import annotations

import abc
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from ..errors import ConfigError, InputFileError, NonFiniteError, ShapeError

__all__ = [
    "Teacher",
    "TeacherConfig",
    "make_teacher",
    "register_teacher",
    "available_teachers",
    "upsample_features",
    "load_image",
    "check_images",
    "resolve_device",
]

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


def upsample_features(fmap: torch.Tensor, out_size: Optional[Tuple[int, int]] = None,
                      eps: float = 1e-12) -> torch.Tensor:
    """Resize a feature map ``[h, w, D]`` to ``out_size = (H, W)`` and renormalise.

    Bilinear, ``align_corners=False`` (pixel centres, like image resizing). Each output
    vector is L2-normalised again (interpolating unit vectors shrinks them). With
    ``out_size=None`` or the same size, only the normalisation is applied. Returns
    float32. Pixels whose interpolated vector is (numerically) zero - which can only
    happen between opposite vectors - stay zero.
    """
    from .maps import prepare_map

    return prepare_map(fmap, tuple(fmap.shape[:2]) if out_size is None else out_size)


def load_image(path: PathLike) -> torch.Tensor:
    """Read an image file as a float tensor ``[1, 3, H, W]`` in ``[0, 1]`` (RGB)."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.is_file():
        raise InputFileError(path, "image file not found")
    try:
        with Image.open(path) as im:
            im.load()
            if im.mode in ("I;16", "I;16B", "I;16L", "I"):
                arr = np.asarray(im, dtype=np.float32)
                arr = arr / (65535.0 if arr.max() > 255 else 255.0)
                arr = np.repeat(arr[..., None], 3, axis=-1)
            else:
                arr = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise InputFileError(path, f"cannot read image ({type(e).__name__}: {e})") from None
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

    # -- hooks with sensible defaults -------------------------------------------------
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


# ------------------------------------------------------------------------- config
@dataclass
class TeacherConfig:
    """Everything needed to build a teacher (a field of the training / lift configs).

    Attributes:
        name: registry name: ``"clip"``, ``"tiny-clip"`` or ``"precomputed"``.
        model: open_clip architecture (``"ViT-B-16"``); ignored by "tiny-clip" / "precomputed".
        pretrained: open_clip pretrained tag (``"laion2b_s34b_b88k"``), downloaded by
            open_clip on a networked machine; ``None`` when ``checkpoint`` is given.
        checkpoint: local weights file (state dict) for ``model``; takes precedence
            over ``pretrained``.
        image_size: short side (pixels) the image is resized to before the ViT; ``None``
            = the model's native input size (224 for ViT-B-16). Both sides are rounded
            to multiples of the patch size, so the map is ``[size/patch, ...]``.
        scales: multi-scale crop pyramid (LERF-style); ``(1.0,)`` = dense map only.
            See :class:`rh3dgs.teachers.clip.ClipTeacher`.
        crop_overlap: overlap of neighbouring crops in the pyramid, in [0, 1).
        dense_path: ``"maskclip"`` (last block keeps residual + MLP, as MaskCLIP) or
            ``"value-only"`` (out_proj(v) alone).
        device: ``"auto"`` (CUDA if available), ``"cpu"``, ``"cuda:0"``...
        cache_dir: folder of the on-disk feature cache (:func:`rh3dgs.teachers.cache.extract_features`).
        features_dir: for "precomputed": folder with ``<image stem>.npy`` maps and
            ``text_embeddings.npz`` (default ``<data>/features``).
        seed: for "tiny-clip": seed of the random initialisation.
        batch_size: crops per forward pass in the pyramid.
    """

    name: str = "clip"
    model: str = "ViT-B-16"
    pretrained: Optional[str] = "laion2b_s34b_b88k"
    checkpoint: Optional[str] = None
    image_size: Optional[int] = None
    scales: Tuple[float, ...] = (1.0,)
    crop_overlap: float = 0.5
    dense_path: str = "maskclip"
    device: str = "auto"
    cache_dir: Optional[str] = None
    features_dir: Optional[str] = None
    seed: int = 0
    batch_size: int = 64

    def teacher_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments for :func:`make_teacher` for this config's ``name``."""
        clip_common = dict(image_size=self.image_size, scales=tuple(self.scales),
                           crop_overlap=self.crop_overlap, dense_path=self.dense_path,
                           device=self.device, batch_size=self.batch_size)
        if self.name == "clip":
            return dict(model=self.model, pretrained=self.pretrained, checkpoint=self.checkpoint,
                        **clip_common)
        if self.name == "tiny-clip":
            return dict(seed=self.seed, **clip_common)
        if self.name == "precomputed":
            if not self.features_dir:
                raise ConfigError("teacher 'precomputed' needs features_dir "
                                  "(the folder with <image stem>.npy feature maps)")
            return dict(features_dir=self.features_dir)
        return {}

    def setup(self) -> "Teacher":
        """Build the teacher this config describes."""
        return make_teacher(self.name, **self.teacher_kwargs())

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------------- registry
def _make_clip(**kwargs: Any) -> Teacher:
    from .clip import ClipTeacher

    return ClipTeacher(**kwargs)


def _make_tiny(**kwargs: Any) -> Teacher:
    from .tiny import TinyClipTeacher

    return TinyClipTeacher(**kwargs)


def _make_precomputed(**kwargs: Any) -> Teacher:
    from .precomputed import PrecomputedTeacher

    return PrecomputedTeacher(**kwargs)


_REGISTRY: Dict[str, Callable[..., Teacher]] = {
    "clip": _make_clip,
    "precomputed": _make_precomputed,
    "tiny-clip": _make_tiny,
}


def register_teacher(name: str, factory: Callable[..., Teacher], overwrite: bool = False) -> None:
    """Add a teacher kind: ``make_teacher(name, **kw)`` will call ``factory(**kw)``."""
    if name in _REGISTRY and not overwrite:
        raise ConfigError(f"teacher {name!r} is already registered (pass overwrite=True to replace it)")
    _REGISTRY[name] = factory


def available_teachers() -> List[str]:
    """Registered teacher names, sorted."""
    return sorted(_REGISTRY)


def make_teacher(name: str, **kwargs: Any) -> Teacher:
    """Build a teacher by registry name; unknown names raise :class:`ConfigError`.

    ``kwargs`` go to the teacher's constructor, e.g.
    ``make_teacher("clip", model="ViT-B-16", checkpoint="ViT-B-16.bin")`` or
    ``make_teacher("precomputed", features_dir="scene/features")``.
    """
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ConfigError(f"unknown teacher {name!r}; known teachers: {', '.join(available_teachers())}")
    try:
        return factory(**kwargs)
    except TypeError as e:
        if "unexpected keyword argument" in str(e) or "got an unexpected" in str(e):
            raise ConfigError(f"teacher {name!r}: {e}") from None
        raise


_PATH_KEYS = ("features_dir", "data_dir", "text_embeddings", "checkpoint", "cache_dir")


def teacher_from_spec(spec: Dict[str, Any], base: Optional[PathLike] = None) -> Teacher:
    """Build a teacher from a JSON-able spec ``{"name": ..., **kwargs}`` (as stored in a scene's
    rh3dgs.json); relative paths in path-valued keys are resolved against ``base``."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"teacher spec must be a dict with a 'name', got {spec!r}")
    kw = {k: v for k, v in spec.items() if k != "name"}
    if base is not None:
        for k in _PATH_KEYS:
            if isinstance(kw.get(k), str) and not Path(kw[k]).is_absolute():
                kw[k] = str(Path(base) / kw[k])
    return make_teacher(spec["name"], **kw)


def _stable_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
