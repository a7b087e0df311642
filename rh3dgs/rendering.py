"""One rendering entry point: ``rh3dgs.render(gaussians, cameras, features=...)``.

Stages: projection (:func:`rh3dgs.ops.project_gaussians`: native on CPU, gsplat's kernel on
CUDA), SH colours (:func:`rh3dgs.ops.sh_colors`), tile binning
(:func:`rh3dgs.ops.isect_tiles`) and compositing (:func:`rh3dgs.ops.rasterize_to_pixels`); each
op dispatches by device, callers never branch on it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

import torch
from torch import Tensor

from .cameras import Cameras
from .errors import ShapeError
from .gaussians import SH_C0, Gaussians
from .ops import Contributions, isect_tiles, project_gaussians, rasterize_to_pixels, sh_colors

__all__ = ["RenderResult", "render", "project", "visible", "FixedViews", "fixed_views"]

DEPTH_EPS = 1e-10


@dataclass
class Projection:
    """Gaussians projected into B cameras (gsplat's non-packed layout).

    radii [B, N] int32 (0 = culled), means2d [B, N, 2], depths [B, N], conics [B, N, 3],
    opacities [B, N] (activated), isect_offsets [B, TH, TW] int32, flatten_ids [M] int32.
    """

    radii: Tensor
    means2d: Tensor
    depths: Tensor
    conics: Tensor
    opacities: Tensor
    isect_offsets: Tensor
    flatten_ids: Tensor
    tile_size: int


@dataclass
class RenderResult:
    """Typed output of :func:`render` (B cameras, H x W pixels).

    rgb:        [B, H, W, 3] colours from the SH coefficients (None if ``rgb=False``).
    features:   [B, H, W, C] composited per-Gaussian features (None if none were given).
    alpha:      [B, H, W] accumulated opacity A = sum_i w_i.
    depth:      [B, H, W] expected depth D1 / (A + eps) (0 where A = 0).
    depth_var:  [B, H, W] ray depth variance max(D2 / (A + eps) - depth^2, 0).
    d1, d2:     [B, H, W] raw depth moments sum_i w_i z_i and sum_i w_i z_i^2.
    radii:      [B, N] int pixel radii of the projected Gaussians (0 = not visible).
    visible:    [B, N] bool, radii > 0.
    projection: the :class:`Projection` (means2d, conics, binning) for re-use (lift, stats).
    contributions: the composited (Gaussian, pixel) contributions (``render(record=True)``), else None.
    """

    rgb: Optional[Tensor]
    features: Optional[Tensor]
    alpha: Tensor
    depth: Tensor
    depth_var: Tensor
    d1: Tensor
    d2: Tensor
    radii: Tensor
    visible: Tensor
    projection: Projection
    contributions: Optional[Contributions] = None


def project(
    gaussians: Gaussians,
    cameras: Cameras,
    tile_size: int = 16,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    eps2d: float = 0.3,
) -> Projection:
    """Project Gaussians into every camera and bin them into tiles."""
    viewmats, Ks = cameras.viewmats.to(gaussians.device), cameras.Ks.to(gaussians.device)
    W, H = int(cameras.width), int(cameras.height)
    radii, means2d, depths, conics = project_gaussians(gaussians.means, gaussians.quats, gaussians.activated_scales,
                                                       viewmats, Ks, W, H, eps2d, near_plane, far_plane)
    radii = radii.int()
    tw, th = math.ceil(W / tile_size), math.ceil(H / tile_size)
    _, offsets, flatten_ids = isect_tiles(means2d, radii, depths, tile_size, tw, th)
    opacities = gaussians.activated_opacities[None].expand(len(cameras), -1)
    return Projection(radii, means2d, depths, conics, opacities, offsets, flatten_ids, tile_size)


def visible(gaussians: Gaussians, cameras: Cameras, near_plane: float = 0.01, far_plane: float = 1e10,
            eps2d: float = 0.3) -> Tensor:
    """[B, N] bool: the Gaussians each camera's :func:`render` can composite (projected radius > 0: in front of the
    near plane, their 3-sigma footprint on the image); every other one is culled, so a render of that camera with
    only the visible ones is the same render. Projection only (no tiles, no compositing)."""
    viewmats, Ks = cameras.viewmats.to(gaussians.device), cameras.Ks.to(gaussians.device)
    radii = project_gaussians(gaussians.means, gaussians.quats, gaussians.activated_scales, viewmats, Ks,
                              int(cameras.width), int(cameras.height), eps2d, near_plane, far_plane)[0]
    return radii > 0


def _sh_colors(gaussians: Gaussians, cameras: Cameras) -> Tensor:
    """[B, N, 3] view-dependent colours (gsplat convention: SH + 0.5, clamped at 0)."""
    coeffs = gaussians.sh_coeffs  # [N, K, 3]
    if gaussians.sh_degree == 0:
        col = (SH_C0 * coeffs[:, 0, :] + 0.5).clamp_min(0.0)
        return col[None].expand(len(cameras), -1, -1)
    campos = torch.linalg.inv(cameras.viewmats.to(gaussians.device))[:, :3, 3]  # [B, 3]
    col = sh_colors(gaussians.sh_degree, gaussians.means, campos, coeffs)
    return (col + 0.5).clamp_min(0.0)


def render(
    gaussians: Gaussians,
    cameras: Cameras,
    features: Optional[Tensor] = None,
    *,
    rgb: bool = True,
    background: Union[Tensor, float, None] = None,
    feature_background: Union[Tensor, float, None] = None,
    tile_size: int = 16,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    eps2d: float = 0.3,
    projection: Optional[Projection] = None,
    features_shape_geometry: bool = True,
    record: bool = False,
) -> RenderResult:
    """Render colours and/or per-Gaussian features with render statistics.

    Args:
        gaussians: the scene (any device; the op runs where the tensors are).
        cameras:   B cameras of one image size.
        features:  optional per-Gaussian features [N, C] (or [B, N, C]), e.g. semantic latents.
        rgb:       also render SH colours.
        background: RGB background, float or [3] / [B, 3] (default black).
        feature_background: background of the feature channels, float or [C] / [B, C] (default 0).
        tile_size, near_plane, far_plane, eps2d: rasterization settings (gsplat's meaning).
        projection: a :class:`Projection` of these Gaussians into these cameras from an earlier call
            (``RenderResult.projection``), re-used instead of projecting again (fixed geometry: the
            lift, distillation on fixed Gaussians, evaluation); gradients then reach the features only.
        features_shape_geometry: False: the feature channels' gradients reach the features only, not the
            Gaussians' geometry (RGB's do; ``rasterize_to_pixels(geometry_channels=...)``, which also makes
            the backward cheaper). A, D1, D2 keep their gradients.

    Returns:
        :class:`RenderResult`.
    """
    if not rgb and features is None:
        raise ShapeError("render() needs rgb=True or per-Gaussian features")
    B, N = len(cameras), len(gaussians)
    if projection is None:
        proj = project(gaussians, cameras, tile_size, near_plane, far_plane, eps2d)
    else:
        proj = projection
        if proj.means2d.shape[:2] != (B, N) or proj.tile_size != tile_size:
            raise ShapeError(f"render(projection=...): a projection of {list(proj.means2d.shape[:2])} (views, Gaussians)"
                             f" at tile size {proj.tile_size} does not match {B} cameras x {N} Gaussians, tile {tile_size}")
    channels, bgs = [], []

    def _bg(value, c: int) -> Tensor:
        if value is None:
            value = 0.0
        t = torch.as_tensor(value, dtype=torch.float32, device=gaussians.device)
        return t.expand(B, c) if t.dim() <= 1 else t

    if rgb:
        channels.append(_sh_colors(gaussians, cameras))
        bgs.append(_bg(background, 3))
    if features is not None:
        if features.dim() == 2:
            features = features[None].expand(B, -1, -1)
        if features.shape[:2] != (B, N):
            raise ShapeError(f"features must be [N, C] or [B, N, C] with N={N}, B={B}, got {list(features.shape)}")
        channels.append(features.to(gaussians.device))
        bgs.append(_bg(feature_background, features.shape[-1]))
    stacked = torch.cat(channels, dim=-1) if len(channels) > 1 else channels[0]
    bg = torch.cat(bgs, dim=-1)
    out = rasterize_to_pixels(
        proj.means2d, proj.conics, stacked, proj.opacities, proj.depths, int(cameras.width), int(cameras.height),
        tile_size, proj.isect_offsets, proj.flatten_ids, backgrounds=bg if (background is not None or feature_background is not None) else None,
        geometry_channels=None if features_shape_geometry or features is None else (3 if rgb else 0), record=record,
    )
    if rgb and features is not None:  # one split: its backward writes both gradients into one tensor
        rgb_out, feat_out = torch.split(out.render, [3, out.render.shape[-1] - 3], dim=-1)
    else:
        rgb_out, feat_out = (out.render, None) if rgb else (None, out.render)
    depth = out.d1 / (out.alpha + DEPTH_EPS)
    depth_var = (out.d2 / (out.alpha + DEPTH_EPS) - depth ** 2).clamp_min(0.0)
    return RenderResult(rgb_out, feat_out, out.alpha, depth, depth_var, out.d1, out.d2, proj.radii, proj.radii > 0, proj,
                        out.contributions)


class _Composite(torch.autograd.Function):
    """y = W f for a view's sparse compositing matrix W (scipy CSR, CPU); the backward is W^T g."""

    @staticmethod
    def forward(ctx, features: Tensor, w, w_t) -> Tensor:  # noqa: D401
        ctx.w_t = w_t
        return torch.from_numpy(w @ features.detach().float().contiguous().numpy())

    @staticmethod
    def backward(ctx, grad: Tensor):
        return torch.from_numpy(ctx.w_t @ grad.float().contiguous().numpy()), None, None


