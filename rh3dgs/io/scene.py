"""The semantic scene folder, and one reader for every file ``rh3dgs.load`` accepts.

A *semantic scene folder* (written by :func:`save_scene`, ``rh3dgs lift`` and the demo)::

    semantic.ply      3DGS PLY (INRIA layout) with the latents as sem_0..sem_{d-1} (float32, see rh3dgs.io.ply)
    field.npz         decoder [D, d]; optional valid [N] (bool: has a feature), filled [N] (bool: filled from
                      3D neighbours, not observed) and text embeddings
                      (text_names [T] strings, text_vectors [T, D])
    rh3dgs.json       {"format": "rh3dgs-scene", "version": 1, "ply", "field", "transforms",
                       "teacher": {"name": ..., **kwargs} | null, "info": {...},
                       "files": {name: {"bytes": n, "sha256": hex}}}: written last
    transforms.json   (optional) cameras

The folder is written beside the old one and swapped in by one rename
(:func:`rh3dgs.io.atomic.atomic_folder`): a failure at any byte (a full disk, a kill) leaves the old
scene whole. ``files`` records the size and sha256 of every file the scene names; reading checks them
first, so a file changed since it was written (flipped bytes, a hand edit, another tool's rewrite) is
one line naming it, not a silently different scene. A scene whose ``version`` is newer than this reader
(:data:`SCENE_VERSION`) is refused.

:func:`read_scene` opens that folder, its ``rh3dgs.json``, a plain 3DGS PLY (with the
``transforms.json`` beside it, if any) or an ``ns-train rh3dgs`` run's ``config.yml``
(:mod:`rh3dgs.io.nerfstudio_run`) and returns the parts as :class:`SceneData`. Every file is
checked against the others (shapes, finiteness, names) and a bad one raises
:class:`rh3dgs.errors.InputFileError` naming the file and field. Nothing is built from
the teacher spec: :attr:`SceneData.teacher` is the spec as stored, for the caller to build
when (and only when) a text query needs it (``rh3dgs.load`` does that lazily).

>>> save_scene("out/scene", gaussians, field, cameras, image_paths, teacher={"name": "precomputed", ...})
>>> data = read_scene("out/scene")      # SceneData(gaussians, decoder, valid, filled, cameras, text_embeddings, teacher, ...)
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from ..cameras import Cameras
from ..errors import InputFileError
from ..gaussians import Gaussians
from ..memory import read_text_sized
from .atomic import file_sha256
from .npy import load_npz

__all__ = ["SceneData", "save_scene", "read_scene", "read_scene_folder", "SCENE_FORMAT", "SCENE_VERSION"]

PathLike = Union[str, os.PathLike]

#: value of rh3dgs.json's "format"
SCENE_FORMAT = "rh3dgs-scene"
#: the newest rh3dgs.json "version" this code reads (and the one it writes)
SCENE_VERSION = 1


@dataclass
class SceneData:
    """The parts of a stored scene (N Gaussians, teacher dim D, latent dim d).

    gaussians: with ``latents`` [N, d] when the scene has a semantic field.
    decoder: [D, d] (None without a field); valid: bool [N] or None (every Gaussian valid); filled: bool [N] or None.
    cameras: or None. text_embeddings: phrase -> [D] stored with the scene.
    teacher: the teacher spec ``{"name": ..., **kwargs}`` as stored (None: none named);
        relative paths in it are relative to ``source.parent``.
    source: the file that describes the scene (rh3dgs.json, config.yml, or the PLY): errors about
        the teacher name it. path: what the user opened (the folder for a scene folder).
    """

    gaussians: Gaussians
    decoder: Optional[Tensor] = None
    valid: Optional[Tensor] = None
    filled: Optional[Tensor] = None
    cameras: Optional[Cameras] = None
    text_embeddings: Dict[str, Tensor] = field(default_factory=dict)
    teacher: Optional[Dict[str, Any]] = None
    source: Optional[Path] = None
    path: Optional[Path] = None


# ------------------------------------------------------------------------- writing
def save_scene(folder: PathLike, gaussians: Gaussians, field=None, cameras: Optional[Cameras] = None,
               image_paths: Optional[Sequence] = None, teacher: Optional[dict] = None,
               text_embeddings: Optional[Dict[str, Tensor]] = None, info: Optional[dict] = None,
               latent_dtype: str = "float32") -> Path:
    """Write a semantic scene folder (see the module docstring): built beside ``folder`` and swapped in by
    one rename, so an existing scene there is replaced whole or not at all; returns ``Path(folder)``.

    ``field``: a :class:`rh3dgs.field.SemanticField` (latents [N, d], decoder [D, d], valid [N] or None).
    The latents go to semantic.ply as float32 by default (``latent_dtype``; the compact
    rh3dgs-only "float16" rounds them, relative error <= 2^-11; see :mod:`rh3dgs.io.ply`).
    """
    from .atomic import atomic_folder, atomic_save_json, atomic_save_npz
    from .ply import save_ply
    from .transforms import save_transforms

    final = Path(folder)
    with atomic_folder(final) as out:
        g = gaussians
        if field is not None:
            g = Gaussians(g.means, g.scales, g.quats, g.opacities, g.sh0, g.shN, field.latents, dict(g.extra))
            arrays = {"decoder": field.decoder.detach().cpu().numpy()}
            if field.valid is not None:
                arrays["valid"] = field.valid.cpu().numpy()
            if field.filled is not None:
                arrays["filled"] = field.filled.cpu().numpy()
            if text_embeddings:
                names = sorted(text_embeddings)
                arrays["text_names"] = np.array(names)
                arrays["text_vectors"] = torch.stack([torch.as_tensor(text_embeddings[k]).float() for k in names]).numpy()
            atomic_save_npz(out / "field.npz", arrays)
        save_ply(out / "semantic.ply", g, latent_dtype=latent_dtype)
        meta = {"format": SCENE_FORMAT, "version": SCENE_VERSION, "ply": "semantic.ply",
                "field": "field.npz" if field else None, "teacher": teacher or None, "info": info or {}}
        if cameras is not None:
            if image_paths is None:
                image_paths = [final / "images" / f"{n}.png"
                               for n in (cameras.names or [f"frame_{i:05d}" for i in range(len(cameras))])]
            # paths inside the scene folder are written relative to it: as seen from the folder being built
            inside = [_rebase(Path(p), final, out) for p in image_paths]
            save_transforms(out / "transforms.json", cameras, inside)
            meta["transforms"] = "transforms.json"
        meta["files"] = {meta[k]: _file_record(out / meta[k]) for k in ("ply", "field", "transforms") if meta.get(k)}
        atomic_save_json(out / "rh3dgs.json", meta)
    return final


def _rebase(p: Path, old: Path, new: Path) -> Path:
    """``p`` under ``new`` where it lies under ``old`` (compared as absolute paths), else ``p``."""
    try:
        return new / Path(os.path.abspath(p)).relative_to(os.path.abspath(old))
    except ValueError:
        return p


def _file_record(path: Path) -> Dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


def _check_files(meta_path: Path, meta: dict) -> None:
    """Every file the scene names (``ply``, ``field``, ``transforms``) has the size and sha256 rh3dgs.json's
    ``files`` records for it (scenes written before the records existed have none: nothing to check)."""
    files = meta.get("files")
    if files is None:
        return
    if not isinstance(files, dict):
        raise InputFileError(meta_path, f"must be an object of file records, got {json.dumps(files)[:60]}",
                             field="files")
    for key in ("ply", "field", "transforms"):
        name = meta.get(key)
        rec = files.get(name) if isinstance(name, str) else None
        if rec is None:
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("sha256"), str) or type(rec.get("bytes")) is not int:
            raise InputFileError(meta_path, f"has a malformed record for {name!r}", field="files")
        path = meta_path.parent / name
        try:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):  # never hash a device or a FIFO (it would not end)
                raise InputFileError(path, "is not a regular file")
            digest = file_sha256(path) if st.st_size == rec["bytes"] else None
        except (OSError, ValueError) as exc:
            raise InputFileError(path, f"cannot be read ({exc})") from None
        if digest != rec["sha256"]:
            what = (f"{st.st_size} bytes, rh3dgs.json records {rec['bytes']}" if digest is None
                    else f"sha256 {digest[:12]}..., rh3dgs.json records {rec['sha256'][:12]}...")
            raise InputFileError(path, f"changed since rh3dgs wrote the scene ({what}): damaged, edited or "
                                       "rewritten by another tool; re-create the scene (rh3dgs lift) or restore it")


# ------------------------------------------------------------------------- reading
def read_scene(path: PathLike, device: Union[str, torch.device] = "cpu") -> SceneData:
    """A semantic scene folder, its rh3dgs.json, a 3DGS PLY, or an ``ns-train rh3dgs`` config.yml.

    Raises :class:`rh3dgs.errors.InputFileError` (or a subclass: ``PlyFormatError``,
    ``CameraFormatError``...) naming the file and field when it is none of these, or when
    one of the scene's files is missing, corrupt, or inconsistent with the others.
    """
    p = Path(path)
    try:
        exists = p.exists()
    except (OSError, ValueError) as exc:
        raise InputFileError(p, f"cannot be accessed ({exc})") from None
    if not exists:
        raise InputFileError(p, "does not exist (expected a semantic scene folder, its rh3dgs.json, or a 3DGS .ply)")
    if p.is_file() and p.suffix.lower() in (".yml", ".yaml"):
        from .nerfstudio_run import load_nerfstudio_scene

        g, decoder, cams, spec = load_nerfstudio_scene(p, device=device)
        return SceneData(g, decoder.to(g.latents), None, None, cams, {}, spec or None, source=p, path=p)
    from .ply import SPLAT_SUFFIXES

    if p.is_file() and p.suffix.lower() in SPLAT_SUFFIXES:  # INRIA / compressed PLY, SPZ
        return _read_plain_ply(p, device)
    return read_scene_folder(p, device)


def _read_plain_ply(p: Path, device) -> SceneData:
    """A 3DGS PLY without a field (RGB only), with the cameras of a transforms.json beside it."""
    from .ply import load_ply
    from .transforms import load_transforms

    g = load_ply(p, device=device)
    if g.latents is not None:
        raise InputFileError(p, "has sem_* latents but no decoder: open the scene folder (with field.npz) instead")
    cams = None
    tj = p.parent / "transforms.json"
    if tj.exists():
        cams, _ = load_transforms(tj, check_images=False, require_images=False)
    return SceneData(g, cameras=cams, source=p, path=p)


def read_scene_folder(path: PathLike, device: Union[str, torch.device] = "cpu") -> SceneData:
    """The semantic scene folder ``path`` (or the folder of the file ``path``, e.g. its rh3dgs.json)."""
    from .ply import load_ply
    from .transforms import load_transforms

    p = Path(path)
    folder = p.parent if p.is_file() else p
    meta_path = folder / "rh3dgs.json"
    if not meta_path.is_file():
        raise InputFileError(p, "is not an rh3dgs scene: no rh3dgs.json (expected a folder written by `rh3dgs lift` or "
                                "`rh3dgs demo`, or a 3DGS .ply file); an interrupted `rh3dgs lift` leaves none: re-run it")
    meta = _read_meta(meta_path)
    ply_path = _scene_file(meta_path, meta, "ply", "semantic.ply", required=True)
    field_path = _scene_file(meta_path, meta, "field")
    transforms_path = _scene_file(meta_path, meta, "transforms")
    _check_files(meta_path, meta)
    g = load_ply(ply_path, device=device)
    data = SceneData(g, source=meta_path, path=folder)
    if field_path is not None:
        _read_field(field_path, ply_path, data, device)
    if transforms_path is not None:
        data.cameras, _ = load_transforms(transforms_path, check_images=False, require_images=False)
    data.teacher = _teacher_spec(meta_path, meta.get("teacher"))
    return data


def _read_meta(meta_path: Path) -> dict:
    try:
        meta = json.loads(read_text_sized(meta_path, "a scene description"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # JSONDecodeError, int digit limit
        raise InputFileError(meta_path, f"is not valid JSON ({exc})") from None
    except OSError as exc:
        raise InputFileError(meta_path, f"cannot be read ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != SCENE_FORMAT:
        raise InputFileError(meta_path, "is not an rh3dgs scene description", field="format")
    version = meta.get("version", 1)
    if type(version) is not int or version < 1:
        raise InputFileError(meta_path, f"must be a positive integer, got {json.dumps(version)[:40]}", field="version")
    if version > SCENE_VERSION:
        raise InputFileError(meta_path, f"scene format version {version} was written by a newer rh3dgs (this one "
                                        f"reads up to {SCENE_VERSION}): open it with that version", field="version")
    return meta


def _teacher_spec(meta_path: Path, spec: Any) -> Optional[Dict[str, Any]]:
    """rh3dgs.json's "teacher": null / {} (none) or {"name": <str>, **kwargs}; checked, not built."""
    if spec is None or spec == {}:
        return None
    if not isinstance(spec, dict):
        raise InputFileError(meta_path, f"must be an object {{\"name\": ...}} or null, got {json.dumps(spec)[:60]}",
                             field="teacher")
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise InputFileError(meta_path, f"needs a teacher \"name\" (a non-empty string), got "
                                        f"{json.dumps(spec.get('name'))[:60]}", field="teacher")
    return spec


