"""Output paths of commands: the one check every command runs on its outputs, before any work.

An output passes when all of these hold (else one :class:`~rh3dgs.errors.ConfigError` line names it):

1. **Inputs are never outputs.** The command's ``inputs`` (the files and folders it reads) and the
   output are resolved through symbolic links (:func:`os.path.realpath`); an output that *is* an
   input, *contains* one (an output folder above an input) or *lies inside* one (a path under an
   input folder) is refused, with or without ``--overwrite``: ``--overwrite`` means "replace my
   earlier output", never "replace what this command is reading". Hard links and bind mounts to an
   input are caught by comparing device and inode.
2. **Only regular files (and folders) are replaced.** A device, FIFO, socket, or a symbolic link to
   one is refused with or without ``--overwrite`` (:func:`rh3dgs.io.atomic.check_replaceable`, which
   :func:`~rh3dgs.io.atomic.atomic_write` applies again when it writes).
3. **Nothing that exists is replaced without ``--overwrite``.**

Example::

    inputs = scene_inputs(args.scene)
    out = check_output_file(args.output, args.overwrite, inputs)   # before loading anything
    ...
    scene.export_ply(out)
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple, Union

from ..errors import ConfigError
from .atomic import check_replaceable

__all__ = ["check_output_file", "check_output_dir", "prepare_output_dir", "check_not_input", "scene_inputs",
           "check_disk_space", "distinct_names"]

PathLike = Union[str, os.PathLike]


def _real(path: PathLike) -> str:
    return os.path.realpath(os.path.abspath(os.fspath(path)))


def _inside(child: str, parent: str) -> bool:
    """``child`` is ``parent`` or below it (both resolved)."""
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def _same_file(a: PathLike, b: PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_not_input(output: PathLike, inputs: Iterable[Optional[PathLike]] = (), what: str = "output") -> None:
    """Raise :class:`ConfigError` if ``output`` is, contains or lies inside one of ``inputs`` (after
    resolving symbolic links; ``None`` entries are skipped). Independent of ``--overwrite``.

    Example::

        check_not_input("scene/semantic.ply", ["scene/semantic.ply"])   # ConfigError: ... is the input ...
        check_not_input("data", ["data/transforms.json"])              # ConfigError: ... contains the input ...
    """
    out_real = _real(output)
    for inp in inputs:
        if inp is None:
            continue
        in_real = _real(inp)
        if out_real == in_real or _same_file(output, inp):
            how = "is"
        elif _inside(in_real, out_real):
            how = "contains"
        elif _inside(out_real, in_real):
            how = "lies inside"
        else:
            continue
        shown = f"{inp}" + (f" (resolved: {in_real})" if in_real != os.path.abspath(os.fspath(inp)) else "")
        via = f" (resolved: {out_real})" if out_real != os.path.abspath(os.fspath(output)) else ""
        raise ConfigError(f"{what} {output}{via} {how} the input {shown}: a command never writes over what it "
                          f"reads, even with --overwrite; put the {what} outside its inputs")


def _check_writable_path(out: Path, inputs: Iterable[Optional[PathLike]]) -> None:
    """Rules 1 and 2 of the module docstring, and a path that can be created (no file on the way)."""
    check_not_input(out, inputs)
    check_replaceable(out)
    parent = next((p for p in out.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ConfigError(f"output {out} cannot be created: {parent} is a file, not a folder")


def check_output_file(path: PathLike, overwrite: bool, inputs: Iterable[Optional[PathLike]] = ()) -> Path:
    """An output file path that may be written: not one of ``inputs`` (nor inside / above one), not a
    device / FIFO / socket, not a folder, and new unless ``overwrite``. Nothing is created."""
    out = Path(path)
    _check_writable_path(out, inputs)
    if out.is_dir():
        raise ConfigError(f"output {out} is a folder: give a file name (e.g. {out / 'selection.ply'})")
    if out.exists() and not overwrite:
        raise ConfigError(f"output file {out} already exists: pass --overwrite to replace it")
    return out


def check_output_dir(path: PathLike, overwrite: bool, inputs: Iterable[Optional[PathLike]] = ()) -> Path:
    """An output folder that may be written: not one of ``inputs`` (nor inside / above one), a folder
    if it exists, and new or empty unless ``overwrite``. Nothing is created (see :func:`prepare_output_dir`)."""
    out = Path(path)
    _check_writable_path(out, inputs)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"output folder {out} already exists and is not empty: pass --overwrite to replace "
                          "its files, or choose another --output")
    return out


def prepare_output_dir(path: PathLike, overwrite: bool, inputs: Iterable[Optional[PathLike]] = ()) -> Path:
    """:func:`check_output_dir`, then create the folder if missing."""
    out = check_output_dir(path, overwrite, inputs)
    out.mkdir(parents=True, exist_ok=True)
    return out


def check_disk_space(path: PathLike, need: float, what: str) -> None:
    """Raise :class:`ConfigError` (one line) if the file system that will hold ``path`` (or its nearest existing
    parent) has less than ``need`` bytes free: a job whose outputs cannot fit is refused before it starts.

    Example::

        check_disk_space("out/data", 2e12, "a synthetic dataset of 10000000 views")   # ConfigError: ... free
    """
    import shutil

    from ..memory import format_bytes

    where = next((p for p in (Path(path), *Path(path).absolute().parents) if p.exists()), None)
    if where is None:
        return
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return  # the writer reports what the system refuses
    if need > free:
        raise ConfigError(f"{path}: {what} needs ~{format_bytes(need)} on disk, the file system of {where} has "
                          f"{format_bytes(free)} free")


def distinct_names(names: Sequence[str], what: str = "outputs") -> Tuple[List[str], Optional[str]]:
    """``names`` (output file names or stems of one folder) made distinct, and a note saying what changed (None
    when nothing did): a name equal to an earlier one - or equal but for case, one file on a case-insensitive
    file system - gets ``-<k>``, k its position in the list. Two inputs never write one output silently.

    >>> distinct_names(["a", "b", "A", "a"], "views")
    (['a', 'b', 'A-2', 'a-3'], 'views named like an earlier one (A, a) are written as A-2, a-3')
    """
    seen = {n.casefold() for n in names}
    taken, out, changed = set(), [], []
    for k, n in enumerate(names):
        name = n
        if name.casefold() in taken:
            name = f"{n}-{k}"
            while name.casefold() in taken or name.casefold() in seen:
                name += "_"
            changed.append((n, name))
        taken.add(name.casefold())
        out.append(name)
    if not changed:
        return out, None
    shown = lambda xs: ", ".join(xs[:5]) + (", ..." if len(xs) > 5 else "")  # noqa: E731
    return out, (f"{what} named like an earlier one ({shown([a for a, _ in changed])}) are written as "
                 f"{shown([b for _, b in changed])}")


def scene_inputs(path: PathLike) -> List[Path]:
    """The paths that opening ``path`` with :func:`rh3dgs.load` reads, for :func:`check_not_input`.

    * a scene folder (or its ``rh3dgs.json``): ``rh3dgs.json`` and every entry now in the folder
      (``semantic.ply``, ``field.npz``, ``transforms.json``...), so an output may be a *new* name in
      the folder but never one of its files;
    * a ``.ply``: the file and the ``transforms.json`` next to it (read for its cameras);
    * a nerfstudio ``config.yml``: the file and every entry of its run folder (checkpoints...);
    * anything else: the path itself (the loader then says what is wrong with it).
    """
    p = Path(path)
    try:
        is_dir, is_file = p.is_dir(), p.is_file()
    except (OSError, ValueError):
        return [p]
    if is_file and p.suffix.lower() in (".ply", ".spz"):  # rh3dgs.io.ply.SPLAT_SUFFIXES
        return [p, p.parent / "transforms.json"]
    folder = p if is_dir else (p.parent if is_file and (p.name == "rh3dgs.json" or
                                                          p.suffix.lower() in (".yml", ".yaml")) else None)
    if folder is None:
        return [p]
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        entries = []
    return [p, folder / "rh3dgs.json", *entries] if is_file else [folder / "rh3dgs.json", *entries]
