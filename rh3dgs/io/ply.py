"""Read and write 3D Gaussian Splatting PLY files (the INRIA / nerfstudio layout).

One ``vertex`` element, one row per Gaussian, all properties scalar::

    x y z  [nx ny nz]  f_dc_0..2  f_rest_0..(3K-1)  opacity  scale_0..2  rot_0..3  [sem_0..sem_{d-1}]

* ``f_dc_*`` are the degree-0 SH coefficients (``Gaussians.sh0``), ``f_rest_*`` the
  higher ones (``Gaussians.shN``, K in {0, 3, 8, 15}) stored **channel-major**:
  ``f_rest_{c*K + k}`` is coefficient k of colour channel c. This is what the original
  3DGS code and ``ns-export gaussian-splat`` write (``shN.transpose(1, 2).reshape(N, 3K)``).
* ``opacity`` is the logit, ``scale_*`` the log standard deviations, ``rot_*`` the
  (w, x, y, z) quaternion, un-normalised - all stored raw, as optimised.
* ``sem_*`` are rh3dgs' semantic latents (``Gaussians.latents``), written with the header
  line ``comment rh3dgs sem_dtype float32`` (the *marker*, :data:`SEM_MARKERS`). Other 3DGS
  tools ignore unknown properties.
* Every other vertex property (``nx ny nz``, colours, anything unknown) is kept in
  ``Gaussians.extra`` with its original dtype and written back, so
  ``save_ply(load_ply(p))`` reproduces every field bit for bit.

Property order on writing: the standard fields in the order above; ``nx ny nz`` (when in
``extra``) right after ``x y z`` as INRIA does; other extra properties after ``rot_3`` (in
``extra``'s order, which :func:`load_ply` fills in file order); ``sem_*`` last. Files
written by INRIA 3DGS, nerfstudio and rh3dgs therefore round-trip with identical headers;
a file that had unknown properties elsewhere gets them moved, values unchanged.

Splat files as users download them load too, through gsply (:mod:`rh3dgs.io.compressed`): SuperSplat
compressed PLYs (``chunk`` + ``packed_*`` elements, recognised from the header) and SPZ (recognised from
the first bytes), with the same size and NaN / Inf checks, as plain Gaussians (no ``sem_*``, no ``extra``).

Loading accepts binary (either endianness) and ASCII PLY. Every column that is read is
checked for its declared type and meaning before its values are used: the standard fields
must be ``float`` or ``double`` (converted to float32, values beyond float32 refused), an
integer standard field is refused (quantised / packed data, not 3DGS values), NaN and Inf
are refused except ``opacity = +inf / -inf``, a saturated logit (fully opaque / transparent;
splat-transform writes it), which loads as is (``sigmoid`` gives 1 / 0). Writing is always
binary little-endian, float32 for the standard fields, and atomic
(:func:`rh3dgs.io.atomic.atomic_write`).

Latents. ``save_ply(..., latent_dtype="float32")`` (the default) stores each ``sem_i`` as a
PLY ``float``: a standard type that gsply, splat-transform, SuperSplat and plyfile read as
its value. ``latent_dtype="float16"`` is a **compact, rh3dgs-only** option: PLY has no 16-bit
float type, so each ``sem_i`` becomes a ``ushort`` holding the IEEE binary16 bit pattern
(rounded to nearest even) under the marker ``comment rh3dgs sem_dtype float16``; other tools
read those bit patterns as integers, and readers that assume float columns (gsply) misplace
every field after them. Keep it for files only rh3dgs reads (half the latent bytes; float16
keeps 11 significant bits, holds |x| <= 65504; latents outside that range raise
:class:`PlyFormatError` naming the property - save them as float32). Files written that way by
earlier rh3dgs versions load unchanged.

:func:`load_ply` reads ``sem_*`` only under a marker and only in the type it names
(``float32`` -> ``float``, ``float16`` -> ``ushort``). A file with ``sem_*`` columns but no
marker, or whose ``sem_*`` are of another type (a converter such as splat-transform drops
header comments and rewrites ``ushort`` as ``uint``: float16 bit patterns read as numbers
give 47105.0 for -0.5005), is refused with a :class:`PlyFormatError` naming the file, the
column, the likely cause and the way back (re-export from the scene folder). Its plain
3DGS fields can still be read with ``load_ply(path, latents=False)``, which skips ``sem_*``
unchecked. ``save_ply(..., plain=True)`` writes a plain INRIA file, exactly the properties of INRIA's
3DGS (``x y z nx ny nz f_dc_* f_rest_* opacity scale_* rot_*``, all ``float``; normals as stored, else 0),
that any 3DGS tool reads; ``extra=True`` adds the other per-Gaussian columns (as ``float``).
``rh3dgs select`` / ``export`` write that unless latents or extra columns are asked for.

Before reading any data, the header's vertex count goes through the memory model
(:func:`rh3dgs.memory.ply_load_bytes`): a file whose rows cannot fit in memory, or that
claims more rows than its bytes can hold, is refused with the estimate in the message.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..errors import MemoryLimitError, NonFiniteError, PlyFormatError, ShapeError
from ..gaussians import Gaussians
from .atomic import atomic_write
from .compressed import is_compressed_ply, is_spz, load_compressed_ply, load_spz

__all__ = ["load_ply", "save_ply", "SPLAT_SUFFIXES", "ply_field_names", "SH_REST_COUNTS", "SEM_DTYPE_COMMENT", "SEM_MARKERS",
           "LATENT_DTYPES"]

PathLike = Union[str, os.PathLike]

#: file suffixes :func:`load_ply` reads (INRIA and SuperSplat compressed PLY, SPZ)
SPLAT_SUFFIXES = (".ply", ".spz")

#: number of ``f_rest_*`` properties -> K (higher SH coefficients per channel)
SH_REST_COUNTS = {0: 0, 9: 3, 24: 8, 45: 15}
_K_TO_DEGREE = {0: 0, 3: 1, 8: 2, 15: 3}

_XYZ = ["x", "y", "z"]
_NORMALS = ["nx", "ny", "nz"]
_DC = ["f_dc_0", "f_dc_1", "f_dc_2"]
_OPACITY = ["opacity"]
_SCALE = ["scale_0", "scale_1", "scale_2"]
_ROT = ["rot_0", "rot_1", "rot_2", "rot_3"]
_REQUIRED = _XYZ + _DC + _OPACITY + _SCALE + _ROT

_F_REST_RE = re.compile(r"^f_rest_(\d+)$")
_SEM_RE = re.compile(r"^sem_(\d+)$")
_RESERVED_RE = re.compile(r"^(f_dc|f_rest|sem)_\d+$")

_SEM_DTYPE_KEY = ("rh3dgs", "sem_dtype")
#: header comments (without the leading ``comment ``) that mark ``sem_*`` columns, by latent dtype
SEM_MARKERS = {"float32": "rh3dgs sem_dtype float32", "float16": "rh3dgs sem_dtype float16"}
#: the compact (rh3dgs-only) marker: ``sem_*`` are float16 bit patterns in ``ushort``
SEM_DTYPE_COMMENT = SEM_MARKERS["float16"]
#: the PLY storage type each marker requires
_SEM_STORAGE = {"float32": np.dtype("f4"), "float16": np.dtype("u2")}
#: ``latent_dtype`` values :func:`save_ply` accepts
LATENT_DTYPES = ("float32", "float16")
_FP16_MAX = float(np.finfo(np.float16).max)  # 65504
_F32_EXACT_INT = 2 ** 24  # integers float32 holds exactly

# PLY scalar types (numpy kind+size) that plyfile can write
_PLY_DTYPES = {np.dtype(t) for t in ("i1", "u1", "i2", "u2", "i4", "u4", "f4", "f8")}
_PLY_NAMES = {"i1": "char", "u1": "uchar", "i2": "short", "u2": "ushort", "i4": "int", "u4": "uint", "f4": "float",
              "f8": "double"}

_RECOVER = ("re-export it from the rh3dgs scene folder it came from (`rh3dgs export SCENE --latents --output "
            "FILE`, or use the folder's semantic.ply), or read only its 3DGS fields with "
            "load_ply(path, latents=False)")


def _type_name(dt: np.dtype) -> str:
    return _PLY_NAMES.get(dt.newbyteorder("=").str[1:], str(dt))


def ply_field_names(sh_degree: int, n_latents: int = 0, *, normals: bool = False) -> List[str]:
    """Property names, in order, of the ``vertex`` element :func:`save_ply` writes.

    Args:
        sh_degree: 0..3 (``f_rest`` count 0, 9, 24, 45).
        n_latents: number of ``sem_*`` properties.
        normals: include ``nx ny nz`` after ``x y z`` (as INRIA 3DGS writes them).
    """
    if sh_degree not in (0, 1, 2, 3):
        raise ValueError(f"sh_degree must be 0, 1, 2 or 3, got {sh_degree}")
    if n_latents < 0:
        raise ValueError(f"n_latents must be >= 0, got {n_latents}")
    k = (sh_degree + 1) ** 2 - 1
    return (
        _XYZ
        + (_NORMALS if normals else [])
        + _DC
        + [f"f_rest_{i}" for i in range(3 * k)]
        + _OPACITY
        + _SCALE
        + _ROT
        + [f"sem_{i}" for i in range(n_latents)]
    )


# ---------------------------------------------------------------------------- loading
def _numbered(path: Path, names: Sequence[str], pattern: "re.Pattern[str]") -> Dict[int, str]:
    """{i: name} of the properties ``pattern`` numbers (f_rest_i, sem_i); a number written otherwise than
    ``i`` (f_rest_08) is refused: it would name the column of another number."""
    out = {}
    for n in names:
        m = pattern.match(n)
        if m:
            i = int(m.group(1))
            if m.group(1) != str(i):
                canonical = n[:m.start(1)] + str(i)
                raise PlyFormatError(path, f"property {n!r} is numbered with leading zeros (a 3DGS PLY names it "
                                           f"{canonical!r})", field=n)
            out[i] = n
    return out


def _check_layout(path: Path, element_names: Sequence[str], props: Sequence[Tuple[str, bool]]) -> Tuple[int, int]:
    """Validate the vertex properties (name, is_list); returns (K, n_latents)."""
    if "vertex" not in element_names:
        found = ", ".join(repr(e) for e in element_names) or "none"
        raise PlyFormatError(path, f"no 'vertex' element (elements found: {found}); not a 3DGS PLY", field="vertex")
    names = [p for p, _ in props]
    missing = [n for n in _REQUIRED if n not in names]
    if missing:
        hint = ""
        if "packed_position" in names:
            hint = " It has packed_* properties but no 'chunk' element: not a complete SuperSplat compressed PLY."
        elif {"red", "green", "blue"} <= set(names) and any(n.startswith("f_dc") for n in missing):
            hint = (
                " It stores colours as red/green/blue instead of SH coefficients; re-export with SH coefficients "
                "(e.g. ns-export gaussian-splat --ply-color-mode sh_coeffs)."
            )
        elif "face" in element_names or len(missing) == len(_REQUIRED) - 3:
            hint = " It looks like a mesh or point cloud, not a 3D Gaussian Splatting scene."
        raise PlyFormatError(
            path,
            f"missing required 3DGS properties: {', '.join(missing)}.{hint}",
            field="vertex",
        )
    for name, is_list in props:
        if is_list:
            raise PlyFormatError(path, "list properties are not supported in the vertex element", field=name)
    rest = _numbered(path, names, _F_REST_RE)
    if len(rest) not in SH_REST_COUNTS:
        raise PlyFormatError(
            path,
            f"{len(rest)} f_rest_* properties; expected 0, 9, 24 or 45 (SH degree 0-3)",
            field="f_rest",
        )
    if set(rest) != set(range(len(rest))):
        gaps = sorted(set(range(len(rest))) - set(rest))
        raise PlyFormatError(path, f"f_rest_* properties are not numbered 0..{len(rest) - 1} (missing {gaps[:5]})", field="f_rest")
    sem = _numbered(path, names, _SEM_RE)
    if set(sem) != set(range(len(sem))):
        gaps = sorted(set(range(len(sem))) - set(sem))
        raise PlyFormatError(path, f"sem_* properties are not numbered 0..{len(sem) - 1} (missing {gaps[:5]})", field="sem")
    return SH_REST_COUNTS[len(rest)], len(sem)


def _row_bytes(props, text: bool) -> int:
    """Fewest bytes one row of ``props`` can take in the file (ASCII: one digit and a separator each)."""
    from plyfile import PlyListProperty

    total = 0
    for p in props:
        if text:
            total += 2
        elif isinstance(p, PlyListProperty):
            total += np.dtype(p.len_dtype).itemsize
        else:
            total += np.dtype(p.val_dtype).itemsize
    return max(total, 1)


def _check_rows_fit(path: Path, hdr, size: int, latents: bool) -> None:
    """Refuse, from the header alone, a row count the file cannot hold or memory cannot take."""
    from ..memory import format_bytes, memory_budget, over_budget_message, ply_load_bytes

    for e in hdr.elements:
        if e.count < 0:
            raise PlyFormatError(path, f"header declares {e.count} {e.name!r} rows; corrupt", field=e.name)
        file_need = e.count * _row_bytes(e.properties, hdr.text)
        need = 0
        if e.name == "vertex":
            names = [p.name for p in e.properties]
            n_std = sum(1 for nm in names if nm in _REQUIRED or _F_REST_RE.match(nm))
            n_sem = sum(1 for nm in names if _SEM_RE.match(nm)) if latents else 0
            extra = sum(8 for nm in names if not (nm in _REQUIRED or _F_REST_RE.match(nm) or _SEM_RE.match(nm)))
            need = ply_load_bytes(e.count, n_std, n_sem, extra, _row_bytes(e.properties, False) if hdr.text else 0)
        budget, source = memory_budget()
        too_big = need > budget
        estimate = over_budget_message(need, f"loading {e.count} Gaussians",
                                       "float32 standard fields read and split into tensors, latents, extra "
                                       "properties", ["fewer Gaussians (decimate the scene, e.g. "
                                                      "`npx @playcanvas/splat-transform IN.ply -d 50% OUT.ply`)"],
                                       budget, source) if too_big else ""
        if file_need > size:
            msg = (f"header declares {e.count} {e.name!r} rows, which need at least {format_bytes(file_need)}, but the "
                   f"file has {size} bytes; truncated or corrupt")
            raise PlyFormatError(path, msg + (f" ({estimate})" if estimate else ""), field=e.name)
        if too_big:
            raise MemoryLimitError(f"{path} [{e.name}]: {estimate}")


def _peek_header(path: Path, size: int, latents: bool):
    """Parse only the header (fail fast on a mesh, a corrupt file or an impossible size before reading data).

    Uses plyfile's header parser; returns None if this plyfile version lacks it.
    """
    from plyfile import PlyData, PlyListProperty

    parse = getattr(PlyData, "_parse_header", None)
    if parse is None:  # pragma: no cover - other plyfile versions
        return None
    with open(path, "rb") as f:
        hdr = parse(f)
        body = size - f.tell()  # the rows' bytes: what the header's counts must fit in
    elements = list(hdr.elements)
    names = [e.name for e in elements]
    vertex = next((e for e in elements if e.name == "vertex"), None)
    props = [] if vertex is None else [(p.name, isinstance(p, PlyListProperty)) for p in vertex.properties]
    _check_rows_fit(path, hdr, body, latents)
    if is_compressed_ply(names, [p for p, _ in props]):
        sh = next((e for e in elements if e.name == "sh"), None)
        return _Compressed(vertex.count, 0 if sh is None else len(sh.properties) // 3)
    _check_layout(path, names, props)
    return names, props


class _Compressed(tuple):
    """A SuperSplat compressed PLY's header: ``(rows, higher SH coefficients per channel)``."""

    def __new__(cls, rows: int, sh_coeffs: int):
        return super().__new__(cls, (rows, sh_coeffs))


