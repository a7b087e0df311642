"""Building teachers: the registry (name -> teacher class), :class:`TeacherConfig` and JSON specs.

Three ways to say which teacher to build, all ending in the teacher class's constructor:

* ``make_teacher(name, **kwargs)``: by registry name;
* a *spec* ``{"name": ..., **kwargs}`` (JSON-able, stored in a scene's ``rh3dgs.json``):
  :func:`teacher_from_spec`;
* a :class:`TeacherConfig` (a field of the nerfstudio data manager's config; the CLI builds one
  from its options): :meth:`TeacherConfig.setup` / :meth:`TeacherConfig.spec`, whose keyword
  arguments each teacher class derives itself (:meth:`~rh3dgs.teachers.base.Teacher.kwargs_from_config`).

>>> from rh3dgs.teachers.registry import TeacherConfig
>>> TeacherConfig(name="precomputed", features_dir="/data/scene/features").spec()
{'name': 'precomputed', 'features_dir': '/data/scene/features'}
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Dict, List, Optional, Tuple, Union

from ..errors import ConfigError
from ..ranges import Range, check_fields, check_setting
from .base import Teacher
from .clip import ClipTeacher
from .precomputed import PrecomputedTeacher
from .tiny import TinyClipTeacher

__all__ = ["TeacherConfig", "make_teacher", "register_teacher", "available_teachers", "teacher_factory",
           "teacher_from_spec", "spec_paths"]

PathLike = Union[str, Path]

_REGISTRY: Dict[str, Callable[..., Teacher]] = {cls.name: cls for cls in (ClipTeacher, PrecomputedTeacher,
                                                                          TinyClipTeacher)}


def register_teacher(name: str, factory: Callable[..., Teacher], overwrite: bool = False) -> None:
    """Add a teacher kind: ``make_teacher(name, **kw)`` will call ``factory(**kw)``.

    ``factory`` is usually a :class:`~rh3dgs.teachers.base.Teacher` subclass (then
    :class:`TeacherConfig` builds it through its ``kwargs_from_config``); any callable works.
    """
    if name in _REGISTRY and not overwrite:
        raise ConfigError(f"teacher {name!r} is already registered (pass overwrite=True to replace it)")
    _REGISTRY[name] = factory


def available_teachers() -> List[str]:
    """Registered teacher names, sorted."""
    return sorted(_REGISTRY)


def teacher_factory(name: str) -> Callable[..., Teacher]:
    """The class (or factory) registered as ``name``; unknown names raise :class:`ConfigError`."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ConfigError(f"unknown teacher {name!r}; known teachers: {', '.join(available_teachers())}")
    return factory


def make_teacher(name: str, **kwargs: Any) -> Teacher:
    """Build a teacher by registry name; unknown names raise :class:`ConfigError`.

    ``kwargs`` go to the teacher's constructor, e.g.
    ``make_teacher("clip", model="ViT-B-16", checkpoint="ViT-B-16.bin")`` or
    ``make_teacher("precomputed", features_dir="scene/features")``.
    """
    factory = teacher_factory(name)
    try:
        teacher = factory(**kwargs)
    except TypeError as e:
        if "unexpected keyword argument" in str(e) or "got an unexpected" in str(e):
            raise ConfigError(f"teacher {name!r}: {e}") from None
        raise
    try:  # what built it: the feature cache's manifest records it, so `rh3dgs lift` can default to it
        teacher.spec = {"name": name, **kwargs}
    except AttributeError:  # pragma: no cover - a factory returning an object without a __dict__
        pass
    return teacher


_PATH_KEYS = ("features_dir", "data_dir", "text_embeddings", "checkpoint", "cache_dir")


def spec_paths(spec: Dict[str, Any]) -> List[str]:
    """The files and folders a spec names (its path-valued keys: ``features_dir``, ``checkpoint``...),
    i.e. what building its teacher reads."""
    return [v for k, v in spec.items() if k in _PATH_KEYS and isinstance(v, str) and v]


