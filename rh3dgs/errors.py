"""One error hierarchy for every user-facing failure in rh3dgs.

Every error names the file / field / value that is wrong and, where it helps, what to
do about it. The CLI prints these without a traceback (``--debug`` shows it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

__all__ = [
    "Rh3dgsError",
    "InputFileError",
    "PlyFormatError",
    "CameraFormatError",
    "FeatureFormatError",
    "ConfigError",
    "ShapeError",
    "NonFiniteError",
    "MissingWeightsError",
    "NativeExtensionError",
    "MemoryLimitError",
    "OutputError",
]


class Rh3dgsError(Exception):
    """Base class of every error rh3dgs raises on purpose."""


class InputFileError(Rh3dgsError):
    """A file given by the user is missing, unreadable or malformed.

    ``path`` is the offending file, ``field`` (optional) the key / property inside it.
    """

    def __init__(self, path: Union[str, Path, None], message: str, field: Optional[str] = None):
        self.path = None if path is None else Path(path)
        self.field = field
        where = f"{self.path}" if self.path is not None else "<input>"
        if field:
            where += f" [{field}]"
        super().__init__(f"{where}: {message}")


class PlyFormatError(InputFileError):
    """A PLY file is truncated, not a PLY, or lacks the 3DGS fields."""


class CameraFormatError(InputFileError):
    """A transforms.json (or other camera file) is malformed or does not match the images."""


class FeatureFormatError(InputFileError):
    """A teacher feature file / text-embedding file is malformed."""


class ConfigError(Rh3dgsError):
    """A configuration value is out of range or inconsistent."""


class ShapeError(Rh3dgsError, ValueError):
    """Tensors handed to an rh3dgs function do not have the documented shapes."""


class NonFiniteError(Rh3dgsError, ValueError):
    """NaN or Inf where finite values are required."""


class MissingWeightsError(Rh3dgsError):
    """Model weights are neither available locally nor downloadable."""


class NativeExtensionError(Rh3dgsError, ImportError):
    """The compiled rh3dgs extension is missing or was built for another torch."""


class MemoryLimitError(Rh3dgsError):
    """A job would not fit in the memory available (or the user's ``--max-memory``).

    Raised by :mod:`rh3dgs.memory`'s preflight before anything large is allocated; the
    message gives the estimate and the setting that would make the job fit.
    """


class OutputError(Rh3dgsError):
    """An output cannot be written: a full disk, a quota, no permission, a read-only file system.

    Raised by :mod:`rh3dgs.io.atomic` (every file and folder rh3dgs writes), which leaves what was
    at ``path`` before unchanged; ``reason`` is the system's word for it (``strerror``).
    """

    def __init__(self, path: Union[str, Path], reason: str, kept: str = ""):
        self.path, self.reason = Path(path), reason
        super().__init__(f"cannot write {self.path}: {reason}" + (f"; {kept}" if kept else ""))