def _read(path: Path, latents: bool):
    from plyfile import PlyData, PlyParseError

    try:
        size = path.stat().st_size
        if size == 0:
            raise PlyFormatError(path, "file is empty")
        header = _peek_header(path, size, latents)
        if isinstance(header, _Compressed):
            return header
        return PlyData.read(str(path), mmap="c")
    except (PlyFormatError, MemoryLimitError):
        raise
    except PlyParseError as e:
        elt = getattr(getattr(e, "element", None), "name", None)
        prop = getattr(getattr(e, "prop", None), "name", None)
        if "end-of-file" in str(e):
            msg = f"file is truncated or corrupt (ends early): {e}"
        else:
            msg = f"not a valid PLY file, or truncated / corrupt: {e}"
        raise PlyFormatError(path, msg, field=prop or elt) from e
    except (ValueError, TypeError, IndexError, KeyError, UnicodeDecodeError, EOFError, OverflowError) as e:
        raise PlyFormatError(path, f"not a valid PLY file, or truncated / corrupt: {type(e).__name__}: {e}") from e
    except MemoryError as e:
        raise MemoryLimitError(f"{path}: out of memory while reading the file ({e})") from None
    except OSError as e:
        raise PlyFormatError(path, f"cannot read file: {e}") from e


def _column(data: np.ndarray, name: str) -> np.ndarray:
    """Copy one column out of the (memory-mapped) record array, native byte order."""
    col = data[name]
    return np.array(col, dtype=col.dtype.newbyteorder("="), copy=True)