def teacher_from_spec(spec: Dict[str, Any], base: Optional[PathLike] = None) -> Teacher:
    """Build a teacher from a JSON-able spec ``{"name": ..., **kwargs}`` (as stored in a scene's
    rh3dgs.json); relative paths in path-valued keys are resolved against ``base``."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"teacher spec must be a dict with a 'name', got {spec!r}")
    kw = {k: v for k, v in spec.items() if k != "name"}
    for k, v in kw.items():  # numbers stored in a scene checked against TeacherConfig's declared ranges
        check_setting(TeacherConfig, k, v)
    if base is not None:
        for k in _PATH_KEYS:
            if isinstance(kw.get(k), str) and not Path(kw[k]).is_absolute():
                kw[k] = str(Path(base) / kw[k])
    return make_teacher(spec["name"], **kw)


@dataclass
class TeacherConfig:
    """Everything needed to build a teacher (a field of the training and lift configs)."""

    name: str = "clip"
    """Registry name: clip, tiny-clip or precomputed."""
    model: str = "ViT-B-16"
    """clip: open_clip architecture."""
    pretrained: Optional[str] = "laion2b_s34b_b88k"
    """clip: open_clip weights tag (downloaded)."""
    checkpoint: Optional[str] = None
    """clip: local weights file; takes precedence over pretrained."""
    image_size: Optional[Annotated[int, Range(ge=1)]] = None
    """clip: image short side for the ViT (None: the model's)."""
    scales: Annotated[Tuple[float, ...], Range(gt=0, min_len=1)] = (1.0,)
    """clip: crop scales of the pyramid (1.0: dense map only)."""
    crop_overlap: Annotated[float, Range(ge=0, lt=1)] = 0.5
    """clip: overlap of neighbouring crops, in [0, 1)."""
    dense_path: str = "maskclip"
    """clip: maskclip (residual + MLP kept) or value-only."""
    device: str = "auto"
    """auto (CUDA if available), cpu, cuda:0, ..."""
    cache_dir: Optional[str] = None
    """Root of the feature cache (None: DATA/.rh3dgs_cache)."""
    features_dir: Optional[str] = None
    """precomputed: folder of the .npy maps (None: DATA/features)."""
    seed: int = 0
    """tiny-clip: seed of the random initialisation."""
    batch_size: Annotated[int, Range(ge=1)] = 64
    """clip: crops per forward pass."""

    def __post_init__(self) -> None:
        check_fields(self)  # every numeric field against its declared Range (rh3dgs.ranges)

    def teacher_kwargs(self, data_dir: Optional[PathLike] = None) -> Dict[str, Any]:
        """Keyword arguments for :func:`make_teacher` for this config's ``name`` (defaults that
        depend on the dataset resolved against ``data_dir``); ``{}`` for a factory that is not a
        :class:`~rh3dgs.teachers.base.Teacher` class."""
        derive = getattr(teacher_factory(self.name), "kwargs_from_config", None)
        return derive(self, data_dir) if derive is not None else {}

    def spec(self, data_dir: Optional[PathLike] = None) -> Dict[str, Any]:
        """The JSON-able spec ``{"name": ..., **kwargs}`` (:func:`teacher_from_spec` builds it back)."""
        return {"name": self.name, **self.teacher_kwargs(data_dir)}

    def setup(self, data_dir: Optional[PathLike] = None) -> Teacher:
        """Build the teacher this config describes."""
        return make_teacher(self.name, **self.teacher_kwargs(data_dir))

    @classmethod
    def from_spec(cls, spec: Dict[str, Any], **changes: Any) -> "TeacherConfig":
        """The config whose :meth:`spec` is ``spec`` (the keys that are this config's fields; ``changes`` on top)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in spec.items() if k in names}
        return cls(**{**kw, **changes})

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)
