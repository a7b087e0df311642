"""The lift's view stream: teacher maps, renders, pixel weights and the caches across passes.

:class:`LiftViews` is the stage between the views and the lift's algorithm
(:func:`rh3dgs.lifting.lift`): :meth:`LiftViews.initial_pass` and :meth:`LiftViews.irls_pass` each run one pass of
the native aggregation op (``aggregate_sphere``) over every view and return the per-Gaussian sums, whatever
the views cost to produce. The first pass renders each chunk of views (projection + render
statistics), prepares its teacher maps (:func:`rh3dgs.teachers.maps.prepare_map`) and its pixel
weights (:func:`rh3dgs.method.vcd.pixel_weights`); later passes re-use what the :func:`cache_plan`
allows to keep (budget ``CACHE_BYTES``, ~2 GB):

* **full** - every view's projection, weights and maps (when they fit). Where the ops layer has a
  recording kernel (CPU), the first pass's render also records the (pixel, Gaussian) contributions it
  composites (``render(record=True)``, ~13 bytes each, up to half the budget; the first chunk that does
  not fit ends the recording) and every pass, the first included, replays them with the pixel weights
  and maps that render gave (``aggregate_sphere_replay``, all recorded chunks in one call): the sums of
  the chunks' traversals, each thread's added in chunk order, with one compositing of each view in all;
* **compact** (when the full cache does not fit and there are IRLS passes) - per view only the
  Gaussians that can matter: those that composite onto a pixel of weight > 0 (contributors), plus
  those that *end* such a pixel (alpha >= 1/255 where the transmittance would fall to 1e-4; found by a
  second pass with the contributors' opacity set to 0, where they are the first to composite there).
  Every other Gaussian of the view is skipped by the alpha rule, hidden behind a pixel that already
  ended, or only on weight-0 pixels, so the sums over the compact set are bit-identical per view (only
  the order of the sum over views differs from the full path). Views beyond the budget are recomputed;
* **none** - everything recomputed every pass.

Memory is O(N D + views_per_batch H W D) besides the caches; nothing is O(N x views).
:func:`rh3dgs.lifting.preflight.lift_memory_estimate` predicts the plan with the same :func:`cache_plan`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Literal, Optional, Tuple

import torch
from torch import Tensor

from ..cameras import Cameras
from ..gaussians import Gaussians
from ..method.vcd import pixel_weights, teacher_footprint
from ..ops import Contributions, aggregate_sphere, aggregate_sphere_replay
from ..ops._backend import has_native_kernel
from ..progress import track
from ..rendering import Projection, render
from ..teachers.maps import TeacherMaps, get_map, guided_upsample, map_dim, prepare_map, region_fraction
from .config import LiftConfig

__all__ = ["LiftViews", "CachePlan", "cache_plan", "CACHE_BYTES"]

CACHE_BYTES = 2e9
"""The lift's budget for its caches across passes (bytes; the recorded contributions get half of it)."""

#: What a pass of the aggregation op accumulates: the weighted Euclidean sums ("init") or one Huber-IRLS
#: step ("irls").
Mode = Literal["init", "irls"]


@dataclass
class CachePlan:
    """What a lift keeps between passes: ``views_per_batch`` (views rendered together), ``cache``
    ("full", "compact" or "none") and ``record`` (replay recorded contributions; full cache only)."""

    views_per_batch: int
    cache: str
    record: bool


