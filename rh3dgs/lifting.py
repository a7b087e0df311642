"""Training-free lift: per-Gaussian robust, reliability-weighted spherical Frechet means.

For Gaussian i, over every (view v, pixel u) it contributes to with compositing weight
alpha_i T_i(u) and VCD reliability w_bar_v(u), the lifted feature is

    mu_i = argmin_mu  sum_{v,u} alpha_i T_i(u) w_bar_v(u) rho_delta( d(mu, z_v(u)) )

computed by Huber-IRLS on the sphere: start from the normalised weighted Euclidean mean,
then each pass over the views accumulates (native op ``aggregate_sphere``, nothing per
pair stored) sum omega and sum omega Log_mu(z) and steps mu <- Exp_mu(sum omega Log / sum omega).
Teacher maps are requested one view chunk at a time (a callable can stream them from
the cache), so memory is O(N D + views_per_batch H W D); nothing is O(N x views).

Caching across passes (the IRLS passes see the same projections, pixel weights and maps):
  * full: every view's projection, weights and maps (``cache_projections``; by default when
    that fits in ~2 GB, i.e. small scenes). On CPU the initial pass also records the (pixel,
    Gaussian) contributions it visits (``aggregate_sphere(record=True)``, ~13 bytes each, up to
    ~1 GB) and the IRLS passes replay them (``aggregate_sphere_replay``): the same sums, bit for
    bit, without compositing the views again, so an IRLS pass costs only its D-dimensional work;
  * compact (``compact_cache``; by default when the full cache does not fit and there are
    IRLS passes): per view only the Gaussians that can matter - those that composite onto a
    pixel of weight > 0 (contributors), plus those that *end* such a pixel (alpha >= 1/255 where
    the transmittance would fall to 1e-4; found by a second pass with the contributors'
    opacity set to 0, where they are the first to composite there). Every other Gaussian of
    the view is skipped by the alpha rule, hidden behind a pixel that already ended, or only
    on weight-0 pixels, so the aggregation over the compact set is exactly the same per view
    (bit-identical sums per view; only the order of the sum over views differs from the
    full path). At 1M random Gaussians x 64x64 views a view keeps ~10 % of them, so an IRLS
    pass costs ~1/7 of the first one (which projects every Gaussian in every view).
    Views that do not fit the budget (~2 GB) are recomputed every pass;
  * none (``cache_projections=False, compact_cache=False``): everything recomputed every pass.

Ablation baselines behind the same call (``LiftConfig.method``):
  * "robust"    - VCD weights + Huber-IRLS Frechet mean (ours);
  * "karcher"   - Karcher mean (delta = inf) with the same weights;
  * "euclidean" - weighted Euclidean mean, then normalise (LUDVIG / gradient back-projection);
and ``use_vcd=False`` gives uniform pixel weights (no VCD).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .cameras import Cameras
from .errors import ConfigError
from .gaussians import Gaussians
from .ops import Contributions, aggregate_sphere, aggregate_sphere_replay
from .progress import track
from .rendering import Projection, render
from .teachers.maps import TeacherMaps, get_map, map_dim, prepare_map
from .vcd import VCDConfig, pixel_weights

__all__ = ["LiftConfig", "LiftResult", "lift", "pca_decoder", "fill_from_neighbours"]

@dataclass
class LiftConfig:
    """Settings of :func:`lift`."""

    method: str = "robust"
    """"robust" (Huber-IRLS), "karcher" (delta = inf) or "euclidean" (normalised weighted mean)."""
    use_vcd: bool = True
    """Weight pixels by VCD reliability (False: uniform weights on covered pixels)."""
    vcd: VCDConfig = field(default_factory=VCDConfig)
    """VCD settings (feature edges use the teacher map of the view)."""
    delta: float = 0.35
    """Huber threshold in radians (~20 degrees): residuals beyond it count linearly."""
    iters: int = 3
    """Maximum IRLS passes over all views after the initial Euclidean pass. On the synthetic
    benchmark 3 passes leave a mean angle of ~1e-3 rad (99th percentile ~1e-2) to the
    converged robust mean; each pass costs about one render of the views with D channels."""
    tol: float = 1e-3
    """Stop when the ``tol_quantile`` quantile of the per-Gaussian step angles (radians) is below this."""
    tol_quantile: float = 0.99
    """Quantile of the step angles tested against ``tol`` (1.0 = the largest step). A few
    Gaussians seen by two disagreeing pixels converge slowly under Huber IRLS; they should
    not hold up the whole scene."""
    min_coverage: float = 0.5
    """Pixels with accumulated opacity below this get weight 0 (background / holes)."""
    min_weight: float = 1e-6
    """Gaussians whose total contribution weight is below this are marked invalid."""
    min_visibility: float = 0.01
    """Gaussians whose mean transmittance where they composite, sum alpha T w_bar / sum alpha w_bar
    over all their (view, pixel) contributions, is below this are marked invalid: the views see them
    only through the surfaces in front (the floor under an object, the far side of a closed surface),
    so every sample they get is the occluder's feature and their lifted feature would be the
    occluder's. 0 keeps every Gaussian with weight >= min_weight."""
    fill: bool = True
    """Give the Gaussians the views do not see (invalid ones) the feature of their observed 3D neighbours
    (:func:`fill_from_neighbours`), marked in ``LiftResult.filled``: the inside and underside of an object
    then answer its query like the rest of it."""
    fill_neighbors: int = 16
    """Observed neighbours a filled Gaussian's feature is taken from."""
    fill_color_sigma: float = 0.1
    """Colour similarity scale of the fill weights (RGB in [0, 1])."""
    fill_radius: Optional[float] = None
    """Neighbours farther than this are not used (None: 10 % of the scene's extent, the 2-98 % box diagonal)."""
    views_per_batch: int = 8
    """Views rendered and aggregated together (memory: views_per_batch * H * W * D floats)."""
    latent_dim: int = 16
    """Dimension d of the latents of the PCA-initialised linear decoder (0 = skip)."""
    tile_size: int = 16
    cache_projections: Optional[bool] = None
    """Keep per-view projections, weights and upsampled maps between passes (None: when they fit in ~2 GB)."""
    compact_cache: Optional[bool] = None
    """When the full cache is off: keep, per view, only the Gaussians that can reach a pixel of
    weight > 0 (with their projection, the pixel weights and, if they fit, the teacher map as given
    or upsampled, whichever is smaller) within ~2 GB; exact (see the module doc). None: when there
    are IRLS passes (method robust / karcher, iters > 0); False: recompute every view in every pass."""
    record_contributions: Optional[bool] = None
    """With the full cache on CPU: record the initial pass's (pixel, Gaussian) contributions (~13 bytes
    each, up to ~1 GB) and replay them in the IRLS passes instead of compositing again (the same sums,
    bit for bit). None: whenever possible; False: composite in every pass."""
    teacher_footprint: Optional[float] = None
    """Pixels of the render each teacher-map cell describes, for VCD's footprint-purity term: None reads
    it off the maps (render size / map size, when the maps are coarser than the render: a patch-token
    teacher), 0 switches the term off."""
    max_batch_gaussians: int = 4_000_000
    """Upper bound on views x Gaussians projected together: views_per_batch is lowered for scenes
    of more than max_batch_gaussians / views_per_batch Gaussians (the CPU projection holds
    ~200 bytes per (view, Gaussian) pair while it runs; see rh3dgs.memory)."""

    def __post_init__(self) -> None:
        if self.method not in ("robust", "karcher", "euclidean"):
            raise ConfigError(f"LiftConfig.method must be 'robust', 'karcher' or 'euclidean', got {self.method!r}")
        if not 0.0 <= self.min_visibility <= 1.0:
            raise ConfigError(f"LiftConfig.min_visibility must be in [0, 1], got {self.min_visibility}")
        if not self.delta > 0:
            raise ConfigError(f"LiftConfig.delta must be > 0 radians, got {self.delta}")
        if self.iters < 0 or self.views_per_batch < 1 or self.max_batch_gaussians < 1:
            raise ConfigError("LiftConfig.iters must be >= 0, views_per_batch and max_batch_gaussians >= 1")


