"""Atomic file output: a file at ``path`` is either the old one or the complete new one.

Every output rh3dgs writes goes through :func:`atomic_write`: the data is written to a
temporary file in the destination folder, flushed and ``fsync``-ed, then moved over
``path`` with :func:`os.replace` (atomic on POSIX and Windows when both are on the same
file system, which a sibling temp file guarantees). If anything fails - an exception in
the ``with`` body, Ctrl-C, a full disk - the temp file is removed and ``path`` is left
exactly as it was (absent, or the previous complete file). A crash of the whole process
can at worst leave a hidden ``.<name>.<random>.tmp`` sibling behind, never a partial
file at ``path``.

Notes:
    * Missing parent folders are created.
    * The new file gets the usual permissions (``0o666`` minus the umask), not the
      ``0o600`` of :mod:`tempfile`.
    * If ``path`` is a symbolic link to a regular file, the link itself is replaced by a
      regular file (the file it pointed to is left alone).
    * Only regular files are ever replaced: a ``path`` that is a character or block device,
      a FIFO, a socket, or a symbolic link to one of those is refused with a
      :class:`~rh3dgs.errors.ConfigError` (:func:`check_replaceable`), before the temp file
      is made and again just before the rename. Without this, ``--output /dev/null
      --overwrite`` run as root replaced the device node with a regular file.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Any, Iterator, Mapping, Optional, Union

import numpy as np

from ..errors import ConfigError, NonFiniteError, ShapeError

__all__ = [
    "atomic_write",
    "check_replaceable",
    "stale_temp_files",
    "atomic_save_bytes",
    "atomic_save_text",
    "atomic_save_json",
    "atomic_save_npz",
    "atomic_save_png",
]

PathLike = Union[str, os.PathLike]

_TEXT_MODES = {"w", "wt"}
_BINARY_MODES = {"wb"}


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def stale_temp_files(folder: PathLike, name_glob: str = "*") -> Iterator[Path]:
    """Temp files that :func:`atomic_write` left in ``folder`` for names matching ``name_glob`` (a
    process killed between creating and renaming one). Only safe to delete when no write runs."""
    return Path(folder).glob(f".{name_glob}.*.tmp")


_SPECIAL_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def check_replaceable(path: PathLike) -> None:
    """Raise :class:`ConfigError` (one line naming ``path`` and what it is) if ``path`` exists and is not
    something rh3dgs may replace: anything but a regular file, a folder, or a symbolic link to either
    (a dangling link is fine: the link is what gets replaced). ``--overwrite`` does not change this.

    Example::

        check_replaceable("/dev/null")   # ConfigError: /dev/null is a character device, ...
    """
    try:
        st = os.stat(path)  # follows symbolic links: a link to /dev/null is refused like /dev/null
    except (FileNotFoundError, NotADirectoryError):
        return  # nothing there (or a dangling link): nothing special gets replaced
    except (OSError, ValueError):
        return  # unreadable / too long / a loop: the writer reports it with its own error
    mode = st.st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    kind = next((name for test, name in _SPECIAL_KINDS if test(mode)), f"not a regular file (mode {oct(mode)})")
    via = f" (a symbolic link to {os.path.realpath(path)})" if os.path.islink(path) else ""
    raise ConfigError(f"{path}{via} is {kind}, not a regular file: rh3dgs only ever replaces regular files "
                      "(never devices, FIFOs or sockets, even with --overwrite); choose another output path")


def _open_exclusive(path: Path) -> "tuple[Path, int]":
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = _tmp_name(path)
        try:
            return tmp, os.open(tmp, flags, 0o666)  # umask applies, like open(path, "w")
        except FileExistsError:  # pragma: no cover - 48 random bits
            continue
    raise FileExistsError(f"could not create a temporary file next to {path}")  # pragma: no cover


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (POSIX); silently skipped where directories cannot be opened."""
    if os.name != "posix":
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on dirs
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: PathLike, mode: str = "wb", encoding: str = "utf-8") -> Iterator[IO]:
    """Open a temporary file for writing that replaces ``path`` only if the block succeeds.

    Args:
        path: destination file; its parent folders are created if missing.
        mode: ``"wb"`` (binary, default) or ``"w"`` / ``"wt"`` (text, ``encoding``,
            ``"\\n"`` line endings on every platform).
        encoding: text encoding for text modes.

    Yields the open file object. The body may close it itself; it is flushed and
    ``fsync``-ed before the rename either way.

    Example::

        with atomic_write(out / "scene.ply") as f:
            plydata.write(f)
    """
    if mode not in _TEXT_MODES | _BINARY_MODES:
        raise ValueError(f"atomic_write: mode must be 'wb', 'w' or 'wt', got {mode!r}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: is a directory, cannot write a file there")
    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    tmp, fd = _open_exclusive(path)
    try:
        if mode in _BINARY_MODES:
            f: IO = os.fdopen(fd, "wb")
        else:
            f = os.fdopen(fd, "w", encoding=encoding, newline="\n")
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

    try:
        yield f
        if not f.closed:
            f.flush()
            os.fsync(f.fileno())
            f.close()
        else:  # the body closed it: the data is in the OS cache, make it durable
            fd2 = os.open(tmp, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            try:
                os.fsync(fd2)
            finally:
                os.close(fd2)
        check_replaceable(path)  # again: something special may have appeared there while we wrote
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(Exception):
            f.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


# ---------------------------------------------------------------------------- helpers
def atomic_save_bytes(path: PathLike, data: Union[bytes, bytearray, memoryview]) -> Path:
    """Write ``data`` to ``path`` atomically; returns ``Path(path)``."""
    with atomic_write(path, "wb") as f:
        f.write(data)
    return Path(path)


def atomic_save_text(path: PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (``\\n`` line endings); returns ``Path(path)``."""
    with atomic_write(path, "w", encoding=encoding) as f:
        f.write(text)
    return Path(path)


def _json_default(obj: Any) -> Any:
    """JSON encoding for the non-standard types rh3dgs outputs contain."""
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    mod = type(obj).__module__
    if mod.startswith("torch") and hasattr(obj, "tolist"):
        return obj.detach().cpu().tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def atomic_save_json(path: PathLike, obj: Any, indent: Optional[int] = 2, allow_nan: bool = True) -> Path:
    """Serialise ``obj`` to JSON and write it atomically; returns ``Path(path)``.

    numpy scalars / arrays, torch tensors, paths and sets are converted. The object is
    serialised *before* the file is touched, so an unserialisable value leaves ``path``
    unchanged. With ``allow_nan=True`` (Python's default) NaN / Infinity are written as the
    non-standard ``NaN`` / ``Infinity`` tokens that Python's :mod:`json` reads back;
    pass ``allow_nan=False`` for strict JSON (raises ``ValueError`` on them).
    """
    text = json.dumps(obj, indent=indent, allow_nan=allow_nan, default=_json_default)
    return atomic_save_text(path, text + "\n")


def _to_numpy(a: Any) -> np.ndarray:
    if type(a).__module__.startswith("torch") and hasattr(a, "detach"):
        t = a.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":  # numpy has no bfloat16
            t = t.float()
        return t.numpy()
    return np.asarray(a)


def atomic_save_npz(path: PathLike, arrays: Mapping[str, Any], compressed: bool = False) -> Path:
    """Save ``{name: array}`` (numpy arrays or torch tensors) as an ``.npz`` atomically.

    Unlike :func:`numpy.savez`, no ``.npz`` suffix is appended: the file is ``path``.
    """
    data = {str(k): _to_numpy(v) for k, v in arrays.items()}
    buf_writer = np.savez_compressed if compressed else np.savez
    with atomic_write(path, "wb") as f:
        buf_writer(f, **data)
    return Path(path)


_PNG_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}


def atomic_save_png(path: PathLike, array: Any) -> Path:
    """Save an image array as PNG atomically; returns ``Path(path)``.

    ``array`` (numpy or torch, on any device) is ``[H, W]`` or ``[H, W, C]`` with C in
    1 (grey), 2 (grey+alpha), 3 (RGB), 4 (RGBA), and one of:

    * ``uint8``: written as is;
    * ``uint16`` ``[H, W]`` / ``[H, W, 1]``: 16-bit greyscale (e.g. depth in mm);
    * ``bool``: 0 / 255;
    * floating point: values in [0, 1], clipped, scaled by 255 and rounded. NaN / Inf
      raise :class:`NonFiniteError`.
    """
    from PIL import Image

    a = _to_numpy(array)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in _PNG_MODES) or 0 in a.shape[:2]:
        raise ShapeError(
            f"atomic_save_png({path}): image must be [H, W] or [H, W, C] with C in 1..4 and H, W > 0, "
            f"got shape {list(a.shape)}"
        )
    if a.dtype == np.bool_:
        a = a.astype(np.uint8) * 255
    elif np.issubdtype(a.dtype, np.floating):
        finite = np.isfinite(a)
        if not finite.all():
            raise NonFiniteError(
                f"atomic_save_png({path}): image has {int((~finite).sum())} non-finite values (NaN/Inf)"
            )
        a = np.rint(np.clip(a.astype(np.float64), 0.0, 1.0) * 255.0).astype(np.uint8)
    elif a.dtype == np.uint16:
        if a.ndim != 2:
            raise ShapeError(f"atomic_save_png({path}): uint16 images must be greyscale [H, W], got {list(a.shape)}")
    elif a.dtype != np.uint8:
        raise TypeError(
            f"atomic_save_png({path}): unsupported dtype {a.dtype}; use uint8, uint16 (grey), bool or float in [0, 1]"
        )

    a = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("="), copy=False))
    img = Image.fromarray(a)
    want = "I;16" if a.dtype == np.uint16 else ("L" if a.ndim == 2 else _PNG_MODES[a.shape[2]])
    if img.mode != want:  # pragma: no cover - depends on the Pillow version
        raise TypeError(f"atomic_save_png({path}): Pillow made a {img.mode!r} image from {a.dtype} {list(a.shape)}")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return atomic_save_bytes(path, buf.getvalue())
