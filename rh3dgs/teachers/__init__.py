"""2D teachers: dense, L2-normalised per-pixel features for images and text queries.

>>> from rh3dgs.teachers import TeacherConfig, dataset_maps, make_teacher
>>> teacher = make_teacher("clip", checkpoint="ViT-B-16-laion2b.bin")   # or "tiny-clip", "precomputed"
>>> maps = dataset_maps(teacher, image_paths, data_dir="data/scene")    # cached in data/scene/.rh3dgs_cache
>>> fmap = maps[0]                                                        # [h, w, D] unit

Rooms: :mod:`.base` (the :class:`Teacher` interface), :mod:`.clip` / :mod:`.tiny` /
:mod:`.precomputed` (the teachers), :mod:`.registry` (names -> classes, :class:`TeacherConfig`,
specs), :mod:`.cache` (the on-disk feature cache), :mod:`.maps` (map preparation and the one
provider ``dataset -> per-view maps``). open_clip is imported only when a CLIP teacher is built.
"""
from __future__ import annotations

from .base import Teacher, load_image
from .cache import extract_features, teacher_cache_dir
from .clip import ClipTeacher
from .maps import DEFAULT_CACHE_DIRNAME, DatasetMaps, dataset_maps, default_cache_dir, load_cached, upsample_features
from .precomputed import PrecomputedTeacher
from .registry import (TeacherConfig, available_teachers, make_teacher, register_teacher, spec_paths,
                       teacher_from_spec)
from .tiny import TinyClipTeacher

from . import base as _base  # noqa: E402  (isort: skip)

# The config.yml of an ns-train run made before TeacherConfig moved to .registry names it
# ``rh3dgs.teachers.base.TeacherConfig``; importing that module runs this file first, so the name resolves.
_base.TeacherConfig = TeacherConfig  # type: ignore[attr-defined]

__all__ = [
    "Teacher",
    "TeacherConfig",
    "make_teacher",
    "register_teacher",
    "teacher_from_spec",
    "spec_paths",
    "available_teachers",
    "upsample_features",
    "load_image",
    "extract_features",
    "load_cached",
    "teacher_cache_dir",
    "dataset_maps",
    "DatasetMaps",
    "default_cache_dir",
    "DEFAULT_CACHE_DIRNAME",
    "ClipTeacher",
    "TinyClipTeacher",
    "PrecomputedTeacher",
]
