"""On-disk, incremental cache of teacher feature maps.

Layout::

    <cache_dir>/<teacher name>-<sha256(cache_key)[:16]>/
        manifest.json        # {"format": 1, "teacher_key": ..., "entries": {entry: {...}}}
        <entry>.npy          # float16 [h, w, D], unit vectors at the teacher's resolution

``entry`` is the sha256 of the image file's bytes (combined with
``teacher.entry_fingerprint(image)`` when that is non-empty, e.g. the precomputed
teacher's feature file digest), so renaming / moving images keeps their entries and
editing an image recomputes only that image; identical images share one entry.

One keying rule for every entry point: the image is the one the teacher sees, and ``rh3dgs extract``,
``rh3dgs lift`` and the ``ns-train rh3dgs`` data manager all get it from
:func:`rh3dgs.io.transforms.load_posed_images` with the same dataset options (downscale, missing images,
undistortion): the dataset's own file, its ``images_N`` copy, or the undistorted / resized PNG in
``<cache>/images`` (written once, byte-identical for every reader). So on a distorted, downscaled capture
the three read and write the same entries: whichever runs first computes, the others reuse.

Every ``.npy`` is written atomically and its sha256, size, shape and dtype are recorded in the
manifest. An entry is used only when its file exists and matches the recorded checksum, size and
array header (shape ``[h, w, D]`` with the teacher's D); anything else (truncated / corrupt / edited
file, file without manifest record after a crash) is recomputed. A manifest of a newer cache format
is refused (one line), never overwritten. The manifest is rewritten atomically (merged with what is
on disk, so concurrent runs lose at most some records, which are then recomputed).

Data-parallel extraction (``extract_features(..., distributed=True)`` inside an initialised
``torch.distributed`` process group, e.g. ``torchrun --nproc_per_node=K -m rh3dgs.cli extract``):
the ranks hash the images and verify the cached entries in shards, agree on the list of
missing entries, and rank ``r`` computes ``missing[r::K]`` - distinct entries, so no file is
ever written by two ranks. The shared ``manifest.json`` is written by rank 0 only, after a
barrier; while working, rank ``r`` journals its new records in its own
``manifest.rank<r>.json`` (atomic, periodic), which readers merge into the manifest, so a
killed distributed run keeps what it computed. Rank 0 folds the journals into the manifest
and deletes them at the end.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..errors import FeatureFormatError, InputFileError, NonFiniteError, ShapeError
from ..io.npy import NPY_READ_ERRORS, load_npy, npy_header
from ..io.atomic import atomic_save_bytes, atomic_save_json, file_sha256
from ..memory import read_text_sized
from ..progress import track
from .base import Teacher

__all__ = ["extract_features", "read_stored_map", "teacher_cache_dir", "cached_teachers", "file_sha256",
           "MANIFEST_NAME"]

MANIFEST_NAME = "manifest.json"
_PART_GLOB = "manifest.rank*.json"  # per-rank journals of a distributed run
_FORMAT = 1
_MANIFEST_EVERY_S = 5.0

PathLike = Union[str, Path]


def teacher_cache_dir(teacher: Teacher, cache_dir: PathLike) -> Path:
    """The sub-folder of ``cache_dir`` holding ``teacher``'s entries."""
    key = teacher.cache_key()
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(teacher.name)).strip("-") or "teacher"
    return Path(cache_dir) / f"{safe}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _read_records(path: Path, key: str) -> Dict[str, Dict[str, Any]]:
    try:
        data = json.loads(read_text_sized(path, "a cache manifest"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return {}  # absent or unreadable: every entry will be verified / recomputed
    version = data.get("format") if isinstance(data, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > _FORMAT:
        raise FeatureFormatError(path, f"written by a newer rh3dgs (cache format {version}; this version reads "
                                       f"{_FORMAT}): use that version, or another --cache folder", field="format")
    if not isinstance(data, dict) or version != _FORMAT or data.get("teacher_key") != key:
        return {}
    entries = data.get("entries")
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if isinstance(v, dict)}


def _part_files(folder: Path) -> List[Path]:
    return sorted(folder.glob(_PART_GLOB))


def _read_manifest(folder: Path, key: str) -> Dict[str, Dict[str, Any]]:
    """The manifest's records merged with those of distributed runs' per-rank journals."""
    records = _read_records(folder / MANIFEST_NAME, key)
    for part in _part_files(folder):
        records.update(_read_records(part, key))
    return records


def _manifest_payload(teacher: Teacher, entries: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    settings = teacher.settings() if hasattr(teacher, "settings") else {}
    return {"format": _FORMAT, "teacher_key": teacher.cache_key(), "teacher": teacher.name, "dim": teacher.dim,
            "settings": settings, "spec": getattr(teacher, "spec", None), "entries": dict(sorted(entries.items()))}


def _manifest_spec(folder: Path) -> Optional[Dict[str, Any]]:
    try:
        data = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data.get("spec") if isinstance(data, dict) else None


def cached_teachers(cache_dir: PathLike) -> List[Tuple[Dict[str, Any], Path]]:
    """``(spec, folder)`` of every teacher with entries under ``cache_dir``, the most recently written first: the
    spec its manifest records (:func:`rh3dgs.teachers.make_teacher` builds it back). What ``rh3dgs lift`` uses by
    default: the teacher the data's cache already holds."""
    found = []
    for manifest in Path(cache_dir).glob(f"*/{MANIFEST_NAME}"):
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
            stamp = manifest.stat().st_mtime_ns
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        spec = data.get("spec") if isinstance(data, dict) else None
        if isinstance(spec, dict) and isinstance(spec.get("name"), str) and data.get("entries"):
            found.append((stamp, spec, manifest.parent))
    return [(spec, folder) for _, spec, folder in sorted(found, key=lambda x: -x[0])]


def _write_manifest(folder: Path, teacher: Teacher, entries: Dict[str, Dict[str, Any]],
                    absorb_parts: bool = False) -> None:
    """Merge ``entries`` into the manifest on disk (atomic rewrite). With ``absorb_parts``, the
    per-rank journals merged into it are deleted afterwards (only when no distributed run writes)."""
    parts = _part_files(folder) if absorb_parts else []
    merged = _read_manifest(folder, teacher.cache_key())
    merged.update(entries)
    atomic_save_json(folder / MANIFEST_NAME, _manifest_payload(teacher, merged))
    for part in parts:
        part.unlink(missing_ok=True)


def _part_path(folder: Path, rank: int) -> Path:
    return folder / f"manifest.rank{rank}.json"


def _entry_valid(folder: Path, record: Optional[Dict[str, Any]], entry: str, dim: Optional[int] = None) -> bool:
    """The entry's file is what its manifest record vouches for: the size, the array header (shape [h, w, dim]
    and dtype as recorded) and the sha256 of its bytes."""
    if not record:
        return False
    path = folder / f"{entry}.npy"
    try:
        if path.stat().st_size != int(record.get("bytes", -1)):
            return False
        with open(path, "rb") as f:
            shape, dtype = npy_header(f)
        if list(shape) != record.get("shape") or dtype.name != record.get("dtype") or len(shape) != 3 \
                or (dim is not None and shape[-1] != dim):
            return False
        return file_sha256(path) == record.get("sha256")
    except NPY_READ_ERRORS:
        return False


def _entry_key(teacher: Teacher, image: Path) -> str:
    digest = file_sha256(image)
    extra = teacher.entry_fingerprint(image)
    if extra:
        digest = hashlib.sha256(f"{digest}|{extra}".encode()).hexdigest()
    return digest


def _encode_entry(fmap: torch.Tensor, image: Path, dim: int) -> Tuple[bytes, Tuple[int, ...]]:
    if not isinstance(fmap, torch.Tensor) or fmap.ndim != 3 or fmap.shape[-1] != dim or min(fmap.shape) == 0:
        shape = tuple(fmap.shape) if isinstance(fmap, torch.Tensor) else type(fmap).__name__
        raise ShapeError(f"teacher returned a feature map of shape {shape} for {image}; expected [h, w, {dim}]")
    arr = fmap.detach().float().cpu().numpy()
    if not np.isfinite(arr).all():
        raise NonFiniteError(f"teacher returned NaN/Inf features for {image}")
    buf = io.BytesIO()
    np.save(buf, arr.astype(np.float16), allow_pickle=False)
    return buf.getvalue(), arr.shape


def _map_sharded(fn, items: Sequence[Any], rank: int, world: int) -> List[Any]:
    """``[fn(x) for x in items]``, rank ``r`` computing ``items[r::world]`` (collective when world > 1)."""
    if world == 1:
        return [fn(x) for x in items]
    from ..distributed import all_gather_object

    shards = all_gather_object([fn(x) for x in items[rank::world]])
    out: List[Any] = [None] * len(items)
    for r, shard in enumerate(shards):
        out[r::world] = shard
    return out


def extract_features(teacher: Teacher, image_paths: Sequence[PathLike], cache_dir: PathLike,
                     progress: bool = True, *, stats: Optional[Dict[str, Any]] = None,
                     distributed: bool = False) -> List[Path]:
    """Compute (or reuse) the teacher's feature map of every image; returns one ``.npy`` path per image.

    Args:
        teacher: any :class:`~rh3dgs.teachers.base.Teacher` (``features_for_path`` is called
            once per missing entry).
        image_paths: image files, in the order of the returned list.
        cache_dir: root folder of the cache (created if missing).
        progress: show a progress bar (:func:`rh3dgs.progress.track`; rank 0 only when distributed).
        stats: optional dict filled with ``computed``, ``reused``, ``invalid`` (entries
            found corrupt / unrecorded and recomputed) and ``images``; when distributed these
            are totals over the ranks, plus ``world_size``, ``rank`` and ``computed_by_rank``.
        distributed: shard the work over the ranks of the initialised default
            ``torch.distributed`` process group (see the module docstring). Collective: every
            rank must call it with the same arguments; every rank gets the full list of paths.

    Only entries that are missing or fail their checksum are computed. Load the results
    with :func:`rh3dgs.teachers.maps.load_cached` (or let :func:`rh3dgs.teachers.maps.dataset_maps`
    do both).
    """
    images = [Path(p) for p in image_paths]
    for p in images:
        if not p.is_file():
            raise InputFileError(p, "image file not found")
    if distributed:
        from ..distributed import rank_world

        rank, world = rank_world()
    else:
        rank, world = 0, 1
    folder = teacher_cache_dir(teacher, cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    key = teacher.cache_key()
    manifest = _read_manifest(folder, key)  # distributed: nothing is written before the plan is agreed

    entries = _map_sharded(lambda p: _entry_key(teacher, p), images, rank, world)
    first_image: Dict[str, Path] = {}
    for e, p in zip(entries, images):
        first_image.setdefault(e, p)

    unique = list(first_image)
    valid = _map_sharded(lambda e: _entry_valid(folder, manifest.get(e), e, teacher.dim), unique, rank, world)
    todo: List[str] = []
    invalid = 0
    for e, ok in zip(unique, valid):
        if ok:
            continue
        if e in manifest or (folder / f"{e}.npy").exists():
            invalid += 1
        todo.append(e)
    mine = todo[rank::world]  # identical `todo` on every rank: disjoint shards

    # a journal left by a killed run under the same rank number is carried over, not overwritten
    carried = _read_records(_part_path(folder, rank), key) if world > 1 else {}

    def journal(records: Dict[str, Dict[str, Any]], final: bool = False) -> None:
        if world == 1:
            _write_manifest(folder, teacher, records, absorb_parts=final)
        else:  # only this rank writes its journal
            atomic_save_json(_part_path(folder, rank), _manifest_payload(teacher, {**carried, **records}))

    new_records: Dict[str, Dict[str, Any]] = {}
    last_write = time.monotonic()
    desc = f"{teacher.name} features" + (f" (rank 0 of {world})" if world > 1 else "")
    try:
        for e in track(mine, description=desc, total=len(mine), disable=not progress or rank != 0):
            image = first_image[e]
            data, shape = _encode_entry(teacher.features_for_path(image), image, teacher.dim)
            atomic_save_bytes(folder / f"{e}.npy", data)
            new_records[e] = {"file": f"{e}.npy", "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                              "shape": list(shape), "dtype": "float16", "source": str(image)}
            if time.monotonic() - last_write > _MANIFEST_EVERY_S:
                journal(new_records)
                last_write = time.monotonic()
    finally:
        if new_records:
            journal(new_records, final=True)
        elif world == 1 and unique and _manifest_spec(folder) != getattr(teacher, "spec", None):
            _write_manifest(folder, teacher, {})  # a manifest of an older rh3dgs: record what built the teacher

    computed_by_rank = [len(mine)]
    if world > 1:
        from ..distributed import all_gather_object, barrier

        computed_by_rank = all_gather_object(len(mine))  # also the barrier: every journal is written
        if rank == 0 and (any(computed_by_rank) or _part_files(folder)):
            _write_manifest(folder, teacher, {}, absorb_parts=True)
        barrier()  # the manifest is complete before any rank returns

    if stats is not None:
        stats.update(images=len(images), computed=len(todo), reused=len(unique) - len(todo), invalid=invalid)
        if world > 1:
            stats.update(world_size=world, rank=rank, computed_by_rank=computed_by_rank)
    return [folder / f"{e}.npy" for e in entries]


def read_stored_map(path: PathLike) -> torch.Tensor:
    """A cache entry exactly as stored -> ``[h, w, D]`` float32: the teacher's resolution, float16-rounded rows that
    are not quite unit vectors. Checks the file (:class:`~rh3dgs.errors.FeatureFormatError` naming it).

    The cache's own reader; consumers use :func:`rh3dgs.teachers.maps.load_cached`, the map ready for use (rows
    renormalised to unit vectors, optionally resized to the image).
    """
    path = Path(path)
    if not path.is_file():
        raise FeatureFormatError(path, "cached feature file not found (run extract_features first)")
    try:
        arr = load_npy(path, FeatureFormatError, "cached feature map")  # sized from its header first
    except FeatureFormatError as e:
        raise FeatureFormatError(path, f"corrupt cached feature file ({str(e).split(': ', 1)[-1]}); delete it and "
                                       "re-run extract_features") from None
    if not isinstance(arr, np.ndarray) or arr.ndim != 3 or arr.dtype.kind != "f":
        raise FeatureFormatError(path, f"cached features must be a float [h, w, D] array, got "
                                       f"{getattr(arr, 'shape', None)} {getattr(arr, 'dtype', None)}", field="shape")
    t = torch.from_numpy(np.ascontiguousarray(arr)).float()
    if not bool(torch.isfinite(t).all()):
        raise FeatureFormatError(path, "cached features contain NaN/Inf", field="values")
    return t