@dataclass
class LiftResult:
    """Output of :func:`lift` (N Gaussians, teacher dimension D, latent dimension d).

    features: [N, D] unit lifted features (zero rows where ``valid`` is False).
    weight:   [N] total compositing weight sum_{v,u} alpha T w_bar received.
    visibility: [N] mean transmittance where the Gaussian composites, weight / sum_{v,u} alpha w_bar.
    valid:    [N] bool, the Gaussian has a feature: observed (weight >= min_weight and visibility >=
              min_visibility) or filled from its neighbours.
    filled:   [N] bool, the feature was filled from observed 3D neighbours (a subset of ``valid``).
    latents:  [N, d] PCA coordinates (None if latent_dim = 0).
    decoder:  [D, d] linear decoder (orthonormal columns): z_hat = normalize(decoder @ f).
    info:     passes, per-pass step-angle quantile, timings.
    """

    features: Tensor
    weight: Tensor
    visibility: Tensor
    valid: Tensor
    latents: Optional[Tensor]
    decoder: Optional[Tensor]
    info: Dict[str, object]
    filled: Optional[Tensor] = None

    def field(self):
        """The lifted :class:`rh3dgs.field.SemanticField` (latents, decoder, valid, filled)."""
        from .field import SemanticField

        return SemanticField(self.latents, self.decoder, self.valid, self.filled)


