"""Memory model of the long jobs, printed before they start (see docs/native.md).

Training-free lift (float32 unless noted), N Gaussians, V views of H x W, teacher dim D,
``b`` views per batch (``views_per_batch``, lowered so that b N <= ``max_batch_gaussians``,
4M), ``t`` CPU threads:

* per-Gaussian state: mu, accumulators, IRLS step   N * (3 D + 3) * 4
* per-thread accumulators (CPU aggregate op)        t * N * (D + 2) * 4
* one batch of projections while they are computed  b * N * 200      (CPU: gsplat's torch projection
                                                                       temporaries; 56 B kept: means2d,
                                                                       conics, depths, radii, ~4 tile ids)
* one batch of teacher maps (upsampled)             b * H * W * D * 4
* full cache across passes (when it fits in 2 GB)   V * (N * 56 + H * W * (D + 1) * 4)
  + on CPU the recorded contributions (at most 1 GB) V * H * W * c * 13, c ~ 17 contributions per
                                                     pixel measured on dense surfaces (20 assumed)
* otherwise the compact cache (at most 2 GB)        V * (K * 32 + I * 4 + H * W * 4 + M)
  with K the Gaussians of a view that reach a pixel of weight > 0 (or end one), I their tile
  intersections and M the view's teacher map (as given, or upsampled if that is smaller; dropped
  first when the budget is short): measured K ~ 0.1 N, ~3.5 MB per view at 1M random Gaussians,
  64x64, D = 64.

Nothing in the lift is O(N x V): the views are streamed in batches of ``b``, the teacher
maps of a batch are requested from the caller (a callable can read them from the cache),
and only the O(N D) per-Gaussian state and the bounded caches survive a batch. Measured
at 1M Gaussians x 300 views x 64x64 (``benchmarks/bench_scale.py``, docs/profiling.md):
see benchmarks/results/scale.md.

On disk (:func:`ply_bytes_per_gaussian`, rh3dgs.io.ply): a 3DGS PLY row is
``4 * (14 + 3 K)`` bytes for the standard float32 fields (K = 0, 3, 8, 15 higher SH
coefficients per channel; +12 with normals) plus ``2 d`` for d float16 latents (the
default; ``4 d`` with ``latent_dtype="float32"``): SH degree 3 + 16 latents = 268 B instead
of 300 B, SH degree 0 + 16 latents = 88 B instead of 120 B. Loaded, every latent is float32
again (``4 d`` bytes per Gaussian in memory).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MemoryEstimate", "lift_memory_estimate", "ply_bytes_per_gaussian"]


_CACHE_BYTES = 2e9  # rh3dgs.lifting's budget for the caches across passes
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

    def summary(self) -> str:
        gb = 1024 ** 3
        if self.full_cache:
            return (f"memory estimate: {self.cached_bytes / gb:.2f} GiB with projections and maps cached across "
                    f"passes ({self.streaming_bytes / gb:.2f} GiB streaming; see rh3dgs.memory)")
        return (f"memory estimate: {self.streaming_bytes / gb:.2f} GiB streaming + at most "
                f"{self.compact_bytes / gb:.2f} GiB compact cache across passes (per view the Gaussians that "
                f"reach a reliable pixel); caching everything would take {self.cached_bytes / gb:.2f} GiB "
                f"(see rh3dgs.memory)")


def lift_memory_estimate(n: int, views: int, height: int, width: int, dim: int, views_per_batch: int = 8,
                         threads: int = 0, max_batch_gaussians: int = 4_000_000) -> MemoryEstimate:
    """:class:`MemoryEstimate` of ``rh3dgs.lifting.lift`` (defaults of :class:`rh3dgs.lifting.LiftConfig`)."""
    t = threads or torch.get_num_threads()
    b = max(1, min(views_per_batch, views, max_batch_gaussians // max(n, 1)))
    detail = {
        "gaussian_state": n * (3 * dim + 3) * 4,
        "thread_accumulators": t * n * (dim + 2) * 4,
        "batch_projections": b * n * 200,
        "batch_teacher_maps": b * height * width * dim * 4,
    }
    streaming = sum(detail.values())
    recorded = min(_CACHE_BYTES / 2, views * height * width * _CONTRIBUTIONS_PER_PIXEL * 13)
    cached = streaming + views * (n * 56 + height * width * (dim + 1) * 4) + int(recorded)
    compact = int(min(_CACHE_BYTES, views * (n * 36 + height * width * (dim + 1) * 4)))
    full = views * n * 40 + views * height * width * 4 * (1 + dim) < _CACHE_BYTES  # rh3dgs.lifting's rule
    return MemoryEstimate(streaming, cached, detail, compact, full)


def ply_bytes_per_gaussian(sh_degree: int = 3, n_latents: int = 16, latent_dtype: str = "float16",
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
