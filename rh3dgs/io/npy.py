"""Arrays on disk, read only after their size is known: ``.npy``, ``.npz`` (each member), torch zip files.

Every reader here learns the size of what it is about to allocate from the file's own headers, checks it
against the memory budget (:func:`rh3dgs.memory.check_memory`: the machine's memory or ``--max-memory``)
and against the bytes the file really holds, and only then reads:

* ``.npy``: the header (magic, shape, dtype) - :func:`npy_header`;
* ``.npz``: the header of every member, read from the member's stream *before* it is decompressed (a
  2 MB archive whose member inflates to gigabytes is refused from its first bytes) - :func:`npz_headers`;
* torch files (``torch.save``: a zip archive): the records' sizes, and their CRC-32 checksums, which
  torch's own reader does not verify - :func:`check_torch_zip`.

Every problem is one error line naming the file (the ``error`` class the caller passes, e.g.
:class:`~rh3dgs.errors.FeatureFormatError`); over budget, :class:`~rh3dgs.errors.MemoryLimitError`.

Example::

    arrays = load_npz("scene/field.npz", InputFileError, "scene field")   # {name: array}
"""
from __future__ import annotations

import os
import tokenize
import zipfile
import zlib
from pathlib import Path
from typing import IO, Callable, Dict, Optional, Sequence, Tuple, Type, Union

import numpy as np

# np.load parses the .npy header with ast.literal_eval (SyntaxError, tokenize.TokenError,
# MemoryError on huge shapes), reads with EOFError / ValueError on truncation, and opens
# .npz files as zip archives (BadZipFile, zlib.error, KeyError).
NPY_READ_ERRORS = (OSError, ValueError, EOFError, SyntaxError, tokenize.TokenError, zipfile.BadZipFile, zlib.error,
                   MemoryError, KeyError, TypeError, OverflowError)

__all__ = ["NPY_READ_ERRORS", "npy_header", "npz_headers", "array_bytes", "load_npy", "load_npz", "check_torch_zip"]

PathLike = Union[str, os.PathLike]
Header = Tuple[Tuple[int, ...], np.dtype]
#: bytes a reader needs for an array of (shape, dtype): by default the array and one copy while it is read
BytesFor = Callable[[Tuple[int, ...], np.dtype], int]


def array_bytes(shape: Sequence[int], dtype: np.dtype) -> int:
    """Bytes of an array of ``shape`` and ``dtype`` (Python ints: no overflow for hostile shapes)."""
    n = 1
    for s in shape:
        n *= int(s)
    return n * int(np.dtype(dtype).itemsize)


def _default_bytes(shape, dtype) -> int:
    return 2 * array_bytes(shape, dtype)