@dataclass
class FixedViews:
    """Fixed Gaussians in fixed cameras, prepared for rendering many feature sets (B views, H x W).

    Rendering features composites them with the weights ``w_i(u) = alpha_i T_i(u)`` of the geometry,
    which do not change when only the features do. On CPU those weights are recorded once per view
    (the native aggregation op visits exactly the rasterizer's contributions) as a sparse
    ``[H*W, N]`` matrix, and a render is a sparse product (its gradient the transposed product);
    on CUDA the views' projections are kept and the features re-rasterized. Either way
    :meth:`render` equals ``render(gaussians, cameras[v], features, rgb=False).features`` (up to the
    order of the float sums).

    alpha, d1, d2: [B, H, W] render statistics of the geometry.
    """

    gaussians: Gaussians
    cameras: Cameras
    alpha: Tensor
    d1: Tensor
    d2: Tensor
    tile_size: int
    matrices: Optional[List[tuple]] = None  # CPU: per view scipy CSR (W [H*W, N], W^T [N, H*W])
    projections: Optional[List[Projection]] = None  # CUDA: per view projection

    def __len__(self) -> int:
        return len(self.cameras)

    def render(self, features: Tensor, views: Sequence[int]) -> Tensor:
        """[N, C] per-Gaussian features -> [len(views), H, W, C] composited (differentiable in ``features``)."""
        H, W = int(self.cameras.height), int(self.cameras.width)
        if self.matrices is None:
            return torch.cat([render(self.gaussians, self.cameras[v], features, rgb=False, tile_size=self.tile_size,
                                     projection=self.projections[v]).features for v in views])
        out = [_Composite.apply(features, *self.matrices[v]) for v in views]
        return torch.stack(out).reshape(len(views), H, W, -1)