def fill_from_neighbours(means: Tensor, colors: Tensor, features: Tensor, observed: Tensor, k: int = 16,
                         color_sigma: float = 0.1, radius: Optional[float] = None) -> Tuple[Tensor, Tensor]:
    """Features for the Gaussians without one, from their observed 3D neighbours.

    For every Gaussian i with ``observed[i] = False``, its ``k`` nearest observed Gaussians j within
    ``radius`` (scipy ``cKDTree``) vote with weight ``exp(-|c_i - c_j|^2 / (2 sigma_c^2)) / (d_ij + eps)``
    (colour similarity over distance, so that the floor under a box takes the floor's feature and the
    box's underside the box's): ``f_i = normalize(sum_j w_j f_j)``. Gaussians with no observed neighbour in
    ``radius`` stay without a feature.

    Args:
        means [N, 3], colors [N, 3] in [0, 1], features [N, D] unit rows, observed [N] bool.
    Returns:
        ``(features [N, D], filled [N] bool)``: observed rows unchanged, filled rows set.

    >>> import torch
    >>> m = torch.tensor([[0., 0, 0], [1., 0, 0], [0.1, 0, 0]]); c = torch.zeros(3, 3)
    >>> f = torch.tensor([[1., 0], [0., 1], [0., 0]]); obs = torch.tensor([True, True, False])
    >>> fill_from_neighbours(m, c, f, obs, k=2, radius=2.0)[0][2]   # nearer to Gaussian 0
    tensor([0.9939, 0.1104])
    """
    from scipy.spatial import cKDTree

    N = features.shape[0]
    filled = torch.zeros(N, dtype=torch.bool, device=features.device)
    todo = torch.nonzero(~observed).flatten()
    src = torch.nonzero(observed).flatten()
    if len(todo) == 0 or len(src) == 0:
        return features, filled
    pts = means.detach().double().cpu().numpy()
    if radius is None:
        lo, hi = torch.quantile(means.detach().double().cpu(), torch.tensor([0.02, 0.98], dtype=torch.float64), dim=0)
        radius = 0.1 * float(torch.linalg.vector_norm(hi - lo))
    kk = min(int(k), len(src))
    dist, j = cKDTree(pts[src.cpu().numpy()]).query(pts[todo.cpu().numpy()], k=kk, distance_upper_bound=radius)
    dist, j = torch.from_numpy(dist.reshape(len(todo), kk)), torch.from_numpy(j.reshape(len(todo), kk))
    ok = torch.isfinite(dist)  # missing neighbours: inf distance, index len(src)
    jj = src.cpu()[j.clamp_max(len(src) - 1)]
    col = colors.detach().double().cpu()
    dc2 = ((col[jj] - col[todo.cpu()][:, None]) ** 2).sum(-1)
    w = torch.exp(-dc2 / (2.0 * color_sigma ** 2)) / (dist.clamp_max(1e30) + 1e-6 * max(radius, 1e-12))
    w = torch.where(ok, w, torch.zeros_like(w)).to(features.dtype).to(features.device)
    acc = (w[..., None] * features[jj.to(features.device)]).sum(1)
    n = torch.linalg.vector_norm(acc, dim=-1)
    got = n > 0
    out = features.clone()
    out[todo[got]] = acc[got] / n[got, None]
    filled[todo[got]] = True
    return out, filled