def _scene_file(meta_path: Path, meta: dict, key: str, default: Optional[str] = None, required: bool = False):
    """The file named by ``meta[key]`` (a non-empty relative or absolute path string), or None."""
    v = meta.get(key, default)
    if v is None and not required:
        return None
    if not isinstance(v, str) or not v or "\x00" in v:
        raise InputFileError(meta_path, f"must be a file name (a non-empty string), got {json.dumps(v)[:60]}", field=key)
    path = meta_path.parent / v
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # the scene's description names it: say so, with the path
        raise InputFileError(meta_path, f"names {path}, which does not exist", field=key) from None
    except (OSError, ValueError) as exc:  # e.g. ENAMETOOLONG
        raise InputFileError(meta_path, f"names a path that cannot be opened ({exc})"[:200], field=key) from None
    return path


def _read_field(fpath: Path, ply_path: Path, data: SceneData, device) -> None:
    """field.npz -> ``data.decoder``, ``data.valid``, ``data.text_embeddings``, checked against the PLY."""
    g = data.gaussians
    arrays = _read_npz(fpath)
    if "decoder" not in arrays:
        raise InputFileError(fpath, "has no 'decoder' array", field="decoder")
    if g.latents is None:
        raise InputFileError(ply_path, "has no sem_* latents but the scene has a field")
    dec_np = _field_array(fpath, arrays, "decoder", 2)
    if dec_np.shape[1] != g.latents.shape[1] or dec_np.shape[0] == 0:
        raise InputFileError(fpath, f"decoder shape {list(dec_np.shape)} does not match "
                                    f"{g.latents.shape[1]} latents", field="decoder")
    data.decoder = torch.from_numpy(dec_np.astype(np.float32)).to(device)
    if "valid" in arrays:
        v = _field_array(fpath, arrays, "valid", 1, kinds="biu")
        if v.shape[0] != len(g):
            raise InputFileError(fpath, f"has {v.shape[0]} entries for {len(g)} Gaussians", field="valid")
        data.valid = torch.from_numpy(v.astype(bool)).to(device)
    if "filled" in arrays:
        v = _field_array(fpath, arrays, "filled", 1, kinds="biu")
        if v.shape[0] != len(g):
            raise InputFileError(fpath, f"has {v.shape[0]} entries for {len(g)} Gaussians", field="filled")
        data.filled = torch.from_numpy(v.astype(bool)).to(device)
    if ("text_names" in arrays) != ("text_vectors" in arrays):
        raise InputFileError(fpath, "text_names and text_vectors must be stored together", field="text_names")
    if "text_names" in arrays:
        names = _field_array(fpath, arrays, "text_names", 1, kinds="U")
        vecs = _field_array(fpath, arrays, "text_vectors", 2)
        if vecs.shape != (names.shape[0], dec_np.shape[0]):
            raise InputFileError(fpath, f"shape {list(vecs.shape)} does not match {names.shape[0]} names "
                                        f"x D={dec_np.shape[0]}", field="text_vectors")
        data.text_embeddings = {str(n): torch.from_numpy(v) for n, v in zip(names, vecs.astype(np.float32))}


def _read_npz(fpath: Path) -> Dict[str, np.ndarray]:
    """Every array of an .npz, each member's size checked from its header first (rh3dgs.io.npy); any
    corruption -> InputFileError naming the file."""
    return load_npz(fpath, InputFileError, "scene field")


def _field_array(fpath: Path, arrays: Dict[str, np.ndarray], key: str, ndim: int, kinds: str = "fiu") -> np.ndarray:
    a = arrays[key]
    if not isinstance(a, np.ndarray) or a.dtype.kind not in kinds or a.ndim != ndim:
        raise InputFileError(fpath, f"must be a {ndim}-D {'numeric' if kinds != 'U' else 'string'} array, got "
                                    f"{getattr(a, 'dtype', type(a).__name__)} of shape {getattr(a, 'shape', None)}",
                             field=key)
    if kinds != "U" and a.dtype.kind == "f" and not np.isfinite(a).all():
        raise InputFileError(fpath, f"{int((~np.isfinite(a)).sum())} non-finite values (NaN/Inf)", field=key)
    return a
