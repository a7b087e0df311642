"""File input / output: 3DGS PLY scenes, nerfstudio transforms.json cameras, atomic writes.

The semantic scene folder (:mod:`rh3dgs.io.scene`) and the ``ns-train`` run reader
(:mod:`rh3dgs.io.nerfstudio_run`) are imported explicitly (``rh3dgs.load`` uses both)."""
from __future__ import annotations

from .atomic import (
    atomic_save_bytes,
    atomic_save_json,
    atomic_save_npz,
    atomic_save_png,
    atomic_save_text,
    atomic_write,
)
from .ply import SH_REST_COUNTS, load_ply, ply_field_names, save_ply
from .transforms import load_transforms, save_transforms

__all__ = [
    "atomic_write",
    "atomic_save_bytes",
    "atomic_save_text",
    "atomic_save_json",
    "atomic_save_npz",
    "atomic_save_png",
    "load_ply",
    "save_ply",
    "ply_field_names",
    "SH_REST_COUNTS",
    "load_transforms",
    "save_transforms",
]
