"""Memory model of rh3dgs' jobs, and the preflight that refuses a job before it allocates.

Every job that can grow with its input checks its estimate against the memory budget
first (:func:`check_memory`): a PLY's vertex count (:func:`ply_load_bytes`, from the
header alone), a lift's Gaussians x views x image size x feature dimension
(:func:`rh3dgs.lifting.preflight.preflight_lift`), a render's image size (:func:`render_memory_estimate`), an image
to decode / undistort / downscale (:func:`image_memory_estimate`) and a teacher feature
map (:func:`feature_map_bytes`, from the ``.npy`` header). A job over budget stops with
:class:`rh3dgs.errors.MemoryLimitError`, whose message has the estimate, the budget and
the setting that would make the job fit (``--views-per-batch``, ``--downscale``,
``--streaming``), before it reads the data.

The budget (:func:`memory_budget`) is the memory the machine can still give this process
(``MemAvailable`` of ``/proc/meminfo``, capped by a cgroup limit) or the user's limit,
whichever is smaller: ``rh3dgs --max-memory 8G ...``, ``with memory_limit("8G"): ...`` or
the environment variable ``RH3DGS_MAX_MEMORY``.

The lift's own model (its caches, batches and per-Gaussian state) and its preflight are in
:mod:`rh3dgs.lifting.preflight`.

On disk (:func:`ply_bytes_per_gaussian`, rh3dgs.io.ply): a 3DGS PLY row is
``4 * (14 + 3 K)`` bytes for the standard float32 fields (K = 0, 3, 8, 15 higher SH
coefficients per channel; +12 with normals) plus ``4 d`` for d float32 latents (the
default; ``2 d`` with the rh3dgs-only ``latent_dtype="float16"``): SH degree 3 + 16 latents =
300 B (268 B compact), SH degree 0 + 16 latents = 120 B (88 B compact). Loaded, every latent
is float32 (``4 d`` bytes per Gaussian in memory).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import os
import re
import stat
from pathlib import Path
from typing import Iterator, Optional, Sequence, Tuple, Union

from .errors import ConfigError, MemoryLimitError

__all__ = [
    "ply_bytes_per_gaussian",
    "ply_load_bytes",
    "render_memory_estimate",
    "image_memory_estimate",
    "feature_map_bytes",
    "available_memory",
    "memory_budget",
    "memory_limit",
    "parse_size",
    "format_bytes",
    "check_memory",
    "PARSED_TEXT_FACTOR",
    "read_text_sized",
]

SizeLike = Union[int, float, str, None]

_MAX_LIMIT = contextvars.ContextVar("rh3dgs_max_memory", default=None)
ENV_MAX_MEMORY = "RH3DGS_MAX_MEMORY"


# ------------------------------------------------------------------------------- budget
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_size(value: SizeLike, what: str = "--max-memory") -> Optional[int]:
    """``"8G"``, ``"512MiB"``, ``"1.5T"``, ``"2e9"`` or an int -> bytes (K/M/G/T are powers of 1024);
    None / "" -> None. Raises :class:`ConfigError` naming ``what`` for anything else."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a size such as 8G or 512M, got {value!r}")
    if isinstance(value, (int, float)):
        num, mult = float(value), 1
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtTpP]?)(?:i?[bB])?\s*", value)
        if m is None:
            raise ConfigError(f"{what}: expected a size such as 8G, 512M or 2e9 (bytes), got {value!r}")
        num, mult = float(m.group(1)), _UNITS[m.group(2).lower()]
    if not math.isfinite(num) or num <= 0:
        raise ConfigError(f"{what}: must be a positive size, got {value!r}")
    return int(num * mult)