_CACHE_BYTES = 2e9  # budget of the caches across passes


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

    def nbytes(self) -> int:
        ts = [self.gids, self.means2d, self.conics, self.opacities, self.offsets, self.flatten_ids, self.weights]
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


def _sphere_exp_(mu: Tensor, v: Tensor) -> Tensor:
    """:func:`rh3dgs.sphere.sphere_exp` computed in the memory of ``mu`` and ``v`` (both overwritten;
    the same operations, so the same bits). Returns ``mu``."""
    n = torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    big = n > math.sqrt(torch.finfo(v.dtype).eps)
    n_safe = torch.where(big, n, torch.ones_like(n))
    sinc = torch.where(big, torch.sin(n) / n_safe, 1.0 - n * n / 6.0)
    mu.mul_(torch.cos(n)).add_(v.mul_(sinc))
    return mu.div_(torch.linalg.vector_norm(mu, dim=-1, keepdim=True).clamp_min(torch.finfo(mu.dtype).tiny))


def pca_decoder(features: Tensor, weight: Tensor, d: int) -> tuple:
    """Uncentred weighted PCA: decoder [D, d] = top-d right singular vectors, latents = features @ decoder.

    Uncentred, so that the common direction of CLIP-like features (their cone axis) is
    the first component and the decoder needs no bias (keeps the linear query fast path).
    """
    D = features.shape[1]
    d = min(d, D)
    w = weight.clamp_min(0).sqrt()[:, None]
    cov = (features * w).T @ (features * w)  # [D, D]
    evals, evecs = torch.linalg.eigh(cov.double())
    basis = evecs[:, torch.argsort(evals, descending=True)[:d]].float()  # [D, d]
    # deterministic sign: largest-magnitude entry of each column positive
    sign = torch.sign(basis.gather(0, basis.abs().argmax(0, keepdim=True)))
    basis = basis * torch.where(sign == 0, torch.ones_like(sign), sign)
    return basis, features @ basis