def fixed_views(gaussians: Gaussians, cameras: Cameras, tile_size: int = 16) -> FixedViews:
    """:class:`FixedViews` of ``gaussians`` in ``cameras`` (geometry detached)."""
    from scipy.sparse import csr_matrix

    H, W = int(cameras.height), int(cameras.width)
    N = len(gaussians)
    g = Gaussians(gaussians.means.detach(), gaussians.scales.detach(), gaussians.quats.detach(),
                  gaussians.opacities.detach(), gaussians.sh0.detach(), gaussians.shN.detach())
    stats, mats, projs = [], [], []
    cpu = g.device.type == "cpu"
    with torch.no_grad():
        for v in range(len(cameras)):
            r = render(g, cameras[v], torch.ones(N, 1, device=g.device), rgb=False, tile_size=tile_size, record=cpu)
            stats.append((r.alpha, r.d1, r.d2))
            if not cpu:
                projs.append(r.projection)
                continue
            c = r.contributions
            w = csr_matrix((c.weights.float().numpy(), (c.pixels().numpy(), c.gaussian_ids().numpy())),
                           shape=(H * W, N))
            mats.append((w, w.T.tocsr()))
    alpha, d1, d2 = (torch.cat([s[k] for s in stats]) for k in range(3))
    return FixedViews(gaussians, cameras, alpha, d1, d2, tile_size, mats or None, projs or None)
