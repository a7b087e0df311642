"""The lift's memory model, and the preflight that refuses a lift before it allocates.

:func:`lift_memory_estimate` predicts a lift's peak working memory with the lift's own cache rules
(:func:`rh3dgs.lifting.views.cache_plan`); :func:`preflight_lift` checks it against
:func:`rh3dgs.memory.memory_budget` and, over budget, raises :class:`rh3dgs.errors.MemoryLimitError`
naming the settings that would fit (``--streaming``, ``--views-per-batch``, ``--downscale``).

Training-free lift (float32 unless noted), N Gaussians, V views of H x W, teacher dim D (the passes' D:
``min(D, LiftConfig.subspace)``, plus N * D_teacher * 4 for the features mapped back),
``b`` views per batch (``views_per_batch``, lowered so that b N <= ``max_batch_gaussians``,
4M), ``t`` CPU threads:

* per-Gaussian state: mu, accumulators, IRLS step   N * (3 D + 3) * 4
  and the scene's copy in Z-order (``morton_order``)  N * (59 * 4 + 16)  (SH degree 3; its order, inverse)
* per-thread accumulators (CPU aggregate op)        t * N * (D + 2) * 4
* one batch of projections while they are computed  b * N * 200      (CPU: gsplat's torch projection
                                                                       temporaries; 56 B kept: means2d,
                                                                       conics, depths, radii, ~4 tile ids)
* one batch of teacher maps (upsampled)             b * H * W * D * 4
* the batch's per-pixel temporaries                 b * H * W * (D * 4 + 64)  (VCD feature edges over the
                                                                       maps, render outputs and weights)
* guided upsampling of one map (``guided``)        H * W * D * 4 + its row block (<= 64 MB)
* full cache across passes (when it fits in 2 GB)   V * (N * 56 + H * W * (D + 1) * 4)
  + on CPU the recorded contributions (at most 1 GB) V * H * W * c * 13, c ~ 17 contributions per
                                                     pixel measured on dense surfaces (20 assumed)
* otherwise the compact cache (at most 2 GB)        V * (K * 32 + I * 4 + H * W * 4 + M)
  with K the Gaussians of a view that reach a pixel of weight > 0 (or end one), I their tile
  intersections and M the view's teacher map (as given, or upsampled if that is smaller; dropped
  first when the budget is short): measured K ~ 0.1 N, ~3.5 MB per view at 1M random Gaussians,
  64x64, D = 64. The preflight counts the bound V * (N * 36 + H * W * (D + 1) * 4), at most 2 GB.

Over K processes (``world_size``, :mod:`rh3dgs.lifting.shard`) the estimate is one rank's: its ceil(V / K) views,
with the per-Gaussian terms above over the Gaussians those views can see (bounded by N: in a scene every view
sees whole, all of them), plus the block of ceil(N / K) Gaussians it owns

* owned block: summed sums, means, step, received rows  ceil(N / K) * (4 D + 5) * 4
* the support's copy of the scene                      N * 59 * 4

Which cache a lift uses follows its own rules (:func:`rh3dgs.lifting.views.cache_plan`, from ``LiftConfig``'s
``cache_projections``, ``compact_cache``, ``record_contributions``, ``method`` / ``iters``);
``tests/test_memory.py`` runs lifts and checks that the estimate predicts the cache they chose.

Nothing in the lift is O(N x V): the views are streamed in batches of ``b``, the teacher
maps of a batch are requested from the caller (a callable can read them from the cache),
and only the O(N D) per-Gaussian state and the bounded caches survive a batch. Measured
at 1M Gaussians x 300 views x 64x64 (``benchmarks/bench_scale.py``, docs/profiling.md):
see benchmarks/results/scale.md.

>>> from rh3dgs.lifting.preflight import lift_memory_estimate
>>> est = lift_memory_estimate(100_000, 200, 256, 256, 64)
>>> est.cache, est.peak_bytes > 2e9
('compact', True)
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, List, Optional

from ..errors import MemoryLimitError
from ..memory import format_bytes, memory_budget, over_budget_message
from .config import LiftConfig
from .views import CACHE_BYTES, cache_plan

__all__ = ["MemoryEstimate", "lift_memory_estimate", "preflight_lift"]

_CONTRIBUTIONS_PER_PIXEL = 20  # assumed for the recorded contributions (17 measured on dense surfaces)


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
                    f"(see rh3dgs.lifting.preflight)")
        if self.full_cache:
            return (f"memory estimate: {self.cached_bytes / gb:.2f} GiB with projections and maps cached across "
                    f"passes ({self.streaming_bytes / gb:.2f} GiB streaming; see rh3dgs.lifting.preflight)")
        return (f"memory estimate: {self.streaming_bytes / gb:.2f} GiB streaming + at most "
                f"{self.compact_bytes / gb:.2f} GiB compact cache across passes (per view the Gaussians that "
                f"reach a reliable pixel); caching everything would take {self.cached_bytes / gb:.2f} GiB "
                f"(see rh3dgs.lifting.preflight)")


def lift_memory_estimate(n: int, views: int, height: int, width: int, dim: int, views_per_batch: Optional[int] = None,
                         threads: int = 0, max_batch_gaussians: Optional[int] = None, *,
                         cfg: Optional[LiftConfig] = None,
                         device: str = "cpu", world_size: int = 1) -> MemoryEstimate:
    """:class:`MemoryEstimate` of ``rh3dgs.lifting.lift`` with ``cfg`` (a ``LiftConfig``; None: its defaults).

    ``views_per_batch`` / ``max_batch_gaussians`` override the config's. The cache the lift
    will choose (``cache``) follows lifting.py's rules: full when ``cache_projections`` (None:
    when V N 40 + V H W 4 (1 + D) < 2 GB), else compact when ``compact_cache`` (None: when
    there are IRLS passes), else none; recorded contributions with the full cache on CPU
    when ``record_contributions`` is not False. ``world_size`` K > 1: one rank's share of a distributed lift.
    """
    import torch

    n, views, height, width, dim = (max(0, int(x)) for x in (n, views, height, width, dim))
    K = max(1, int(world_size))
    views = -(-views // K)  # a rank's views (all of them in one process)
    cfg = cfg if cfg is not None else LiftConfig()
    full_dim, sub = dim, int(cfg.subspace or 0)
    dim = min(dim, sub) if sub else dim  # the passes see the maps in the teacher's principal subspace
    t = threads or torch.get_num_threads()
    eff = replace(cfg, views_per_batch=int(views_per_batch if views_per_batch is not None else cfg.views_per_batch),
                  max_batch_gaussians=int(max_batch_gaussians if max_batch_gaussians is not None
                                          else cfg.max_batch_gaussians))
    plan = cache_plan(n, views, height, width, dim, eff, torch.device(device))
    per_batch = plan.views_per_batch
    b = max(1, min(per_batch, views))
    hw = height * width
    detail = {
        # + the scene's copy in Z-order (up to SH degree 3: 59 floats) with the order and its inverse (int64)
        "gaussian_state": n * (3 * dim + 3) * 4 + (n * full_dim * 4 if full_dim > dim else 0) + n * (59 * 4 + 16),
        "thread_accumulators": t * n * (dim + 2) * 4,
        "batch_projections": b * n * 200,
        "batch_teacher_maps": b * hw * dim * 4,
        "batch_temporaries": b * hw * (dim * 4 + 64),
        # guided upsampling of a map (one view at a time): its output and one row block's gathered cells
        # (at most 2^24 floats, at least one row)
        "guided_upsampling": 4 * (hw * dim + min(hw * dim, max(width * dim, 1 << 24))) if eff.guided else 0,
    }
    if K > 1:  # the block this rank owns, and the scene's rows its views see (bounded by the scene)
        owned = -(-n // K)
        detail["owned_block"] = owned * (4 * dim + 5) * 4 + (owned * full_dim * 4 if full_dim > dim else 0)
        detail["gaussian_state"] += n * 59 * 4
    streaming = sum(detail.values())
    detail["batch_views"] = b
    recorded = int(min(CACHE_BYTES / 2, views * hw * _CONTRIBUTIONS_PER_PIXEL * 13))
    cached = streaming + views * (n * 56 + hw * (dim + 1) * 4) + recorded
    compact = int(min(CACHE_BYTES, views * (n * 36 + hw * (dim + 1) * 4)))
    full, record = plan.cache == "full", plan.record
    if full and not record:
        cached -= recorded
        recorded = 0
    return MemoryEstimate(streaming, cached, detail, compact, full, plan.cache, per_batch, recorded if full else 0)


def _detail_text(est: MemoryEstimate) -> str:
    d = est.detail
    owned = f" (+ {format_bytes(d['owned_block'])} for the owned block)" if "owned_block" in d else ""
    parts = [f"{format_bytes(d['gaussian_state'] + d['thread_accumulators'])} per-Gaussian state{owned}",
             f"{format_bytes(d['batch_teacher_maps'] + d['batch_temporaries'] + d['guided_upsampling'])} for a batch of "
             f"{d['batch_views']} teacher map(s) and their temporaries",
             f"{format_bytes(d['batch_projections'])} projections"]
    if est.cache == "full":
        parts.append(f"{format_bytes(est.cached_bytes - est.streaming_bytes)} full cache across passes")
    elif est.cache == "compact":
        parts.append(f"up to {format_bytes(est.compact_bytes)} compact cache across passes")
    return ", ".join(parts)


def preflight_lift(n: int, views: int, height: int, width: int, dim: int, cfg: Optional[LiftConfig] = None, *,
                   threads: int = 0,
                   device: str = "cpu", what: str = "lift", world_size: int = 1) -> MemoryEstimate:
    """Check a lift against :func:`memory_budget` before it starts; returns its :class:`MemoryEstimate`.

    Raises :class:`MemoryLimitError` with the estimate and, best first, the settings that
    would make it fit: ``--streaming`` (no caches across passes: ``LiftConfig(cache_projections=False,
    compact_cache=False)``), ``--views-per-batch k`` (the largest k that fits) and
    ``--downscale f`` (the smallest image downscale that fits with one view per batch, streaming).
    """
    cfg = cfg if cfg is not None else LiftConfig()
    est = lift_memory_estimate(n, views, height, width, dim, cfg=cfg, threads=threads, device=device,
                               world_size=world_size)
    budget, source = memory_budget()
    if est.peak_bytes <= budget:
        return est
    def peak(h: int, w: int, **over: Any) -> int:
        return lift_memory_estimate(n, views, h, w, dim, cfg=replace(cfg, **over), threads=threads,
                                    device=device, world_size=world_size).peak_bytes

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
    share = f" (one of {world_size} processes' share)" if world_size > 1 else ""
    raise MemoryLimitError(over_budget_message(
        est.peak_bytes, f"{what} of {n} Gaussians over {views} views of {width}x{height} (D={dim}){share}",
        _detail_text(est), knobs, budget, source))
