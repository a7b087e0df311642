"""Pure-torch references of the native ops (used by tests; gsplat's ``_torch_impl`` pattern).

They follow exactly the same compositing rules as ``csrc/`` (see csrc/common.h) but
enumerate every (pixel, Gaussian) pair of a tile densely, so they are simple, slow and
differentiable by autograd.
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch
from torch import Tensor

ALPHA_MIN = 1.0 / 255.0
ALPHA_MAX = 0.999
T_MIN = 1e-4

__all__ = ["_ref_project_gaussians", "_ref_sh_colors", "_ref_rasterize_to_pixels", "_ref_aggregate_sphere", "_ref_tile_contributions", "_ref_isect_tiles",
           "_ref_relevancy", "_ref_lic_infonce", "_ref_lic_pull", "_ref_guided_upsample"]


@torch.no_grad()
def _ref_relevancy(latents: Tensor, pos: Tensor, neg: Tensor, norm_factor: Tensor, temperature: float) -> Tensor:
    """Reference of ``relevancy``: cosines of [..., d] latents (norm |R f|), then the LERF relevancy
    sigmoid(tau (cos_q - max_j cos_neg_j)) (sigmoid(tau cos_q) without negatives), as
    :func:`rh3dgs.query.relevancy_from_cosines` states it."""
    norm = torch.linalg.vector_norm(latents @ norm_factor.to(latents).T, dim=-1, keepdim=True).clamp_min(1e-12)
    Q = pos.shape[0]
    cos = latents @ torch.cat([pos, neg]).to(latents).T / norm
    if neg.shape[0] == 0:
        return torch.sigmoid(temperature * cos)
    return torch.sigmoid(temperature * (cos[..., :Q] - cos[..., Q:].max(dim=-1, keepdim=True).values))


def _ref_lic_infonce(features: Tensor, anchors: Tensor, candidates: Tensor, kinds: Tensor,
                     temperature: float) -> Tensor:
    """Reference of ``lic_infonce`` (differentiable by autograd): per-anchor loss [A].

    f = F.normalize(features); s_aj = <f_a, f_j> / tau over candidates of kind 1 (negative) or
    2 (positive); loss_a = logsumexp_{kind > 0} s_aj - mean_{kind = 2} s_aj, 0 without positives.
    """
    f = torch.nn.functional.normalize(features, dim=-1)
    in_set, pos = kinds > 0, kinds == 2
    sim = (f[anchors][:, None, :] * f[candidates.clamp_min(0)]).sum(-1) / temperature  # [A, K]
    lse = torch.logsumexp(sim.masked_fill(~in_set, float("-inf")), dim=1, keepdim=True)
    npos = pos.sum(1)
    per_anchor = -((sim - lse).masked_fill(~pos, 0.0)).sum(1) / npos.clamp_min(1)
    return per_anchor.masked_fill(npos == 0, 0.0)


def _ref_lic_pull(features: Tensor, anchors: Tensor, candidates: Tensor, kinds: Tensor) -> Tensor:
    """Reference of ``lic_pull`` (differentiable by autograd): per-anchor loss [A].

    f = F.normalize(features); loss_a = 1 - mean_{kind = 2} <f_a, f_j> = 1 - <f_a, mean of the positives>, 0 without
    positives (kind 1 entries are not read). The positives' mean is one ``index_add`` of the gathered rows.
    """
    f = torch.nn.functional.normalize(features, dim=-1)
    pos = kinds == 2
    npos = pos.sum(1)
    rows = torch.arange(anchors.shape[0], device=f.device)[:, None].expand_as(candidates)[pos]  # [P]
    share = (1.0 / npos.clamp_min(1).to(f.dtype))[rows, None]
    mean_pos = f.new_zeros(anchors.shape[0], f.shape[1]).index_add(0, rows, f[candidates[pos]] * share)  # [A, d]
    return (1.0 - (f[anchors] * mean_pos).sum(-1)).masked_fill(npos == 0, 0.0)


def _ref_project_gaussians(means: Tensor, quats: Tensor, scales: Tensor, viewmats: Tensor, Ks: Tensor, width: int,
                           height: int, eps2d: float = 0.3, near_plane: float = 0.01,
                           far_plane: float = 1e10) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Reference of ``project_gaussians``: gsplat's pure-torch covariance and fully fused projection
    (differentiable by autograd). Returns radii [B,N] int32, means2d, depths, conics."""
    from ._gsplat import fully_fused_projection_torch, quat_scale_to_covar

    radii, means2d, depths, conics = fully_fused_projection_torch(means, quat_scale_to_covar(quats, scales), viewmats,
                                                                  Ks, width, height, eps2d, near_plane, far_plane)
    return radii.int(), means2d, depths, conics