def _check_float_types(path: Path, data: np.ndarray, names: Sequence[str]) -> None:
    """The standard 3DGS fields are real numbers: PLY ``float`` / ``double`` only."""
    for name in names:
        dt = data.dtype[name]
        if dt.kind != "f":
            raise PlyFormatError(
                path,
                f"stored as {_type_name(dt)}, but a 3DGS {name!r} is a float (PLY 'float' or 'double'): integer "
                "columns hold quantised or packed values, not the 3DGS parameters. Convert the file to the standard "
                "layout (e.g. npx @playcanvas/splat-transform IN OUT.ply)",
                field=name,
            )


def _float_columns(path: Path, data: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """[N, len(names)] float32, after checking every value is finite (``opacity``: +-inf allowed) and,
    for ``double`` columns, within the float32 range."""
    out = np.empty((len(data), len(names)), dtype=np.float32)
    for j, name in enumerate(names):
        col = _column(data, name)
        inf_ok = name == "opacity"
        _check_finite(path, col, name, allow_inf=inf_ok)
        with np.errstate(over="ignore"):
            out[:, j] = col
        if col.dtype.itemsize > 4:
            over = np.isinf(out[:, j]) & np.isfinite(col)
            if over.any():
                first = int(np.flatnonzero(over)[0])
                raise PlyFormatError(path, f"{int(over.sum())} double value(s) beyond the float32 range (|x| > 3.4e38), "
                                           f"first at vertex {first} ({col[first]:g})", field=name)
    return out


def _check_finite(path: Path, col: np.ndarray, name: str, allow_inf: bool = False) -> None:
    bad = np.isnan(col) if allow_inf else ~np.isfinite(col)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        what = "NaN value(s)" if allow_inf else "non-finite value(s) (NaN/Inf)"
        raise PlyFormatError(path, f"{int(bad.sum())} {what} out of {len(col)}, first at vertex {first}"
                                   + (" (+-inf is read as a saturated logit, NaN is an error)" if allow_inf else ""),
                             field=name)


def _sem_dtype(path: Path, ply) -> Optional[str]:
    """The ``rh3dgs sem_dtype X`` header comment (file-level or in the vertex element): X, or None."""
    comments = list(ply.comments)
    try:
        comments += list(ply["vertex"].comments)
    except KeyError:  # pragma: no cover - checked before
        pass
    found = None
    for c in comments:
        tok = c.split()
        if tuple(tok[:2]) != _SEM_DTYPE_KEY:
            continue
        value = tok[2] if len(tok) == 3 else None
        if value not in _SEM_STORAGE:
            raise PlyFormatError(path, f"header comment {c!r} is not 'rh3dgs sem_dtype float32' or '... float16'",
                                 field="comment")
        if found is not None and found != value:
            raise PlyFormatError(path, "header comments give conflicting sem_dtype values", field="comment")
        found = value
    return found


def _latent_columns(path: Path, data: np.ndarray, names: Sequence[str], sem_dtype: Optional[str]) -> np.ndarray:
    """[N, d] float32 latents, read only as the marker says (float32: ``float``; float16: ``ushort`` bit patterns)."""
    if sem_dtype is None:
        kinds = sorted({_type_name(data.dtype[nm]) for nm in names})
        raise PlyFormatError(
            path,
            f"has {len(names)} sem_* (rh3dgs latent) columns, stored as {'/'.join(kinds)}, but not the header line "
            f"'comment {SEM_MARKERS['float32']}' (or '... float16') that rh3dgs writes with them. Probably a "
            "converter (splat-transform, SuperSplat, a PLY editor) rewrote the file: it drops header comments and may "
            "retype or reorder columns, so these values cannot be trusted as latents. To recover, " + _RECOVER,
            field=names[0],
        )
    want = _SEM_STORAGE[sem_dtype]
    for name in names:
        dt = data.dtype[name].newbyteorder("=")
        if dt != want:
            if sem_dtype == "float16" and dt.kind in "ui":
                cause = (f"float16 bit patterns must be ushort; as {_type_name(dt)} a converter probably widened them "
                         "(splat-transform writes uint)")
            else:
                cause = "a converter or editor probably retyped the column"
            raise PlyFormatError(
                path,
                f"the header marks sem_* as {sem_dtype} ('comment {SEM_MARKERS[sem_dtype]}', stored as "
                f"{_type_name(want)}) but this column is stored as {_type_name(dt)}: {cause}. "
                "Its values are not latents; to recover, " + _RECOVER,
                field=name,
            )
    out = np.empty((len(data), len(names)), dtype=np.float32)
    for j, name in enumerate(names):
        col = _column(data, name)
        if sem_dtype == "float16":
            col = col.view(np.float16)
        _check_finite(path, col, name)
        out[:, j] = col
    return out


def load_ply(path: PathLike, device: Union[str, torch.device] = "cpu", *, latents: bool = True) -> Gaussians:
    """Load a 3DGS PLY (INRIA / nerfstudio / splat-transform / rh3dgs layout, see the module doc), a SuperSplat
    compressed PLY or an SPZ file (:mod:`rh3dgs.io.compressed`).

    Args:
        path: the ``.ply`` file.
        device: where the returned tensors live.
        latents: read the ``sem_*`` columns as ``latents`` (checked against the marker, see the
            module doc); False skips them unchecked (a file a converter rewrote, used for its
            3DGS fields only).

    Returns a :class:`Gaussians` on ``device`` with raw parameters; ``sem_*`` become
    ``latents`` (float32; compact float16 files give exactly their float16 values), every other
    non-standard property goes to ``extra`` in file order with its dtype. A file with zero
    Gaussians loads as an empty scene. ``opacity`` may be +-inf (saturated logits).

    Raises :class:`PlyFormatError` (naming the file and, where it applies, the property)
    if the file is missing, not a PLY, truncated or corrupt, has no ``vertex`` element,
    lacks required 3DGS properties, stores one of them as an integer, has an f_rest count
    other than 0/9/24/45, holds NaN / Inf in a standard or ``sem_*`` property (``extra``
    properties are not checked; ``opacity`` may be +-inf), or has ``sem_*`` columns without
    the marker or of another type than it names. Raises
    :class:`rh3dgs.errors.MemoryLimitError` if the header's row count cannot fit in memory
    (:mod:`rh3dgs.memory`), before reading the rows.
    """
    path = Path(path)
    if not path.exists():
        raise PlyFormatError(path, "file not found")
    if path.is_dir():
        raise PlyFormatError(path, "is a directory, expected a .ply file")

    if is_spz(path):
        return load_spz(path, device)
    ply = _read(path, latents)
    if isinstance(ply, _Compressed):
        return load_compressed_ply(path, device, rows=ply[0], sh_coeffs=ply[1])
    element_names = [e.name for e in ply.elements]
    if "vertex" not in element_names:
        _check_layout(path, element_names, [])
    data = ply["vertex"].data
    names = list(data.dtype.names or ())
    props = [(n, data.dtype[n].hasobject or data.dtype[n].shape != ()) for n in names]
    k, d = _check_layout(path, element_names, props)
    n = len(data)

    rest_names = [f"f_rest_{i}" for i in range(3 * k)]
    sem_names = [f"sem_{i}" for i in range(d)]
    std_names = _XYZ + _DC + rest_names + _OPACITY + _SCALE + _ROT  # order of take() below
    _check_float_types(path, data, std_names)
    lat = _latent_columns(path, data, sem_names, _sem_dtype(path, ply)) if d and latents else None
    std = _float_columns(path, data, std_names)
    used = set(_REQUIRED) | set(rest_names) | set(sem_names)
    extra = {}
    for name in names:
        if name not in used:
            extra[name] = torch.from_numpy(_column(data, name))
    del data, ply  # release the memory map

    c = 0

    def take(m: int) -> torch.Tensor:
        nonlocal c
        t = torch.from_numpy(np.ascontiguousarray(std[:, c : c + m]))
        c += m
        return t

    means = take(3)
    sh0 = take(3).reshape(n, 1, 3)
    shN = take(3 * k).reshape(n, 3, k).transpose(1, 2).contiguous()  # channel-major -> [N, K, 3]
    opacities = take(1).reshape(n)
    scales = take(3)
    quats = take(4)
    g = Gaussians(
        means=means,
        scales=scales,
        quats=quats,
        opacities=opacities,
        sh0=sh0,
        shN=shN,
        latents=None if lat is None else torch.from_numpy(lat),
        extra=extra,
    )
    return g if torch.device(device) == torch.device("cpu") else g.to(device)


# ---------------------------------------------------------------------------- saving
def _np(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().numpy()


def _extra_column(path: Path, name: str, t: torch.Tensor, n: int, plain: bool = False) -> np.ndarray:
    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t)
    if tuple(t.shape) != (n,):
        raise ShapeError(f"{path}: Gaussians.extra[{name!r}] must have shape [N]={[n]} to be written to a PLY, got {list(t.shape)}")
    a = _np(t)
    if plain:  # every column a PLY float: what readers that assume float columns (gsply) need
        if a.dtype.kind in "iub" and a.size and np.abs(a.astype(np.float64)).max() > _F32_EXACT_INT:
            raise PlyFormatError(path, "integer values beyond 2^24 cannot be written exactly as float in a plain "
                                       "3DGS PLY; drop the property or save with plain=False", field=name)
        return a.astype(np.float32)
    if a.dtype == np.bool_:
        a = a.astype(np.uint8)
    elif a.dtype == np.float16:
        a = a.astype(np.float32)
    elif a.dtype in (np.dtype(np.int64), np.dtype(np.uint64)):
        target = np.dtype(np.int32) if a.dtype == np.int64 else np.dtype(np.uint32)
        info = np.iinfo(target)
        if a.size and (a.min() < info.min or a.max() > info.max):
            raise PlyFormatError(path, f"64-bit integer values do not fit the PLY type {target} (PLY has no 64-bit integers)", field=name)
        a = a.astype(target)
    if a.dtype not in _PLY_DTYPES:
        raise PlyFormatError(path, f"dtype {a.dtype} cannot be stored in a PLY", field=name)
    return a


def _check_name(path: Path, name: str) -> None:
    if not isinstance(name, str) or not name or not name.isascii() or any(ch.isspace() for ch in name):
        raise PlyFormatError(path, "extra property names must be non-empty ASCII without spaces", field=repr(name))
    if name in _REQUIRED or _RESERVED_RE.match(name):
        raise PlyFormatError(path, "extra property name collides with a standard 3DGS / rh3dgs property", field=name)


def _latent_dtype(latent_dtype) -> str:
    name = {torch.float16: "float16", torch.float32: "float32"}.get(latent_dtype, latent_dtype)
    if not isinstance(name, str):
        try:
            name = np.dtype(name).name
        except TypeError:
            name = repr(name)
    if name not in LATENT_DTYPES:
        raise ValueError(f"save_ply: latent_dtype must be 'float32' or 'float16', got {latent_dtype!r}")
    return name


def _to_half_bits(path: Path, names: Sequence[str], a: np.ndarray) -> np.ndarray:
    """[N, d] finite float32 -> [N, d] uint16 float16 bit patterns; PlyFormatError if |x| > 65504."""
    over = np.abs(a) > _FP16_MAX
    if over.any():
        j = int(np.flatnonzero(over.any(axis=0))[0])
        i = int(np.flatnonzero(over[:, j])[0])
        raise PlyFormatError(
            path,
            f"{int(over[:, j].sum())} latent value(s) outside the float16 range (|x| > 65504), first at Gaussian "
            f"{i} ({float(a[i, j]):g}); save with latent_dtype='float32' to keep them",
            field=names[j],
        )
    return a.astype(np.float16).view(np.uint16)


def save_ply(path: PathLike, gaussians: Gaussians, mask: Optional[Union[torch.Tensor, np.ndarray]] = None, *,
             latent_dtype: str = "float32", plain: bool = False, extra: Optional[bool] = None) -> Path:
    """Write ``gaussians`` (or the ``mask``-selected subset) as a binary little-endian 3DGS PLY.

    Args:
        path: output file, replaced atomically (parent folders are created).
        gaussians: the scene, on any device.
        mask: optional bool [N]; only Gaussians where it is True are written.
        latent_dtype: "float32" (default: ``sem_*`` as PLY ``float`` under the marker
            ``comment rh3dgs sem_dtype float32``) or the compact, rh3dgs-only "float16"
            (``ushort`` float16 bit patterns under ``comment rh3dgs sem_dtype float16``; see the module doc).
        plain: write a plain INRIA 3DGS PLY that every 3DGS tool reads: exactly INRIA's properties
            (:func:`ply_field_names` with ``normals=True``; normals 0 unless ``extra`` holds them), no ``sem_*``.
        extra: write ``gaussians.extra``'s other columns (default: unless ``plain``); with ``plain`` as
            ``float`` (integers beyond 2^24 raise, float64 is rounded to float32).

    Returns ``Path(path)``. Layout and order: see the module doc and
    :func:`ply_field_names`. ``extra`` tensors must be [N]; bool is written as uint8,
    float16 / bfloat16 as float32, int64 / uint64 as int32 / uint32 (if the values fit).

    Raises :class:`NonFiniteError` (before touching ``path``) if a standard field or the
    latents hold NaN / Inf (``opacity`` may be +-inf: saturated logits) - such a file would
    not load; select the finite Gaussians with ``mask`` instead. Raises
    :class:`PlyFormatError` naming the ``sem_*`` property (also before touching ``path``) if
    ``latent_dtype="float16"`` and a latent has |x| > 65504.
    Raises :class:`ShapeError` for a wrong-sized ``mask`` / extra.
    """
    from plyfile import PlyData, PlyElement

    path = Path(path)
    latent_dtype = _latent_dtype(latent_dtype)
    g = gaussians
    n_all = len(g)
    if mask is not None:
        m = torch.as_tensor(mask)
        if m.dtype != torch.bool or tuple(m.shape) != (n_all,):
            raise ShapeError(f"save_ply({path}): mask must be a bool tensor of shape [{n_all}], got {m.dtype} {list(m.shape)}")
        g = g[m.to(g.device)]
    n = len(g)
    k = g.shN.shape[1]

    std_blocks = [
        (_XYZ, g.means),
        (_DC, g.sh0.reshape(n, 3)),
        ([f"f_rest_{i}" for i in range(3 * k)], g.shN.transpose(1, 2).reshape(n, 3 * k)),  # channel-major
        (_OPACITY, g.opacities.reshape(n, 1)),
        (_SCALE, g.scales),
        (_ROT, g.quats),
    ]
    d = 0 if g.latents is None or plain else g.latents.shape[1]
    sem_block = ([f"sem_{i}" for i in range(d)], g.latents)

    columns: Dict[str, np.ndarray] = {}
    for names, t in std_blocks + ([sem_block] if d else []):
        a = _np(t).astype(np.float32, copy=False).reshape(n, len(names))
        bad = np.isnan(a) if names is _OPACITY else ~np.isfinite(a)
        if bad.any():
            j = int(np.flatnonzero(bad.any(axis=0))[0])
            cnt = int(bad[:, j].sum())
            raise NonFiniteError(
                f"save_ply({path}): property '{names[j]}' has {cnt} non-finite value(s) "
                f"({'NaN' if names is _OPACITY else 'NaN/Inf'}); the file would not load. Drop those Gaussians with mask=..."
            )
        if names is sem_block[0] and latent_dtype == "float16":
            a = _to_half_bits(path, names, a)
        for j, name in enumerate(names):
            columns[name] = a[:, j]

    extras: Dict[str, np.ndarray] = {}
    keep = (lambda name: True) if (not plain if extra is None else extra) else (lambda name: name in _NORMALS)
    for name, t in g.extra.items():
        _check_name(path, name)
        if keep(name):
            extras[name] = _extra_column(path, name, t, n, plain)
    if plain:  # INRIA's layout: normals always there (its 3DGS writes zeros)
        for name in _NORMALS:
            extras.setdefault(name, np.zeros(n, np.float32))

    order = list(_XYZ)
    order += [nm for nm in _NORMALS if nm in extras]
    order += _DC + std_blocks[2][0] + _OPACITY + _SCALE + _ROT
    order += [nm for nm in extras if nm not in _NORMALS]
    order += sem_block[0]
    columns.update(extras)

    dtype = [(nm, columns[nm].dtype.newbyteorder("<")) for nm in order]
    arr = np.empty(n, dtype=dtype)
    for nm in order:
        arr[nm] = columns[nm]
    comments = [SEM_MARKERS[latent_dtype]] if d else []
    ply = PlyData([PlyElement.describe(arr, "vertex")], text=False, byte_order="<", comments=comments)
    with atomic_write(path, "wb") as f:
        ply.write(f)
    return path
