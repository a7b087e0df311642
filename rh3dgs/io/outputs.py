"""Output paths of commands: nothing that exists is replaced without ``--overwrite``."""
from __future__ import annotations

from pathlib import Path
from typing import Union

from ..errors import ConfigError

__all__ = ["prepare_output_dir", "check_output_file"]


def prepare_output_dir(path: Union[str, Path], overwrite: bool) -> Path:
    """An output folder that is new or empty, or may be overwritten; created if missing."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"output folder {out} already exists and is not empty: pass --overwrite to replace "
                          "its files, or choose another --output")
    out.mkdir(parents=True, exist_ok=True)
    return out


def check_output_file(path: Union[str, Path], overwrite: bool) -> Path:
    """An output file path that does not exist yet, or may be replaced."""
    out = Path(path)
    if out.exists() and not overwrite:
        raise ConfigError(f"output file {out} already exists: pass --overwrite to replace it")
    return out
