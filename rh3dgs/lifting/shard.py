"""A process's share of a lift: its views, the Gaussians they can see, and the block of Gaussians it owns.

The lift is a sum over views per Gaussian and per pass (:mod:`rh3dgs.lifting.algorithm`). Over K processes
(ranks of a ``torch.distributed`` group, :mod:`rh3dgs.distributed`), rank r

* renders and accumulates its **views**, a contiguous share ``B / K`` of the cameras (consecutive frames of
  a capture see the same part of the scene, so a share's views see few of its Gaussians);
* keeps its per-Gaussian sums only over the **Gaussians its views can see** (``seen``: projected radius > 0
  in one of them, :func:`rh3dgs.rendering.visible`; a render of those views with only these Gaussians is
  the same render), rendering that sub-scene;
* **owns** a contiguous block of ``N / K`` rows of the scene in Z-order (a compact region of space): once per
  pass the ranks' sums go to the owners (:meth:`LiftShard.combine`, a sparse reduce-scatter), the owner
  finishes its rows (validity, the IRLS step, the fill, the latents), and the ranks read back the new means
  of the Gaussians they see (:meth:`LiftShard.spread`).

No rank holds N x D sums unless its views see the whole scene; a rank's memory is O((seen + N / K) D).
The statistics the finishing needs across blocks are small: the quantile of the step angles (its first 1M
values, as one process takes them), the PCA's k x k moments (summed), and for the fill the observed mask and
visibilities ([N] each, gathered) and the neighbours' features (fetched per chunk). In one process the same
methods are the identity: :func:`rh3dgs.lifting.lift` runs one code path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .. import distributed as D
from ..cameras import Cameras
from ..errors import ConfigError
from ..gaussians import Gaussians
from ..rendering import visible
from ..teachers.maps import TeacherMaps, get_map
from .config import LiftConfig

__all__ = ["LiftShard"]


@dataclass
class LiftShard:
    """This process's views, seen Gaussians and owned block (module docstring); ``group`` None: one process."""

    group: Optional[D.DistInfo]
    views: List[int]
    """this rank's cameras (indices into the lift's cameras)"""
    start: int
    end: int
    """the rows of the (Z-ordered) scene this rank owns"""
    seen: Optional[Tensor] = None
    """sorted rows of the Gaussians its views can see (None: the whole scene, one process)"""
    bounds: List[int] = field(default_factory=list)
    exchange: Optional[D.RowExchange] = None
    shares: Dict[str, List[int]] = field(default_factory=dict)
    """per rank: "views", "owned" and "seen" counts (every rank has them)"""

    @classmethod
    def make(cls, gaussians: Gaussians, cameras: Cameras, cfg: LiftConfig,
             group: Optional[D.DistInfo]) -> "LiftShard":
        """The share of this process (collective in a group: every rank calls it with the same scene)."""
        B, N = len(cameras), len(gaussians)
        if group is None:
            return cls(None, list(range(B)), 0, N)
        K, r = group.world_size, group.rank
        if B < K:
            raise ConfigError(f"a lift over {K} processes needs at least {K} views, there are {B}: run it on at "
                              f"most {B} processes")
        a, b = D.shard(B, K, r)
        views = list(range(a, b))
        bounds = D.block_bounds(N, K)
        seen = torch.zeros(N, dtype=torch.bool, device=gaussians.device)
        per = max(1, min(int(cfg.views_per_batch), int(cfg.max_batch_gaussians) // max(N, 1)))
        with torch.no_grad():
            for s in range(0, len(views), per):  # projection only: ~200 B per (view, Gaussian) while it runs
                seen |= visible(gaussians, cameras[views[s:s + per]]).any(0)
        rows = torch.nonzero(seen).flatten()
        shares = D.all_gather_object((len(views), bounds[r + 1] - bounds[r], int(rows.numel())))
        out = cls(group, views, bounds[r], bounds[r + 1], rows, bounds,
                  D.RowExchange(rows, bounds, "lift sums"),
                  {k: [s[i] for s in shares] for i, k in enumerate(("views", "owned", "seen"))})
        return out

    # ------------------------------------------------------------------ what this rank renders
    @property
    def is_main(self) -> bool:
        return self.group is None or self.group.is_main

    @property
    def world(self) -> int:
        return 1 if self.group is None else self.group.world_size

    def scene(self, gaussians: Gaussians) -> Gaussians:
        """The Gaussians this rank renders (those its views can see; the scene itself, not a copy, when they see all)."""
        return gaussians if self.seen is None or len(self.seen) == len(gaussians) else gaussians[self.seen]

    def cameras(self, cameras: Cameras) -> Cameras:
        return cameras if self.group is None else cameras[self.views]

    def maps(self, teacher_maps: TeacherMaps) -> TeacherMaps:
        """The teacher maps of this rank's views, in their order (read on demand)."""
        if self.group is None:
            return teacher_maps
        views = self.views
        return lambda j: get_map(teacher_maps, views[j])

    def label(self, description: str) -> str:
        return description if self.group is None else f"{description} (rank {self.group.rank} of {self.world})"

    # ------------------------------------------------------------------ per pass
    def combine(self, sums: Tuple[Tensor, ...], keep: int = 3) -> Tuple[Optional[Tensor], ...]:
        """A pass's sums over this rank's seen Gaussians -> the sums over every view of this rank's block (the
        first ``keep`` of them; the others None). One process: ``sums`` as they are."""
        if self.group is None:
            return sums
        out = tuple(self.exchange.to_owners(t) for t in sums[:keep])
        return out + (None,) * (len(sums) - keep)

    def spread(self, block: Tensor) -> Tensor:
        """This rank's block of a per-Gaussian tensor -> its rows for the Gaussians this rank sees."""
        return block if self.group is None else self.exchange.from_owners(block)

    def gather(self, block: Tensor) -> Tensor:
        """Every rank's block, in order: the [N, ...] tensor (one process: ``block``)."""
        if self.group is None:
            return block
        return D.all_gather_rows(block, self.shares["owned"])

    @property
    def total(self):
        """Sum over the ranks (in place), for the blocks' partial sums; None in one process."""
        return None if self.group is None else D.all_reduce

    def any(self, mask: Tensor) -> bool:
        """Whether ``mask`` (this rank's block) is true anywhere."""
        if self.group is None:
            return bool(mask.any())
        return bool(D.all_reduce(mask.sum().reshape(1).to(torch.int64)).item() > 0)

    def quantile(self, values: Tensor, mask: Tensor, q: float, limit: int = 1_000_000) -> float:
        """The ``q`` quantile of ``values[mask]``'s first ``limit`` entries over the scene in row order (0 when
        none): the blocks' first ones, as one process takes them (``torch.quantile`` takes at most 2^24)."""
        if self.group is None:
            return float(torch.quantile(values[mask][:limit], q)) if bool(mask.any()) else 0.0
        v = values[mask]
        counts = D.all_gather_rows(torch.tensor([v.numel()], dtype=torch.int64, device=v.device), [1] * self.world)
        take, left = [], limit
        for c in counts.tolist():
            take.append(min(int(c), left))
            left -= take[-1]
        if sum(take) == 0:
            return 0.0
        first = D.all_gather_rows(v[:take[self.group.rank]], take)
        return float(torch.quantile(first, q))

    def fill_source(self, block: Tensor) -> Optional["_BlockRows"]:
        """The fill's :class:`rh3dgs.lifting.fill.RowSource` over the ranks' blocks ``block`` (None: one process)."""
        return None if self.group is None else _BlockRows(block, self.bounds)

    def info(self) -> Dict[str, object]:
        if self.group is None:
            return {}
        return {"world_size": self.world, "views_by_rank": self.shares["views"],
                "owned_by_rank": self.shares["owned"], "seen_by_rank": self.shares["seen"]}


class _BlockRows:
    """Rows of the ranks' blocks of a [N, D] tensor, fetched by scene row (the fill's neighbours)."""

    def __init__(self, block: Tensor, bounds: List[int]):
        self.block, self.bounds = block, bounds

    def rounds(self, n: int) -> int:
        return D.all_reduce_max(n)

    def __call__(self, ids: Tensor) -> Tensor:
        ids = ids.to(self.block.device)
        return D.RowExchange(ids, self.bounds, "fill rows").from_owners(self.block)