def _ref_sh_colors(degree: int, means: Tensor, campos: Tensor, coeffs: Tensor) -> Tensor:
    """Reference of ``sh_colors``: gsplat's pure-torch SH evaluation of the directions
    ``means - campos`` (differentiable by autograd). Returns [B, N, 3]."""
    from ._gsplat import spherical_harmonics_torch

    dirs = means[None] - campos[:, None, :]
    return spherical_harmonics_torch(degree, dirs, coeffs[None].expand(campos.shape[0], -1, -1, -1))


@torch.no_grad()
def _ref_isect_tiles(means2d: Tensor, radii: Tensor, depths: Tensor, tile_size: int, tile_width: int,
                     tile_height: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Vectorised torch reference of ``isect_tiles`` (gsplat's rounding and (tile, depth) sort key)."""
    B, N = radii.shape
    device = means2d.device
    tm = means2d / tile_size
    tr = (radii / tile_size)[..., None]
    tmin, tmax = torch.floor(tm - tr).long(), torch.ceil(tm + tr).long()
    lim = torch.tensor([tile_width, tile_height], device=device)
    tmin = torch.minimum(tmin.clamp_min(0), lim)
    tmax = torch.minimum(tmax.clamp_min(0), lim)
    ext = tmax - tmin
    tiles_per_gauss = (ext[..., 0] * ext[..., 1]) * (radii > 0)
    counts = tiles_per_gauss.reshape(-1)
    total = int(counts.sum())
    n_tiles = tile_width * tile_height
    gid = torch.repeat_interleave(torch.arange(B * N, device=device), counts)
    local = torch.arange(total, device=device) - (torch.cumsum(counts, 0) - counts)[gid]
    ext_x = ext[..., 0].reshape(-1)[gid]
    tx = tmin[..., 0].reshape(-1)[gid] + local % ext_x.clamp_min(1)
    ty = tmin[..., 1].reshape(-1)[gid] + local // ext_x.clamp_min(1)
    tile_key = (gid // N) * n_tiles + ty * tile_width + tx
    d = depths.reshape(-1)[gid].float().contiguous()
    order = torch.sort((tile_key << 32) | d.view(torch.int32).to(torch.int64), stable=True).indices
    tile_counts = torch.bincount(tile_key, minlength=B * n_tiles)
    offsets = (torch.cumsum(tile_counts, 0) - tile_counts).int().reshape(B, tile_height, tile_width)
    return tiles_per_gauss.int(), offsets, gid[order].int()


def _ref_tile_contributions(
    means2d: Tensor, conics: Tensor, opacities: Tensor, width: int, height: int, tile_size: int,
    isect_offsets: Tensor, flatten_ids: Tensor, with_alpha: bool = False,
) -> Iterator[Tuple[Tensor, ...]]:
    """Yield per tile: (camera b, pixel flat ids [P] into [H*W], gaussian flat ids [K] (b*N+n),
    compositing weights w = alpha*T [P, K] (0 where skipped or terminated), final T [P]) and, with
    ``with_alpha``, the alphas of the same contributions [P, K] (0 where w is 0)."""
    B, TH, TW = isect_offsets.shape
    n_isects = flatten_ids.numel()
    offs = isect_offsets.reshape(-1).tolist() + [n_isects]
    xy_all = means2d.reshape(-1, 2)
    con_all = conics.reshape(-1, 3)
    op_all = opacities.reshape(-1)
    for flat in range(B * TH * TW):
        b, tile = divmod(flat, TH * TW)
        ty, tx = divmod(tile, TW)
        start, end = offs[flat], offs[flat + 1]
        ys = torch.arange(ty * tile_size, min((ty + 1) * tile_size, height), device=means2d.device)
        xs = torch.arange(tx * tile_size, min((tx + 1) * tile_size, width), device=means2d.device)
        if len(ys) == 0 or len(xs) == 0:
            continue
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        pix = (gy * width + gx).reshape(-1)
        ids = flatten_ids[start:end].long()
        if end <= start:
            yield b, pix, ids, torch.zeros(pix.numel(), 0, dtype=means2d.dtype), torch.ones(pix.numel(), dtype=means2d.dtype)
            continue
        p = torch.stack([gx.reshape(-1), gy.reshape(-1)], -1).to(means2d.dtype) + 0.5  # [P, 2]
        delta = xy_all[ids][None, :, :] - p[:, None, :]  # [P, K, 2]
        a, bb, c = con_all[ids].unbind(-1)
        sigma = 0.5 * (a * delta[..., 0] ** 2 + c * delta[..., 1] ** 2) + bb * delta[..., 0] * delta[..., 1]
        alpha = torch.clamp(op_all[ids] * torch.exp(-sigma), max=ALPHA_MAX)
        alpha = torch.where((sigma >= 0) & (alpha >= ALPHA_MIN), alpha, torch.zeros_like(alpha))
        t_after = torch.cumprod(1 - alpha, dim=1)
        keep = (t_after > T_MIN).to(alpha.dtype)  # monotone: a prefix of each row
        t_before = torch.cat([torch.ones_like(t_after[:, :1]), t_after[:, :-1]], dim=1)
        w = alpha * t_before * keep
        t_final = torch.prod(1 - alpha * keep, dim=1)
        yield (b, pix, ids, w, t_final, alpha * keep) if with_alpha else (b, pix, ids, w, t_final)


def _ref_rasterize_to_pixels(
    means2d: Tensor, conics: Tensor, features: Tensor, opacities: Tensor, depths: Tensor,
    backgrounds: Optional[Tensor], width: int, height: int, tile_size: int,
    isect_offsets: Tensor, flatten_ids: Tensor, geometry_channels: Optional[int] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Reference of ``rasterize_to_pixels``: returns render [B,H,W,C], alpha, d1, d2 [B,H,W]. Channels from
    ``geometry_channels`` on are composited with detached weights (their gradient reaches their features only)."""
    B, N, C = features.shape
    cg = C if geometry_channels is None else min(int(geometry_channels), C)
    feat_all = features.reshape(-1, C)
    z_all = depths.reshape(-1)
    render = [torch.zeros(height * width, C, dtype=features.dtype) for _ in range(B)]
    alpha = [torch.zeros(height * width, dtype=features.dtype) for _ in range(B)]
    d1 = [torch.zeros(height * width, dtype=features.dtype) for _ in range(B)]
    d2 = [torch.zeros(height * width, dtype=features.dtype) for _ in range(B)]
    for b, pix, ids, w, t_final in _ref_tile_contributions(
        means2d, conics, opacities, width, height, tile_size, isect_offsets, flatten_ids
    ):
        if ids.numel():
            f = feat_all[ids]
            out = torch.cat([w @ f[..., :cg], w.detach() @ f[..., cg:]], dim=-1)
        else:
            out = torch.zeros(pix.numel(), C, dtype=features.dtype)
        if backgrounds is not None:
            t = torch.cat([t_final[:, None].expand(-1, cg), t_final.detach()[:, None].expand(-1, C - cg)], dim=-1)
            out = out + t * backgrounds[b][None, :]
        z = z_all[ids]
        render[b] = render[b].index_put((pix,), out)
        alpha[b] = alpha[b].index_put((pix,), 1 - t_final)
        d1[b] = d1[b].index_put((pix,), (w * z).sum(1))
        d2[b] = d2[b].index_put((pix,), (w * z * z).sum(1))
    shape = (B, height, width)
    return (
        torch.stack(render).reshape(*shape, C),
        torch.stack(alpha).reshape(shape),
        torch.stack(d1).reshape(shape),
        torch.stack(d2).reshape(shape),
    )


@torch.no_grad()
def _ref_aggregate_sphere(
    means2d: Tensor, conics: Tensor, opacities: Tensor, pixel_feats: Tensor, pixel_weights: Tensor,
    mu: Tensor, delta: float, mode: int, tile_size: int, isect_offsets: Tensor, flatten_ids: Tensor,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Reference of ``aggregate_sphere``: enumerates every contribution explicitly."""
    B, H, W, D = pixel_feats.shape
    N = means2d.shape[1]
    acc_w = torch.zeros(N, dtype=torch.float64)
    acc_v = torch.zeros(N, D, dtype=torch.float64)
    acc_raw = torch.zeros(N, dtype=torch.float64)
    for b, pix, ids, w, _, alpha in _ref_tile_contributions(
        means2d, conics, opacities, W, H, tile_size, isect_offsets, flatten_ids, with_alpha=True
    ):
        pw = pixel_weights[b].reshape(-1)[pix]
        w = (w * pw[:, None]).double()  # [P, K]
        mass = (alpha * pw[:, None]).double()
        pi, ki = torch.nonzero(w > 0, as_tuple=True)
        if pi.numel() == 0:
            continue
        g = ids[ki] % N
        wk = w[pi, ki]
        z = pixel_feats[b].reshape(-1, D)[pix[pi]].double()
        acc_raw.index_add_(0, g, mass[pi, ki])
        if mode == 0:
            acc_w.index_add_(0, g, wk)
            acc_v.index_add_(0, g, wk[:, None] * z)
            continue
        m = mu[g].double()
        cosv = (m * z).sum(-1).clamp(-1, 1)
        resid = z - cosv[:, None] * m
        sinv = resid.norm(dim=-1)
        theta = torch.atan2(sinv, cosv)
        omega = torch.where(theta > delta, wk * delta / theta.clamp_min(1e-30), wk)
        acc_w.index_add_(0, g, omega)
        scale = torch.where(sinv > 1e-12, omega * theta / sinv.clamp_min(1e-30), omega)
        acc_v.index_add_(0, g, scale[:, None] * resid)
    return acc_w.float(), acc_v.float(), acc_raw.float()


def _cell_colors(guide: Tensor, h: int, w: int) -> Tensor:
    """Mean colour of each cell's footprint ``[h, w, 3]`` of a guide ``[H, W, 3]`` split into h x w cells
    (adaptive average pooling: the cells of :func:`rh3dgs.teachers.maps.guided_upsample`); a batch of guides
    ``[B, H, W, 3]`` gives ``[B, h, w, 3]``."""
    g = guide if guide.dim() == 4 else guide[None]
    cells = torch.nn.functional.adaptive_avg_pool2d(g.permute(0, 3, 1, 2), (h, w)).permute(0, 2, 3, 1)
    return cells if guide.dim() == 4 else cells[0]


@torch.no_grad()
def _ref_guided_upsample(m: Tensor, guide: Tensor, gbar: Tensor, sigma_color: float, sigma_space: float,
                         radius: int, min_support: float) -> Tensor:
    """Reference of ``guided_upsample`` (the formula of :func:`rh3dgs.teachers.maps.guided_upsample`):
    m [h, w, D] float, guide [H, W, 3] float, gbar [h, w, 3] = :func:`_cell_colors` -> [H, W, D].
    The pixels of one cell share its neighbour cells, so each cell is one small matrix product."""
    F = torch.nn.functional
    h, w, D = m.shape
    H, W = int(guide.shape[0]), int(guide.shape[1])
    dev, r, k = m.device, int(radius), 2 * int(radius) + 1
    # each pixel's position in cell units and its own cell
    py = (torch.arange(H, device=dev, dtype=torch.float32) + 0.5) * h / H - 0.5
    px = (torch.arange(W, device=dev, dtype=torch.float32) + 0.5) * w / W - 0.5
    cy, cx = py.round().long().clamp(0, h - 1), px.round().long().clamp(0, w - 1)  # non-decreasing
    # The pixels of one cell share its (2r+1)^2 neighbour cells, so each cell's pixels are one small
    # matrix product [pixels, k*k] @ [k*k, D]. A cell's pixels: rows ys[i] x columns xs[j], padded to the
    # largest cell (ry x rx; pad entries repeat the last pixel and are dropped in the end).
    ys, y_ok = _cell_pixels(cy, h)  # [h, ry]
    xs, x_ok = _cell_pixels(cx, w)  # [w, rx]
    ry, rx = ys.shape[1], xs.shape[1]
    # neighbour cells q = (i + dy, j + dx) of cell (i, j), zero-padded: features, has-feature, mean colour
    pad = lambda t: F.pad(t.permute(2, 0, 1)[None], (r, r, r, r))  # noqa: E731  [1, C, h+2r, w+2r]
    nb = F.unfold(pad(m), k).view(D, k * k, h * w).permute(2, 1, 0).contiguous()  # [h*w, k*k, D]
    has = F.unfold(pad((torch.linalg.vector_norm(m, dim=-1, keepdim=True) > 1e-8).float()), k).view(k * k, h, w)
    gq = F.unfold(pad(gbar), k).view(3, k * k, h, w)
    off = torch.arange(-r, r + 1, device=dev, dtype=torch.float32)
    qy = torch.arange(h, device=dev, dtype=torch.float32)[:, None] + off  # [h, k] neighbour rows, in cells
    qx = torch.arange(w, device=dev, dtype=torch.float32)[:, None] + off  # [w, k]
    dy2 = (py[ys][:, :, None] - qy[:, None, :]) ** 2  # [h, ry, k]
    dx2 = (px[xs][:, :, None] - qx[:, None, :]) ** 2  # [w, rx, k]
    out = torch.empty(H, W, D, device=dev)
    step = max(1, (1 << 24) // max(1, ry * w * rx * max(D, k * k)))  # cell rows per block: <= 64 MB temporaries
    for i0 in range(0, h, step):
        i1 = min(h, i0 + step)
        n = i1 - i0
        # [n, ry, w, rx, k, k] log kernel: space (dy, dx) + colour, masked to cells with a feature
        g = guide[ys[i0:i1]][:, :, xs]  # [n, ry, w, rx, 3]
        qcol = gq[:, :, i0:i1].permute(2, 3, 1, 0).reshape(n, 1, w, 1, k * k, 3)
        c2 = ((g[:, :, :, :, None, :] - qcol) ** 2).sum(-1).view(n, ry, w, rx, k, k)
        d2 = dy2[i0:i1].view(n, ry, 1, 1, k, 1) + dx2.view(1, 1, w, rx, 1, k)
        wgt = torch.exp(-d2 / (2 * sigma_space ** 2) - c2 / (2 * sigma_color ** 2)).view(n, ry, w, rx, k * k)
        wgt = wgt * has[:, i0:i1].permute(1, 2, 0).reshape(n, 1, w, 1, k * k)
        wgt = wgt * (wgt.sum(-1, keepdim=True) >= min_support)  # no nearby cell has this pixel's colour: no feature
        cells = wgt.permute(0, 2, 1, 3, 4).reshape(n * w, ry * rx, k * k)
        blk = torch.bmm(cells, nb[i0 * w:i1 * w]).view(n, w, ry, rx, D).permute(0, 2, 1, 3, 4)  # [n, ry, w, rx, D]
        dst = out[int(ys[i0, 0]):int(ys[i1 - 1, -1]) + 1]  # the pixel rows of cell rows i0..i1-1
        if bool(y_ok[i0:i1].all()) and bool(x_ok.all()):  # every cell ry x rx pixels: one copy
            dst.view(n, ry, w, rx, D).copy_(blk)
        else:
            dst.copy_(blk.reshape(n * ry, w * rx, D)[y_ok[i0:i1].reshape(-1)][:, x_ok.reshape(-1)])
    n = torch.linalg.vector_norm(out, dim=-1, keepdim=True)
    return out.mul_(torch.where(n > 0, 1.0 / n.clamp_min(1e-30), 0.0))


def _cell_pixels(cell: Tensor, cells: int) -> Tuple[Tensor, Tensor]:
    """Pixel indices of each cell along one axis ``[cells, r]`` (padded with the cell's last pixel) and which
    are real ``[cells, r]``, from the non-decreasing cell of every pixel ``cell`` (each cell has >= 1 pixel)."""
    bounds = torch.searchsorted(cell, torch.arange(cells + 1, device=cell.device))  # first pixel of each cell
    count = bounds[1:] - bounds[:-1]
    lanes = torch.arange(int(count.max()), device=cell.device)
    ok = lanes[None, :] < count[:, None]
    return torch.minimum(bounds[:-1, None] + lanes, bounds[1:, None] - 1), ok