def npy_header(f: IO[bytes]) -> Header:
    """(shape, dtype) of the ``.npy`` stream ``f`` from its header, leaving ``f`` at the data; raises one of
    :data:`NPY_READ_ERRORS` on a damaged header, ValueError for object arrays (pickles: never read)."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    elif version in ((2, 0), (3, 0)):
        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    else:  # pragma: no cover - read_magic accepts only these today
        raise ValueError(f"unsupported .npy format version {version}")
    if dtype.hasobject:
        raise ValueError("holds Python objects (a pickle), which rh3dgs never reads")
    if any(int(s) < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    return tuple(int(s) for s in shape), dtype


def _check(path: Path, headers: Dict[str, Header], what: str, bytes_for: BytesFor) -> None:
    from ..memory import check_memory

    need = sum(bytes_for(shape, dtype) for shape, dtype in headers.values())
    if list(headers) == [""]:
        shape, dtype = headers[""]
        check_memory(need, f"{path}: reading a {'x'.join(map(str, shape)) or 'scalar'} {dtype.name} {what}")
        return
    shown = ", ".join(f"{k} {'x'.join(map(str, s)) or 'scalar'} {d.name}"
                      for k, (s, d) in list(headers.items())[:3]) + (", ..." if len(headers) > 3 else "")
    check_memory(need, f"{path}: reading the {what} ({shown})")


def load_npy(path: PathLike, error: Type[Exception], what: str = "array",
             bytes_for: Optional[BytesFor] = None) -> np.ndarray:
    """The array of the ``.npy`` file ``path``, read after its header's size has been checked against the
    budget and against the file's size. ``what`` names the array in messages ("feature map"). Damage raises
    ``error(path, message)``."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            shape, dtype = npy_header(f)
            offset = f.tell()
            size = os.fstat(f.fileno()).st_size
            _check(path, {"": (shape, dtype)}, what, bytes_for or _default_bytes)
            data = array_bytes(shape, dtype)
            if size - offset < data:
                raise ValueError(f"truncated: its header promises {data} bytes of data, the file holds {size - offset}")
            return np.load(path, allow_pickle=False)
    except NPY_READ_ERRORS as e:
        if isinstance(e, (FileNotFoundError, IsADirectoryError, PermissionError)):
            raise error(path, f"cannot be read ({e.strerror or e})") from None
        raise error(path, f"cannot read the {what}: unreadable or corrupt .npy array ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


def npz_headers(path: PathLike, z: Optional[zipfile.ZipFile] = None) -> Dict[str, Header]:
    """{member name without ``.npy``: (shape, dtype)} of an ``.npz``, each read from the first bytes of the
    member's (decompressed) stream; the data is not inflated. Each member's stored size must hold the data its
    header promises. Raises one of :data:`NPY_READ_ERRORS` on damage."""
    own = z is None
    z = zipfile.ZipFile(path) if own else z
    try:
        out: Dict[str, Header] = {}
        for info in z.infolist():
            if not info.filename:  # zipfile's own is_dir() indexes the name's last character
                raise ValueError("a member has an empty name")
            if info.is_dir():
                continue
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            with z.open(info) as f:
                shape, dtype = npy_header(f)
                data = array_bytes(shape, dtype)
                if info.file_size - f.tell() < data:
                    raise ValueError(f"member {info.filename!r} is truncated: its header promises {data} bytes, "
                                     f"the member holds {info.file_size - f.tell()}")
            out[name] = (shape, dtype)
        return out
    finally:
        if own:
            z.close()


def load_npz(path: PathLike, error: Type[Exception], what: str = "arrays", members: Optional[Sequence[str]] = None,
             bytes_for: Optional[BytesFor] = None) -> Dict[str, np.ndarray]:
    """{name: array} of the ``.npz`` ``path`` (only ``members`` when given), read after every member's header
    has been checked (:func:`npz_headers`) and their total against the budget. Damage raises
    ``error(path, message)``; a plain ``.npy`` given as ``.npz`` is said so."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            headers = npz_headers(path, z)
            if members is not None:
                headers = {k: v for k, v in headers.items() if k in members}
            _check(path, headers, what, bytes_for or _default_bytes)
            out = {}
            for name in headers:
                with z.open(name + ".npy" if name + ".npy" in z.NameToInfo else name) as f:
                    out[name] = np.lib.format.read_array(f, allow_pickle=False)
            return out
    except zipfile.BadZipFile as e:
        try:
            with open(path, "rb") as f:
                is_npy = f.read(6) == b"\x93NUMPY"
        except OSError:
            is_npy = False
        if is_npy:
            raise error(path, "is an .npy array, expected an .npz archive") from None
        raise error(path, f"cannot read the {what}: unreadable or corrupt .npz archive (BadZipFile: {e})") from None
    except (NPY_READ_ERRORS + (NotImplementedError, RuntimeError)) as e:
        if isinstance(e, (FileNotFoundError, IsADirectoryError, PermissionError)):
            raise error(path, f"cannot be read ({e.strerror or e})") from None
        raise error(path, f"cannot read the {what}: unreadable or corrupt .npz archive ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


def check_torch_zip(path: PathLike, error: Callable[[Path, str], Exception], what: str = "a torch file",
                    factor: int = 2) -> int:
    """Check a ``torch.save`` file before anything is unpickled; returns the bytes its records hold.

    ``torch.save`` writes a zip archive whose every record (the pickle and each tensor's storage) carries a
    CRC-32; torch's reader does not check them, so flipped bytes load as wrong numbers. Here the archive's
    directory is read (an empty, truncated or foreign file is refused), ``factor`` x the records' sizes is
    checked against the memory budget and every record's CRC-32 verified. ``error(path, message)`` builds
    the error for a damaged file.
    """
    from ..memory import check_memory

    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            total = sum(i.file_size for i in infos)
            check_memory(factor * total, f"{path}: loading {what} of {len(infos)} records",
                         knobs=["a machine with more memory"])
            bad = z.testzip()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, NotImplementedError, RuntimeError,
            zlib.error) as e:  # RuntimeError: a record flagged as encrypted
        size = path.stat().st_size if path.exists() else 0
        raise error(path, f"not a complete {what}, corrupt or truncated ({size} bytes; damaged or not written by "
                          f"torch.save: {type(e).__name__}: {e})") from None
    except OSError as e:
        raise error(path, f"cannot read {what} ({e.strerror or e})") from None
    if bad is not None:
        raise error(path, f"checksum (CRC-32) mismatch in its record {bad}: the file changed since torch.save "
                          "wrote it (damaged or edited)")
    return total