def cache_plan(n: int, views: int, height: int, width: int, dim: int, cfg: LiftConfig,
               device: torch.device = torch.device("cpu")) -> CachePlan:
    """The plan of a lift of ``n`` Gaussians over ``views`` views of ``height`` x ``width`` and teacher dim ``dim``.

    ``cfg`` is the :class:`rh3dgs.lifting.config.LiftConfig` (its ``views_per_batch``, ``max_batch_gaussians``,
    ``cache_projections``, ``compact_cache``, ``record_contributions``, ``method`` and ``iters``):
    views per batch lowered so that views x Gaussians <= ``max_batch_gaussians``; full cache when
    ``cache_projections`` (None: when ~40 B per (view, Gaussian) + the upsampled maps and weights fit the
    budget); else compact when ``compact_cache`` (None: when there are IRLS passes); recording with the
    full cache where the ops layer has the recording kernel.
    """
    per_batch = max(1, min(int(cfg.views_per_batch), int(cfg.max_batch_gaussians) // max(n, 1)))
    if cfg.cache_projections is None:
        full = views * n * 40 + views * height * width * 4 * (1 + dim) < CACHE_BYTES
    else:
        full = bool(cfg.cache_projections)
    irls = cfg.method != "euclidean" and int(cfg.iters) > 0
    compact = (not full) and (irls if cfg.compact_cache is None else bool(cfg.compact_cache))
    record = (full and cfg.record_contributions is not False
              and has_native_kernel("rasterize_record", torch.device(device)))
    return CachePlan(per_batch, "full" if full else ("compact" if compact else "none"), record)


def _view_projection(proj: Projection, b: int, n: int) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """View b of a chunk's projection: means2d [1,N,2], conics [1,N,3], opacities [1,N], offsets [1,TH,TW], ids."""
    offs = proj.isect_offsets
    start = int(offs[b].reshape(-1)[0])
    end = int(offs[b + 1].reshape(-1)[0]) if b + 1 < offs.shape[0] else proj.flatten_ids.numel()
    return (proj.means2d[b:b + 1], proj.conics[b:b + 1], proj.opacities[b:b + 1], offs[b:b + 1] - start,
            proj.flatten_ids[start:end] - b * n)


@dataclass
class _CompactView:
    """The Gaussians ``gids`` of one view that can matter to the aggregation, with their projection."""

    gids: Tensor  # [K] int32 indices into the scene
    means2d: Tensor  # [1, K, 2]
    conics: Tensor  # [1, K, 3]
    opacities: Tensor  # [1, K]
    offsets: Tensor  # [1, TH, TW] int32
    flatten_ids: Tensor  # [M] int32 (compact indices)
    weights: Tensor  # [1, H, W]
    view: int
    maps: Optional[Tensor] = None  # the teacher map as given [h, w, D] or, if smaller, prepared [1, H, W, D]
    maps_prepared: bool = False
    guide: Optional[Tensor] = None  # [H, W, 3] the view's rendered colours (guided upsampling of a map as given)

    def nbytes(self) -> int:
        ts = [self.gids, self.means2d, self.conics, self.opacities, self.offsets, self.flatten_ids, self.weights]
        ts += [self.guide] if self.guide is not None else []
        return sum(t.numel() * t.element_size() for t in ts)


def _compact_view(proj: Projection, b: int, n: int, weights: Tensor, view: int) -> _CompactView:
    """Keep the contributors of view b (on pixels with weight > 0) and the Gaussians that end those pixels."""
    means2d, conics, opac, offs, fids = _view_projection(proj, b, n)
    open_px = (weights > 0).float()  # [1, H, W]: the pixels the aggregation visits
    one = open_px[..., None]  # unit 1-channel "features": acc_raw = sum alpha T over open pixels
    dev = means2d.device
    if fids.numel() == 0:
        keep = torch.zeros(n, dtype=torch.bool, device=dev)
    else:
        raw = aggregate_sphere(means2d, conics, opac, one, open_px, offs, fids, proj.tile_size, mode="init")[2]
        contrib = raw > 0  # alpha T >= 3.9e-7 per pair: no underflow
        # With the contributors transparent, the first Gaussian to composite onto an open pixel
        # that ended is the one that ended it (those in front of it there have alpha < 1/255).
        opac2 = opac * (~contrib).to(opac.dtype)[None]
        raw2 = aggregate_sphere(means2d, conics, opac2, one, open_px, offs, fids, proj.tile_size, mode="init")[2]
        keep = contrib | (raw2 > 0)
    gids = torch.nonzero(keep).reshape(-1).int()
    remap = torch.full((n,), -1, dtype=torch.int32, device=dev)
    remap[gids] = torch.arange(len(gids), dtype=torch.int32, device=dev)
    f = fids.long()
    sel = keep[f]
    prefix = torch.zeros(f.numel() + 1, dtype=torch.int64, device=dev)
    prefix[1:] = torch.cumsum(sel, 0)
    new_offs = prefix[offs.long()].int()  # kept intersections before each tile's start (order unchanged)
    return _CompactView(gids, means2d[:, gids].contiguous(), conics[:, gids].contiguous(),
                        opac[:, gids].contiguous(), new_offs, remap[f[sel]], weights, view)


class _Sums:
    """Per-Gaussian accumulators of one pass: (acc_w [N], acc_v [N, D], acc_raw [N])."""

    def __init__(self, n: int):
        self.n = n
        self.acc: List[Tensor] = []

    def add(self, a, gids: Optional[Tensor] = None) -> None:
        if gids is None and not self.acc:
            self.acc.extend(a)
            return
        if not self.acc:
            self.acc.extend(x.new_zeros((self.n, *x.shape[1:])) for x in a)
        for t, x in zip(self.acc, a):
            if gids is None:
                t.add_(x)
            else:
                t.index_add_(0, gids, x)


class LiftViews:
    """The views of a lift with their caches (module docstring); :meth:`initial_pass` and :meth:`irls_pass` are one
    pass each.

    Args:
        gaussians, cameras, teacher_maps: as :func:`rh3dgs.lifting.lift`; cfg: its ``LiftConfig``.
    """

    def __init__(self, gaussians: Gaussians, cameras: Cameras, teacher_maps: TeacherMaps, cfg: LiftConfig):
        self.gaussians, self.cameras, self.teacher_maps, self.cfg = gaussians, cameras, teacher_maps, cfg
        self.N, B = len(gaussians), len(cameras)
        self.H, self.W = int(cameras.height), int(cameras.width)
        self.dev = gaussians.device
        dim = map_dim(teacher_maps) if cfg.cache_projections is None and B > 0 else 0
        self.plan = cache_plan(self.N, B, self.H, self.W, dim, cfg, self.dev)
        per = self.plan.views_per_batch
        self.chunks = [list(range(s, min(s + per, B))) for s in range(0, B, per)]
        self.footprint: Optional[float] = cfg.teacher_footprint  # None: read off the first map (get_maps)
        self.cached: Dict[int, tuple] = {}
        self.recorded: Dict[int, Contributions] = {}
        self.compacts: Dict[int, List[_CompactView]] = {}
        self.recorded_bytes = self.cached_bytes = 0
        self.record_full = False  # a chunk's contributions did not fit the recording budget
        self.kept: List[int] = []
        self._raws: List[Tensor] = []  # the maps of the chunk just rendered, as given (for the compact cache)
        self._guide: Optional[Tensor] = None  # [b, H, W, 3] its rendered colours (guided upsampling; else None)
        self._ones = torch.ones(self.N, 1, device=self.dev)

    # ------------------------------------------------------------------ views
    def get_maps(self, idx: List[int], raws: Optional[List[Tensor]] = None, guide: Optional[Tensor] = None) -> Tensor:
        """[b, H, W, D] unit maps of views idx (``raws``: also collect the maps as given; ``guide``: [b, H, W, 3]
        colours for the guided upsampling of maps coarser than the render)."""
        ms = []
        for i in idx:
            m = get_map(self.teacher_maps, i)
            if self.footprint is None:  # a map coarser than the render: each cell describes a footprint of pixels
                self.footprint = teacher_footprint(tuple(m.shape[:2]), (self.H, self.W))
            if raws is not None:
                raws.append(m)
            ms.append(m)
        return self._prepare(ms, idx, guide)

    def _guided_size(self, m: Tensor) -> Optional[Tuple[int, int]]:
        """(h, w) of a map coarser than the render (upsampled with the view's colours as the guide), else None."""
        hw = tuple(m.shape[:2]) if m.dim() == 3 else None  # anything else: prepare_map names the problem
        return hw if hw and hw[0] <= self.H and hw[1] <= self.W and hw != (self.H, self.W) else None

    def _prepare(self, ms: List[Tensor], views: List[int], guide: Optional[Tensor]) -> Tensor:
        """Maps as given -> [b, H, W, D] unit rows on the lift's device: guided by the views' colours ``guide``
        [b, H, W, 3] when coarser than the render. Maps all guided at one size take one upsampling call that
        writes the whole output (stacking 8 fresh 4 MB maps into a fresh 33 MB tensor cost ~13 ms a chunk,
        mostly its pages' first touch); others are prepared one by one."""
        sizes = {self._guided_size(m) for m in ms}
        if guide is not None and len(sizes) == 1 and None not in sizes:
            hw = sizes.pop()
            coarse = torch.stack([prepare_map(m, hw, v) for m, v in zip(ms, views)])
            return guided_upsample(coarse.to(self.dev), guide, self.cfg.guide_sigma_color)
        if len(ms) == 1:
            return prepare_map(ms[0], (self.H, self.W), views[0])[None].to(self.dev)
        return torch.cat([self._prepare([m], [v], None if guide is None else guide[b:b + 1])
                          for b, (m, v) in enumerate(zip(ms, views))])

    def _view_map(self, v: _CompactView) -> Tensor:
        guide = None if v.guide is None else v.guide[None]
        return v.maps if v.maps_prepared else self._prepare([v.maps], [v.view], guide)

    def view_chunk(self, ci: int):
        """(projection, pixel weights [b,H,W], teacher maps [b,H,W,D]) of chunk ci."""
        if ci in self.cached:
            return self.cached[ci]
        cfg, idx = self.cfg, self.chunks[ci]
        self._raws.clear()
        record = self.plan.record and not self.record_full
        with torch.no_grad():
            # the statistics come with any channels: the colours when they guide the maps, else one constant
            r = render(self.gaussians, self.cameras[idx], None if cfg.guided else self._ones, rgb=cfg.guided,
                       tile_size=cfg.tile_size, record=record)
        if record:  # the passes replay what this render composited, if it fits
            if self.recorded_bytes + r.contributions.nbytes() <= CACHE_BYTES / 2:
                self.recorded[ci] = r.contributions
                self.recorded_bytes += r.contributions.nbytes()
            else:  # the chunks are alike: the later ones would not fit either, so stop recording them
                self.record_full = True
            r.contributions = None
        self._guide = r.rgb
        maps = self.get_maps(idx, self._raws, r.rgb)
        regions = (region_fraction(self._raws, (self.H, self.W)).to(self.dev)
                   if cfg.use_vcd and cfg.vcd.reads_regions else None)
        w = pixel_weights(r.alpha, r.d1, r.d2, maps, use_vcd=cfg.use_vcd, vcd=cfg.vcd, min_coverage=cfg.min_coverage,
                          footprint=self.footprint, region_fraction=regions)
        if self.plan.cache != "compact":
            self._raws.clear()
        if self.plan.cache == "full":
            self.cached[ci] = (r.projection, w, maps)
        return r.projection, w, maps

    def _compact_chunk(self, ci: int, proj: Projection, w: Tensor, maps: Tensor) -> None:
        """First pass, compact mode: keep chunk ci's compact views if they fit in the budget."""
        views = [_compact_view(proj, b, self.N, w[b:b + 1].clone(), i) for b, i in enumerate(self.chunks[ci])]
        for b, v in enumerate(views):
            v.guide = None if self._guide is None else self._guide[b].clone()
        nb = sum(v.nbytes() for v in views)
        if self.cached_bytes + nb > CACHE_BYTES:
            return  # recomputed in every pass
        self.kept.extend(len(v.gids) for v in views)
        # the maps as given (usually at patch resolution) when smaller than the upsampled ones
        keep_maps = [r.clone() if r.numel() < maps[b].numel() else maps[b:b + 1].clone()
                     for b, r in enumerate(self._raws)]
        map_bytes = sum(m.numel() * m.element_size() for m in keep_maps)
        if self.cached_bytes + nb + map_bytes <= CACHE_BYTES:
            for v, m in zip(views, keep_maps):
                v.maps, v.maps_prepared = m, m.dim() == 4
            nb += map_bytes
        self.compacts[ci] = views
        self.cached_bytes += nb

    # ------------------------------------------------------------------ one pass
    def _add_compact(self, sums: _Sums, views: List[_CompactView], maps: Optional[Tensor], mu, delta,
                     mode: Mode) -> None:
        for b, v in enumerate(views):
            if len(v.gids) == 0:
                continue
            m = self._view_map(v) if v.maps is not None else maps[b:b + 1]
            gids = v.gids.long()  # index_select / index_add_ are fastest with int64 indices
            sums.add(aggregate_sphere(v.means2d, v.conics, v.opacities, m, v.weights, v.offsets, v.flatten_ids,
                                      self.cfg.tile_size, mu=None if mu is None else mu.index_select(0, gids),
                                      delta=delta, mode=mode), gids)

    def initial_pass(self, description: str = "lift: initial mean",
                     progress: bool = True) -> Tuple[Tensor, Tensor, Tensor]:
        """The first pass over every view, which fills the caches: per Gaussian the sum of its compositing weights
        ``sum w`` [N], of its weighted teacher features ``sum w z`` [N, D] and of ``alpha w_bar`` [N] (the
        visibility's denominator)."""
        return self._pass("init", None, float("inf"), description, progress, None)

    def irls_pass(self, mu: Tensor, delta: float, description: str = "lift: IRLS pass", progress: bool = True,
                  active: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
        """One Huber-IRLS pass around the means ``mu`` [N, D]: ``sum omega`` [N], ``sum omega Log_mu(z)`` [N, D] and
        ``sum alpha w_bar`` [N]. ``active`` [N] bool: only those Gaussians' sums are needed (the others' are then
        whatever the path gives: replays skip them)."""
        return self._pass("irls", mu, delta, description, progress, active)

    def _pass(self, mode: Mode, mu: Optional[Tensor], delta: float, description: str, progress: bool,
              active: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        """One pass of the aggregation op over every view, from whatever each chunk of views has cached."""
        sums = _Sums(self.N)
        replay: List[Tuple[Contributions, Tensor, Tensor]] = []  # the recorded chunks: replayed in one call below
        for ci in track(range(len(self.chunks)), description=description, disable=not progress):
            if ci in self.compacts:
                views = self.compacts[ci]
                guide = None if views[0].guide is None else torch.stack([v.guide for v in views])
                self._add_compact(sums, views, None if all(v.maps is not None for v in views)
                                  else self.get_maps(self.chunks[ci], guide=guide), mu, delta, mode)
                continue
            proj, w, maps = self.view_chunk(ci)  # rendered (and recorded) by the first pass
            if ci in self.recorded:
                replay.append((self.recorded[ci], maps, w))
                continue
            if mode == "init" and self.plan.cache == "compact":
                self._compact_chunk(ci, proj, w, maps)
            if ci in self.compacts:  # aggregate from the compact views: the same per-view sums
                del proj, w
                self._add_compact(sums, self.compacts[ci], maps, mu, delta, mode)
            else:
                sums.add(aggregate_sphere(proj.means2d, proj.conics, proj.opacities, maps, w, proj.isect_offsets,
                                          proj.flatten_ids, proj.tile_size, mu=mu, delta=delta, mode=mode))
                del proj, w  # before the next chunk is rendered
            del maps
        if replay:  # one call for all recorded chunks: one set of per-thread sums to clear and add up per pass
            recs, maps, ws = (list(x) for x in zip(*replay))
            sums.add(aggregate_sphere_replay(recs, maps, ws, mu, delta, mode, active))
        if not sums.acc:  # no views, or no Gaussian seen
            D = map_dim(self.teacher_maps)
            z = lambda *s: torch.zeros(*s, device=self.dev)  # noqa: E731
            sums.acc.extend([z(self.N), z(self.N, D), z(self.N)])
        return sums.acc[0], sums.acc[1], sums.acc[2]

    # ------------------------------------------------------------------ end
    def release(self) -> Dict[str, object]:
        """Drop the caches; returns what they held (for ``LiftResult.info``)."""
        info: Dict[str, object] = {"views_per_batch": self.plan.views_per_batch, "cache": self.plan.cache,
                                   "recorded_chunks": len(self.recorded), "recorded_bytes": int(self.recorded_bytes)}
        if self.plan.cache == "compact":
            info["compact_views"] = len(self.kept)
            info["compact_views_with_maps"] = sum(v.maps is not None for vs in self.compacts.values() for v in vs)
            info["compact_gaussians_per_view"] = float(sum(self.kept) / max(1, len(self.kept)))
            info["cache_bytes"] = int(self.cached_bytes)
        self.cached.clear(), self.compacts.clear(), self._raws.clear(), self.recorded.clear()
        return info