def format_bytes(n: float) -> str:
    """Human-readable binary size: ``format_bytes(3 * 2**30) == "3.00 GiB"``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} B" if unit == "B" else (f"{n:.2f} {unit}" if abs(n) < 100 else f"{n:.0f} {unit}")
        n /= 1024
    raise AssertionError  # pragma: no cover


def _read_int(path: str) -> Optional[int]:
    try:
        text = Path(path).read_text().strip()
    except (OSError, ValueError):
        return None
    return int(text) if text.isdigit() else None


def available_memory() -> int:
    """Bytes the machine can still give this process: ``MemAvailable`` (``/proc/meminfo``),
    capped by the cgroup (v2 or v1) limit minus its usage; psutil elsewhere."""
    avail: Optional[int] = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            import psutil

            avail = int(psutil.virtual_memory().available)
        except Exception:  # pragma: no cover - no /proc and no psutil
            avail = 1 << 62
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < (1 << 60):
            avail = min(avail, max(0, limit - usage))
    return avail


@contextlib.contextmanager
def memory_limit(limit: SizeLike) -> Iterator[Optional[int]]:
    """Within the block, jobs refuse to start when their estimate exceeds ``limit`` (bytes or
    ``"8G"``; None: only the machine's memory). What ``rh3dgs --max-memory`` sets."""
    token = _MAX_LIMIT.set(parse_size(limit))
    try:
        yield _MAX_LIMIT.get()
    finally:
        _MAX_LIMIT.reset(token)


def memory_budget() -> Tuple[int, str]:
    """(bytes a job may use, where that number comes from) - the smaller of the machine's
    available memory and the user's limit (:func:`memory_limit`, ``RH3DGS_MAX_MEMORY``)."""
    avail = available_memory()
    user, src = _MAX_LIMIT.get(), "--max-memory"
    if user is None and os.environ.get(ENV_MAX_MEMORY, "").strip():
        user, src = parse_size(os.environ[ENV_MAX_MEMORY], ENV_MAX_MEMORY), ENV_MAX_MEMORY
    if user is not None and user < avail:
        return user, f"the limit set by {src} ({format_bytes(user)})"
    return avail, f"the memory available on this machine ({format_bytes(avail)})"


def check_memory(need: float, what: str, *, detail: str = "", knobs: Sequence[str] = ()) -> None:
    """Raise :class:`MemoryLimitError` if ``need`` bytes exceed :func:`memory_budget`.

    The message reads ``<what>: memory estimate <need> (<detail>) exceeds <budget>; to fit:
    <knob>; <knob>`` (``knobs`` are the settings that would make it fit, best first).
    """
    budget, source = memory_budget()
    if need <= budget:
        return
    raise MemoryLimitError(over_budget_message(need, what, detail, knobs, budget, source))


def over_budget_message(need: float, what: str, detail: str, knobs: Sequence[str],
                        budget: Optional[int] = None, source: Optional[str] = None) -> str:
    if budget is None:
        budget, source = memory_budget()
    msg = f"{what}: memory estimate {format_bytes(need)}" + (f" ({detail})" if detail else "")
    msg += f" exceeds {source}"
    if knobs:
        msg += "; to fit: " + "; or ".join(knobs)
    return msg


# ------------------------------------------------------------------------------- other jobs
def ply_bytes_per_gaussian(sh_degree: int = 3, n_latents: int = 16, latent_dtype: str = "float32",
                           normals: bool = False) -> int:
    """Bytes of one Gaussian's row in a PLY written by :func:`rh3dgs.io.ply.save_ply` (no extra fields).

    The file adds a header of a few hundred bytes (one line per property).
    """
    if sh_degree not in (0, 1, 2, 3):
        raise ValueError(f"sh_degree must be 0, 1, 2 or 3, got {sh_degree}")
    if latent_dtype not in ("float16", "float32"):
        raise ValueError(f"latent_dtype must be 'float16' or 'float32', got {latent_dtype!r}")
    k = (sh_degree + 1) ** 2 - 1
    return 4 * (14 + 3 * k + (3 if normals else 0)) + (2 if latent_dtype == "float16" else 4) * n_latents


def ply_load_bytes(n: int, n_standard: int, n_latents: int = 0, extra_bytes: int = 0, ascii_row_bytes: int = 0) -> int:
    """Peak memory of :func:`rh3dgs.io.ply.load_ply` for ``n`` rows: the float32 block of the
    ``n_standard`` standard properties twice (read, then split into tensors), the float32
    latents with one column temporary, ``extra_bytes`` per row of kept extra properties and,
    for ASCII files, the parsed text rows (``ascii_row_bytes``; binary files are memory-mapped)."""
    return int(n) * (8 * n_standard + 4 * n_latents + (4 if n_latents else 0) + extra_bytes + 2 * ascii_row_bytes)


def render_memory_estimate(n: int, height: int, width: int, channels: int = 0, views: int = 1) -> int:
    """Peak memory of one ``rh3dgs.render`` call: the projection (~200 B per Gaussian and view
    while it is computed), ~16 float32 planes per pixel (RGB, alpha, depth moments, the
    intersections' pixel ranges) plus the ``channels`` feature planes, twice for the output's
    copies (PNG conversion)."""
    return int(views) * (int(n) * 200 + 2 * int(height) * int(width) * (16 + int(channels)) * 4)


def image_memory_estimate(height: int, width: int, undistort: bool = False) -> int:
    """Peak memory of reading one H x W RGB image as float (8-bit decode + float32 [3, H, W] twice),
    plus, with ``undistort``, OpenCV's float32 remap tables and the undistorted copy."""
    hw = int(height) * int(width)
    return hw * (3 + 2 * 12) + (hw * (8 + 3) if undistort else 0)


def feature_map_bytes(shape: Sequence[int], itemsize: int) -> int:
    """Peak memory of reading and checking one teacher feature map of ``shape`` [h, w, D] stored with
    ``itemsize`` bytes per value: the array, its float32 copy, the finite mask and the float64 squares
    of the norm check."""
    count = 1
    for s in shape:
        count *= max(0, int(s))
    return count * (int(itemsize) + (4 if itemsize != 4 else 0) + 1 + 8)


#: Peak bytes of Python objects per byte of JSON / YAML text parsed (``json.loads``, ``yaml.load``): a list of
#: floats ``0.123,`` holds a 24-byte float and an 8-byte pointer per 6 bytes of text (~5x); the worst short
#: tokens (``[],`` -> a 56-byte list) reach ~20x.
PARSED_TEXT_FACTOR = 24


def read_text_sized(path: Union[str, os.PathLike], what: str, factor: int = PARSED_TEXT_FACTOR,
                    encoding: str = "utf-8") -> str:
    """The UTF-8 text of ``path`` (a JSON / YAML file to parse), after checking ``factor`` x its size against
    the budget (:func:`check_memory`): a multi-gigabyte transforms.json or config.yml is refused from its
    size, before it is read or parsed. Raises OSError / UnicodeDecodeError as ``Path.read_text`` does, and
    ValueError for anything but a regular file.

    Example::

        meta = json.loads(read_text_sized("scene/rh3dgs.json", "a scene description"))
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):  # a FIFO or a device has no size to check and may never end
        raise ValueError(f"{path} is not a regular file")
    size = st.st_size
    check_memory(size * factor, f"{path}: parsing {what} of {format_bytes(size)}",
                 detail=f"~{factor} bytes of parsed objects per byte of text")
    return Path(path).read_text(encoding=encoding)
