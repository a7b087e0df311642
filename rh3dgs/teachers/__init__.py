"""2D teachers: dense, L2-normalised per-pixel features for images and text queries.

>>> from rh3dgs.teachers import make_teacher, extract_features, load_cached
>>> teacher = make_teacher("clip", checkpoint="ViT-B-16-laion2b.bin")   # or "tiny-clip", "precomputed"
>>> paths = extract_features(teacher, image_paths, cache_dir="cache/teacher")
>>> fmap = load_cached(paths[0], out_size=(H, W))                      # [H, W, D] unit

open_clip is imported only when a CLIP teacher is built.
"""
from __future__ import annotations

from .base import (
    Teacher,
    TeacherConfig,
    available_teachers,
    load_image,
    make_teacher,
    register_teacher,
    teacher_from_spec,
    upsample_features,
)
from .cache import extract_features, load_cached, teacher_cache_dir
from .clip import ClipTeacher
from .precomputed import PrecomputedTeacher
from .tiny import TinyClipTeacher

__all__ = [
    "Teacher",
    "TeacherConfig",
    "make_teacher",
    "register_teacher",
    "teacher_from_spec",
    "available_teachers",
    "upsample_features",
    "load_image",
    "extract_features",
    "load_cached",
    "teacher_cache_dir",
    "ClipTeacher",
    "TinyClipTeacher",
    "PrecomputedTeacher",
]
