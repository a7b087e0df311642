"""Memory model of rh3dgs' jobs, and the preflight that refuses a job before it allocates.

Every job that can grow with its input checks its estimate against the memory budget
first (:func:`check_memory`): a PLY's vertex count (:func:`ply_load_bytes`, from the
header alone), a lift's Gaussians x views x image size x feature dimension
(:func:`preflight_lift`), a render's image size (:func:`render_memory_estimate`), an image
to decode / undistort / downscale (:func:`image_memory_estimate`) and a teacher feature
map (:func:`feature_map_bytes`, from the ``.npy`` header). A job over budget stops with
:class:`rh3dgs.errors.MemoryLimitError`, whose message has the estimate, the budget and
the setting that would make the job fit (``--views-per-batch``, ``--downscale``,
``--streaming``), before it reads the data.

The budget (:func:`memory_budget`) is the memory the machine can still give this process
(``MemAvailable`` of ``/proc/meminfo``, capped by a cgroup limit) or the user's limit,
whichever is smaller: ``rh3dgs --max-memory 8G ...``, ``with memory_limit("8G"): ...`` or
the environment variable ``RH3DGS_MAX_MEMORY``.

Training-free lift (float32 unless noted), N Gaussians, V views of H x W, teacher dim D,
``b`` views per batch (``views_per_batch``, lowered so that b N <= ``max_batch_gaussians``,
4M), ``t`` CPU threads:

* per-Gaussian state: mu, accumulators, IRLS step   N * (3 D + 3) * 4
* per-thread accumulators (CPU aggregate op)        t * N * (D + 2) * 4
* one batch of projections while they are computed  b * N * 200      (CPU: gsplat's torch projection
                                                                       temporaries; 56 B kept: means2d,
                                                                       conics, depths, radii, ~4 tile ids)
* one batch of teacher maps (upsampled)             b * H * W * D * 4
* the batch's per-pixel temporaries                 b * H * W * (D * 4 + 64)  (VCD feature edges over the
                                                                       maps, render outputs and weights)
* full cache across passes (when it fits in 2 GB)   V * (N * 56 + H * W * (D + 1) * 4)
  + on CPU the recorded contributions (at most 1 GB) V * H * W * c * 13, c ~ 17 contributions per
                                                     pixel measured on dense surfaces (20 assumed)
* otherwise the compact cache (at most 2 GB)        V * (K * 32 + I * 4 + H * W * 4 + M)
  with K the Gaussians of a view that reach a pixel of weight > 0 (or end one), I their tile
  intersections and M the view's teacher map (as given, or upsampled if that is smaller; dropped
  first when the budget is short): measured K ~ 0.1 N, ~3.5 MB per view at 1M random Gaussians,
  64x64, D = 64. The preflight counts the bound V * (N * 36 + H * W * (D + 1) * 4), at most 2 GB.

Which cache a lift uses follows :mod:`rh3dgs.lifting`'s own rules (``LiftConfig``'s
``cache_projections``, ``compact_cache``, ``record_contributions``, ``method`` / ``iters``);
``tests/test_memory.py`` runs lifts and checks that the estimate predicts the cache they chose.

Nothing in the lift is O(N x V): the views are streamed in batches of ``b``, the teacher
maps of a batch are requested from the caller (a callable can read them from the cache),
and only the O(N D) per-Gaussian state and the bounded caches survive a batch. Measured
at 1M Gaussians x 300 views x 64x64 (``benchmarks/bench_scale.py``, docs/profiling.md):
see benchmarks/results/scale.md.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

from .errors import ConfigError, MemoryLimitError

__all__ = [
    "MemoryEstimate",
    "lift_memory_estimate",
    "preflight_lift",
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
]

SizeLike = Union[int, float, str, None]

CACHE_BYTES = 2e9  # the lift's budget for its caches across passes (rh3dgs.lift_views)
_CACHE_BYTES = CACHE_BYTES
_CONTRIBUTIONS_PER_PIXEL = 20  # assumed for the recorded contributions (17 measured on dense surfaces)
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


# ------------------------------------------------------------------------------- lift
@dataclass
class MemoryEstimate:
    """Peak working memory of a lift: ``streaming_bytes`` (nothing cached), ``cached_bytes``
    (everything cached: used when that is under 2 GB) and ``compact_bytes`` (an upper bound of
    the compact cache used otherwise, at most 2 GB)."""

    streaming_bytes: int
    cached_bytes: int
    detail: dict
    compact_bytes: int = 0
    full_cache: bool = False
    """whether the lift caches everything (its own rule, as ``LiftConfig.cache_projections=None``)"""
    cache: str = "none"
    """the cache the lift will use: "full", "compact" or "none" (lifting.py's rules)"""
    views_per_batch: int = 1
    """the views per batch the lift will use (lowered for large scenes, as lifting.py does)"""
    recorded_bytes: int = 0
    """bound of the recorded contributions (full cache on CPU with IRLS passes)"""

    @property
    def peak_bytes(self) -> int:
        """What the preflight checks: streaming + the cache this lift will keep."""
        if self.cache == "full":
            return int(self.cached_bytes)
        if self.cache == "compact":
            return int(self.streaming_bytes + self.compact_bytes)
        return int(self.streaming_bytes)

    def summary(self) -> str:
        gb = 1024 ** 3
        if self.cache == "none" and not self.full_cache:
            return (f"memory estimate: {self.streaming_bytes / gb:.2f} GiB streaming, nothing cached across passes "
                    f"(see rh3dgs.memory)")
        if self.full_cache:
            return (f"memory estimate: {self.cached_bytes / gb:.2f} GiB with projections and maps cached across "
                    f"passes ({self.streaming_bytes / gb:.2f} GiB streaming; see rh3dgs.memory)")
        return (f"memory estimate: {self.streaming_bytes / gb:.2f} GiB streaming + at most "
                f"{self.compact_bytes / gb:.2f} GiB compact cache across passes (per view the Gaussians that "
                f"reach a reliable pixel); caching everything would take {self.cached_bytes / gb:.2f} GiB "
                f"(see rh3dgs.memory)")


def _opt(cfg: Any, name: str, default: Any) -> Any:
    return default if cfg is None else getattr(cfg, name, default)


class _Overrides:
    """``cfg`` (any object with some of ``defaults``' fields) with some attributes replaced."""

    def __init__(self, cfg: Any, defaults: Any, **over: Any):
        self._cfg, self._defaults, self._over = cfg, defaults, over

    def __getattr__(self, name: str) -> Any:
        if name in self._over:
            return self._over[name]
        return getattr(self._cfg, name, getattr(self._defaults, name))


def lift_memory_estimate(n: int, views: int, height: int, width: int, dim: int, views_per_batch: Optional[int] = None,
                         threads: int = 0, max_batch_gaussians: Optional[int] = None, *, cfg: Any = None,
                         device: str = "cpu") -> MemoryEstimate:
    """:class:`MemoryEstimate` of ``rh3dgs.lifting.lift`` with ``cfg`` (a ``LiftConfig``; None: its defaults).

    ``views_per_batch`` / ``max_batch_gaussians`` override the config's. The cache the lift
    will choose (``cache``) follows lifting.py's rules: full when ``cache_projections`` (None:
    when V N 40 + V H W 4 (1 + D) < 2 GB), else compact when ``compact_cache`` (None: when
    there are IRLS passes), else none; recorded contributions with the full cache on CPU
    when there are IRLS passes and ``record_contributions`` is not False.
    """
    import torch

    n, views, height, width, dim = (max(0, int(x)) for x in (n, views, height, width, dim))
    t = threads or torch.get_num_threads()
    vpb = int(views_per_batch if views_per_batch is not None else _opt(cfg, "views_per_batch", 8))
    mbg = int(max_batch_gaussians if max_batch_gaussians is not None else _opt(cfg, "max_batch_gaussians", 4_000_000))
    from .lift_views import cache_plan  # the lift's own rules
    from .lifting import LiftConfig

    plan = cache_plan(n, views, height, width, dim,
                      _Overrides(cfg, LiftConfig(), views_per_batch=vpb, max_batch_gaussians=mbg), torch.device(device))
    per_batch = plan.views_per_batch
    b = max(1, min(per_batch, views))
    hw = height * width
    detail = {
        "gaussian_state": n * (3 * dim + 3) * 4,
        "thread_accumulators": t * n * (dim + 2) * 4,
        "batch_projections": b * n * 200,
        "batch_teacher_maps": b * hw * dim * 4,
        "batch_temporaries": b * hw * (dim * 4 + 64),
    }
    streaming = sum(detail.values())
    detail["batch_views"] = b
    recorded = int(min(_CACHE_BYTES / 2, views * hw * _CONTRIBUTIONS_PER_PIXEL * 13))
    cached = streaming + views * (n * 56 + hw * (dim + 1) * 4) + recorded
    compact = int(min(_CACHE_BYTES, views * (n * 36 + hw * (dim + 1) * 4)))
    full, record = plan.cache == "full", plan.record
    if full and not record:
        cached -= recorded
        recorded = 0
    return MemoryEstimate(streaming, cached, detail, compact, full, plan.cache, per_batch, recorded if full else 0)


def _detail_text(est: MemoryEstimate) -> str:
    d = est.detail
    parts = [f"{format_bytes(d['gaussian_state'] + d['thread_accumulators'])} per-Gaussian state",
             f"{format_bytes(d['batch_teacher_maps'] + d['batch_temporaries'])} for a batch of "
             f"{d['batch_views']} teacher map(s) and their temporaries",
             f"{format_bytes(d['batch_projections'])} projections"]
    if est.cache == "full":
        parts.append(f"{format_bytes(est.cached_bytes - est.streaming_bytes)} full cache across passes")
    elif est.cache == "compact":
        parts.append(f"up to {format_bytes(est.compact_bytes)} compact cache across passes")
    return ", ".join(parts)


def preflight_lift(n: int, views: int, height: int, width: int, dim: int, cfg: Any = None, *, threads: int = 0,
                   device: str = "cpu", what: str = "lift") -> MemoryEstimate:
    """Check a lift against :func:`memory_budget` before it starts; returns its :class:`MemoryEstimate`.

    Raises :class:`MemoryLimitError` with the estimate and, best first, the settings that
    would make it fit: ``--streaming`` (no caches across passes: ``LiftConfig(cache_projections=False,
    compact_cache=False)``), ``--views-per-batch k`` (the largest k that fits) and
    ``--downscale f`` (the smallest image downscale that fits with one view per batch, streaming).
    """
    est = lift_memory_estimate(n, views, height, width, dim, cfg=cfg, threads=threads, device=device)
    budget, source = memory_budget()
    if est.peak_bytes <= budget:
        return est
    from types import SimpleNamespace

    base = {k: _opt(cfg, k, v) for k, v in (("method", "robust"), ("iters", 3), ("cache_projections", None),
                                             ("compact_cache", None), ("record_contributions", None),
                                             ("max_batch_gaussians", 4_000_000), ("views_per_batch", 8))}

    def peak(h: int, w: int, **over: Any) -> int:
        c = SimpleNamespace(**{**base, **over})
        return lift_memory_estimate(n, views, h, w, dim, cfg=c, threads=threads, device=device).peak_bytes

    stream = {"cache_projections": False, "compact_cache": False}
    knobs: List[str] = []
    if est.cache != "none" and peak(height, width, **stream) <= budget:
        knobs.append(f"--streaming (recompute every view in every pass, no cache: "
                     f"{format_bytes(peak(height, width, **stream))})")
    for b in range(est.views_per_batch - 1, 0, -1):
        for extra, label in (({}, ""), (stream, " --streaming")):
            if peak(height, width, views_per_batch=b, **extra) <= budget:
                knobs.append(f"--views-per-batch {b}{label} "
                             f"({format_bytes(peak(height, width, views_per_batch=b, **extra))})")
                break
        else:
            continue
        break
    f = 2
    while f <= max(height, width):
        p = peak(max(1, height // f), max(1, width // f), views_per_batch=1, **stream)
        if p <= budget:
            knobs.append(f"--downscale {f} (images of {max(1, width // f)}x{max(1, height // f)}, one view per "
                         f"batch, streaming: {format_bytes(p)})")
            break
        f *= 2
    if not knobs:
        per_gaussian = est.detail["gaussian_state"] + est.detail["thread_accumulators"]
        knobs.append(f"fewer Gaussians or a smaller teacher dimension: the per-Gaussian state of {n} Gaussians x "
                     f"D={dim} alone takes {format_bytes(per_gaussian)} (fewer threads, OMP_NUM_THREADS, shrinks "
                     f"its per-thread part), or a machine with more memory")
    raise MemoryLimitError(over_budget_message(
        est.peak_bytes, f"{what} of {n} Gaussians over {views} views of {width}x{height} (D={dim})",
        _detail_text(est), knobs, budget, source))


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