def lift(
    gaussians: Gaussians,
    cameras: Cameras,
    teacher_maps: TeacherMaps,
    cfg: Optional[LiftConfig] = None,
    progress: bool = True,
) -> LiftResult:
    """Lift per-view teacher feature maps into per-Gaussian unit features.

    Args:
        gaussians: the scene (CPU or CUDA; the native op runs where the tensors are).
        cameras:   B views.
        teacher_maps: [B, h, w, D] tensor, a sequence of [h, w, D] maps, or a callable
            ``i -> [h, w, D]`` (streaming); any resolution (bilinear to the image size),
            renormalised to unit length (zero vectors are ignored pixels).
        cfg: :class:`LiftConfig`.
    """
    cfg = cfg or LiftConfig()
    t0 = time.perf_counter()
    B, N = len(cameras), len(gaussians)
    H, W = int(cameras.height), int(cameras.width)
    dev = gaussians.device
    ones = torch.ones(N, 1, device=dev)
    per_batch = max(1, min(cfg.views_per_batch, cfg.max_batch_gaussians // max(N, 1)))
    chunks = [list(range(s, min(s + per_batch, B))) for s in range(0, B, per_batch)]
    if cfg.cache_projections is None:
        # projection (~40 B / Gaussian / view) + weights + upsampled teacher maps (the stream's memory bound)
        cache = B * N * 40 + B * H * W * 4 * (1 + map_dim(teacher_maps)) < _CACHE_BYTES
    else:
        cache = cfg.cache_projections
    irls = cfg.method != "euclidean" and cfg.iters > 0
    footprint = cfg.teacher_footprint  # None: read off the first map the stream gives (below)
    compact = (not cache) and (irls if cfg.compact_cache is None else cfg.compact_cache)
    cached: Dict[int, tuple] = {}
    # full cache on CPU: the contributions the initial pass visits, per chunk, replayed by the IRLS
    # passes instead of compositing the views again (bit-identical sums; ~13 bytes per contribution)
    recorded: Dict[int, Contributions] = {}
    record = cache and irls and dev.type == "cpu" and cfg.record_contributions is not False
    recorded_bytes = 0
    compacts: Dict[int, List[_CompactView]] = {}
    cached_bytes = 0
    kept: List[int] = []

    def get_maps(idx: List[int], raws: Optional[List[Tensor]] = None) -> Tensor:
        """[b, H, W, D] unit maps of views idx (``raws``: also collect the maps as given)."""
        out = []
        nonlocal footprint
        for i in idx:
            m = get_map(teacher_maps, i)
            if footprint is None:  # a map coarser than the render: each cell describes a footprint of pixels
                h, w = m.shape[:2]
                footprint = max(H / h, W / w) if (h < H or w < W) else 0.0
            if raws is not None:
                raws.append(m)
            out.append(prepare_map(m, (H, W), i))
        return torch.stack(out).to(dev)

    def view_map(v: _CompactView) -> Tensor:
        return v.maps if v.maps_prepared else prepare_map(v.maps, (H, W), v.view)[None].to(dev)

    raws: List[Tensor] = []  # the maps of the chunk just rendered, as given (for the compact cache)

    def view_chunk(ci: int):
        """(projection, pixel weights [b,H,W], teacher maps [b,H,W,D]) of chunk ci."""
        if ci in cached:
            return cached[ci]
        idx = chunks[ci]
        raws.clear()
        maps = get_maps(idx, raws if compact else None)
        with torch.no_grad():
            r = render(gaussians, cameras[idx], ones, rgb=False, tile_size=cfg.tile_size)
        w = pixel_weights(r.alpha, r.d1, r.d2, maps, use_vcd=cfg.use_vcd, vcd=cfg.vcd, min_coverage=cfg.min_coverage,
                          footprint=footprint)
        if cache:
            cached[ci] = (r.projection, w, maps)
        return r.projection, w, maps

    def compact_chunk(ci: int, proj: Projection, w: Tensor, maps: Tensor) -> None:
        """First pass, compact mode: keep chunk ci's compact views if they fit in the budget."""
        nonlocal cached_bytes
        views = [_compact_view(proj, b, N, w[b:b + 1].clone(), i) for b, i in enumerate(chunks[ci])]
        nb = sum(v.nbytes() for v in views)
        if cached_bytes + nb > _CACHE_BYTES:
            return  # recomputed in every pass
        kept.extend(len(v.gids) for v in views)
        # the maps as given (usually at patch resolution) when smaller than the upsampled ones
        keep_maps = [r.clone() if r.numel() < maps[b].numel() else maps[b:b + 1].clone() for b, r in enumerate(raws)]
        map_bytes = sum(m.numel() * m.element_size() for m in keep_maps)
        if cached_bytes + nb + map_bytes <= _CACHE_BYTES:
            for v, m in zip(views, keep_maps):
                v.maps, v.maps_prepared = m, m.dim() == 4
            nb += map_bytes
        compacts[ci] = views
        cached_bytes += nb

    def one_pass(mode: str, mu: Optional[Tensor], delta: float, desc: str):
        nonlocal recorded_bytes
        acc: List[Tensor] = []

        def add(a, gids: Optional[Tensor] = None) -> None:
            if gids is None and not acc:
                acc.extend(a)
                return
            if not acc:
                acc.extend(x.new_zeros((N, *x.shape[1:])) for x in a)
            for t, x in zip(acc, a):
                if gids is None:
                    t.add_(x)
                else:
                    t.index_add_(0, gids, x)

        def add_compact(views: List[_CompactView], maps: Optional[Tensor]) -> None:
            for b, v in enumerate(views):
                if len(v.gids) == 0:
                    continue
                m = view_map(v) if v.maps is not None else maps[b:b + 1]
                gids = v.gids.long()  # index_select / index_add_ are fastest with int64 indices
                add(aggregate_sphere(v.means2d, v.conics, v.opacities, m, v.weights, v.offsets, v.flatten_ids,
                                     cfg.tile_size, mu=None if mu is None else mu.index_select(0, gids),
                                     delta=delta, mode=mode), gids)

        for ci in track(range(len(chunks)), description=desc, disable=not progress):
            if ci in recorded:
                add(aggregate_sphere_replay(recorded[ci], cached[ci][2], mu, delta, mode))
                continue
            if ci in compacts:
                views = compacts[ci]
                add_compact(views, None if all(v.maps is not None for v in views) else get_maps(chunks[ci]))
                continue
            proj, w, maps = view_chunk(ci)
            if mode == "init" and compact:
                compact_chunk(ci, proj, w, maps)
            if ci in compacts:  # aggregate from the compact views: the same per-view sums
                del proj, w
                add_compact(compacts[ci], maps)
            elif record and mode == "init" and recorded_bytes < _CACHE_BYTES / 2:
                *sums, contrib = aggregate_sphere(proj.means2d, proj.conics, proj.opacities, maps, w,
                                                  proj.isect_offsets, proj.flatten_ids, proj.tile_size, mode=mode,
                                                  record=True)
                add(sums)
                if recorded_bytes + contrib.nbytes() <= _CACHE_BYTES / 2:
                    recorded[ci] = contrib
                    recorded_bytes += contrib.nbytes()
                del proj, w, contrib
            else:
                add(aggregate_sphere(proj.means2d, proj.conics, proj.opacities, maps, w, proj.isect_offsets,
                                     proj.flatten_ids, proj.tile_size, mu=mu, delta=delta, mode=mode))
                del proj, w  # before the next chunk is rendered
            del maps
        if not acc:  # no views, or no Gaussian seen
            D = map_dim(teacher_maps)
            acc.extend([torch.zeros(N, device=dev), torch.zeros(N, D, device=dev), torch.zeros(N, device=dev)])
        return acc[0], acc[1], acc[2]

    weight, acc_v, mass = one_pass("init", None, math.inf, "lift: initial mean")
    visibility = weight / mass.clamp_min(1e-30)
    valid = (weight >= cfg.min_weight) & (visibility >= cfg.min_visibility)
    mu = torch.nn.functional.normalize(acc_v, dim=-1) * valid[:, None]
    steps: List[float] = []
    if cfg.method != "euclidean":
        delta = cfg.delta if cfg.method == "robust" else math.inf
        for it in range(cfg.iters):
            acc_w, acc_v, _ = one_pass("irls", mu, delta, f"lift: IRLS pass {it + 1}")
            step = acc_v.div_(acc_w.clamp_min(1e-12)[:, None]).mul_(valid[:, None])  # in place: N x D floats each
            del acc_v
            norms = step.norm(dim=-1)[valid]
            mu = _sphere_exp_(mu, step).mul_(valid[:, None])
            q_step = float(torch.quantile(norms[:1_000_000], cfg.tol_quantile)) if norms.numel() else 0.0
            steps.append(q_step)
            if q_step < cfg.tol:
                break
    with_maps = sum(v.maps is not None for views in compacts.values() for v in views)
    n_recorded = len(recorded)
    cached.clear(), compacts.clear(), raws.clear(), recorded.clear()  # before the PCA's N x D temporaries
    observed = valid
    filled = torch.zeros_like(valid)
    if cfg.fill and N > 0:
        colors = (0.28209479177387814 * gaussians.sh0[:, 0].detach() + 0.5).clamp(0.0, 1.0)
        mu, filled = fill_from_neighbours(gaussians.means, colors, mu, observed, cfg.fill_neighbors,
                                          cfg.fill_color_sigma, cfg.fill_radius)
        valid = observed | filled
    latents = decoder = None
    if cfg.latent_dim > 0 and N > 0:
        decoder, latents = pca_decoder(mu, weight * observed, cfg.latent_dim)
        latents = latents * valid[:, None]
    info = {"method": cfg.method, "use_vcd": cfg.use_vcd, "passes": 1 + len(steps), "step_quantile_per_pass": steps,
            "seconds": time.perf_counter() - t0, "views": B, "gaussians": N, "valid": int(valid.sum()),
            "observed": int(observed.sum()), "filled": int(filled.sum()),
            "hidden": int(((weight >= cfg.min_weight) & ~observed).sum()),
            "views_per_batch": per_batch, "cache": "full" if cache else ("compact" if compact else "none"),
            "recorded_chunks": n_recorded, "recorded_bytes": int(recorded_bytes)}
    if compact:
        info["compact_views"] = len(kept)
        info["compact_views_with_maps"] = with_maps
        info["compact_gaussians_per_view"] = float(sum(kept) / max(1, len(kept)))
        info["cache_bytes"] = int(cached_bytes)
    return LiftResult(mu, weight, visibility, valid, latents, decoder, info, filled)
