"""Memory model of the long jobs, printed before they start (see docs/native.md).

Training-free lift (float32 unless noted), N Gaussians, V views of H x W, teacher dim D,
``b`` views per batch, ``t`` CPU threads:

* per-Gaussian state: mu, accumulators          N * (2 D + 3) * 4
* per-thread accumulators (CPU aggregate op)     t * N * (D + 2) * 4
* one batch of projections                       b * N * 40        (means2d, conics, depths, radii, opacities)
* tile intersections of a batch (~4 / Gaussian)  b * N * 4 * 4
* one batch of teacher maps (upsampled)          b * H * W * D * 4
* caching across passes (optional)               V * (N * 56 + H * W * (D + 1) * 4)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MemoryEstimate", "lift_memory_estimate"]


@dataclass
class MemoryEstimate:
    streaming_bytes: int
    cached_bytes: int
    detail: dict

    def summary(self) -> str:
        gb = 1024 ** 3
        return (f"memory estimate: {self.streaming_bytes / gb:.2f} GiB streaming, "
                f"{self.cached_bytes / gb:.2f} GiB with projections and maps cached across passes "
                f"(cached when under 2 GB; see rh3dgs.memory)")


def lift_memory_estimate(n: int, views: int, height: int, width: int, dim: int, views_per_batch: int = 8,
                         threads: int = 0) -> MemoryEstimate:
    t = threads or torch.get_num_threads()
    b = min(views_per_batch, views)
    detail = {
        "gaussian_state": n * (2 * dim + 3) * 4,
        "thread_accumulators": t * n * (dim + 2) * 4,
        "batch_projections": b * n * 40 + b * n * 16,
        "batch_teacher_maps": b * height * width * dim * 4,
    }
    streaming = sum(detail.values())
    cached = streaming + views * (n * 56 + height * width * (dim + 1) * 4)
    return MemoryEstimate(streaming, cached, detail)
