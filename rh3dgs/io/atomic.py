"""Atomic file output: a file at ``path`` is either the old one or the complete new one.

Every output rh3dgs writes goes through :func:`atomic_write`: the data is written to a
temporary file in the destination folder, flushed and ``fsync``-ed, then moved over
``path`` with :func:`os.replace` (atomic on POSIX and Windows when both are on the same
file system, which a sibling temp file guarantees). If anything fails - an exception in
the ``with`` body, Ctrl-C, a full disk - the temp file is removed and ``path`` is left
exactly as it was (absent, or the previous complete file). A crash of the whole process
can at worst leave a hidden ``.<name>.<random>.tmp`` sibling behind, never a partial
file at ``path``. An operating-system error while writing (a full disk, a quota, no permission, a
read-only file system) is one :class:`~rh3dgs.errors.OutputError` line naming ``path``.

Folders (a scene, a dataset, a query's PNGs: any output of several files) are replaced the same way by
:func:`atomic_folder`: built as a hidden sibling, then swapped with the old folder in one rename
(``renameat2(RENAME_EXCHANGE)`` on Linux), so a failure at any byte - or a kill - leaves the old folder
whole and loadable.

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
import ctypes
import errno
import io
import json
import os
import secrets
import shutil
import stat
from pathlib import Path
from typing import IO, Any, Iterator, Mapping, Optional, Union

import numpy as np

from ..errors import ConfigError, NonFiniteError, OutputError, ShapeError

__all__ = [
    "atomic_write",
    "atomic_folder",
    "check_replaceable",
    "stale_temp_files",
    "atomic_save_bytes",
    "atomic_save_text",
    "atomic_save_json",
    "atomic_save_npz",
    "atomic_save_png",
    "file_sha256",
]

PathLike = Union[str, os.PathLike]

#: how atomic_write opens its temp file's descriptor (tests replace it to inject write failures, e.g. a full disk)
_fdopen = os.fdopen

_TEXT_MODES = {"w", "wt"}
_BINARY_MODES = {"wb"}


def file_sha256(path: PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes (what scene folders and the feature cache record of the files they write)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


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
    kept = "the previous file is unchanged" if os.path.lexists(path) else "nothing was written"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp, fd = _open_exclusive(path)
    except OSError as e:
        raise _output_error(path, e, kept) from e
    try:
        if mode in _BINARY_MODES:
            f: IO = _fdopen(fd, "wb")
        else:
            f = _fdopen(fd, "w", encoding=encoding, newline="\n")
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
    except BaseException as e:
        with contextlib.suppress(Exception):
            f.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        os_error = _os_error_in(e)
        if os_error is not None:
            raise _output_error(path, os_error, kept) from e
        raise
    _fsync_dir(path.parent)


def _os_error_in(e: BaseException):
    """The OSError ``e`` is, or that it was raised while handling (a serializer such as ``torch.save`` turns the
    ``ENOSPC`` of its file's ``write`` into a RuntimeError); None if there is none."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError):
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def _output_error(path: Path, e: OSError, kept: str) -> OutputError:
    return OutputError(path, e.strerror or " ".join(str(e).split()) or type(e).__name__, kept)


# ---------------------------------------------------------------------------- folders
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap the paths ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system or the file system cannot (the caller then renames twice)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(b))


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # the same bytes, no space used: the old folder's copy goes with it
    except OSError:
        shutil.copy2(src, dst)


def _carry_over(old: Path, new: Path) -> None:
    """Entries of ``old`` the new folder does not have (a user's own files, or the old scene's transforms.json
    when the new one has no cameras): linked (or copied) into ``new``, so that nothing a user had is lost."""
    for entry in old.iterdir():
        target = new / entry.name
        if os.path.lexists(target) or (entry.name.startswith(".") and entry.name.endswith(".tmp")):
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(entry), target)
        elif entry.is_dir():
            shutil.copytree(entry, target, symlinks=True, copy_function=_link_or_copy)
        elif entry.is_file():
            _link_or_copy(str(entry), str(target))


@contextlib.contextmanager
def atomic_folder(path: PathLike, carry_over: bool = True) -> Iterator[Path]:
    """Build a folder that replaces ``path`` only if the block succeeds: yields a new, empty hidden sibling
    (``.<name>.<random>.tmp``) to write into.

    On success the entries of an existing ``path`` that the block did not write are linked into the new
    folder (``carry_over``: a user's other files survive an ``--overwrite``), then the two folders are
    swapped in one rename (Linux ``renameat2(RENAME_EXCHANGE)``; elsewhere two renames, between which
    ``path`` is briefly absent) and the old one is deleted. On any failure (an exception, Ctrl-C, a full
    disk) the new folder is deleted and ``path`` is exactly as it was; operating-system errors are one
    :class:`~rh3dgs.errors.OutputError` line naming ``path``. A killed process can leave the hidden sibling
    behind (:func:`stale_temp_files`), never a partial ``path``.

    Example::

        with atomic_folder("out/scene") as tmp:
            save_ply(tmp / "semantic.ply", gaussians)
            atomic_save_json(tmp / "rh3dgs.json", meta)   # out/scene now holds both, or neither changed
    """
    path = Path(path)
    check_replaceable(path)
    if os.path.lexists(path) and not path.is_dir():
        raise ConfigError(f"output {path} exists and is not a folder")
    kept = f"{path} is unchanged" if path.is_dir() else "nothing was written"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _tmp_name(path)
        tmp.mkdir()
    except OSError as e:
        raise _output_error(path, e, kept) from e
    try:
        yield tmp
        old = path.is_dir()
        if old:
            with contextlib.suppress(OSError):
                os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
            if carry_over:
                _carry_over(path, tmp)
        _fsync_dir(tmp)
        check_replaceable(path)
        if not old:
            os.rename(tmp, path)
        elif not _exchange(tmp, path):
            aside = _tmp_name(path)
            os.rename(path, aside)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(aside, path)  # the old folder back where it was
                raise
            tmp = aside
    except BaseException as e:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
        if isinstance(e, OutputError):  # a file inside the new folder: say which folder was kept
            raise OutputError(path, e.reason, kept) from e
        os_error = _os_error_in(e)
        if os_error is not None:
            raise _output_error(path, os_error, kept) from e
        raise
    _fsync_dir(path.parent)
    if old:
        shutil.rmtree(tmp, ignore_errors=True)  # the old folder, now under the hidden name


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
