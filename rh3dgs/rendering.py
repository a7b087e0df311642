"""One rendering entry point: ``rh3dgs.render(gaussians, cameras, features=...)``.

Stages: projection (:func:`rh3dgs.ops.project_gaussians`: native on CPU, gsplat's kernel on
CUDA), SH colours (:func:`rh3dgs.ops.sh_colors`), tile binning
(:func:`rh3dgs.ops.isect_tiles`) and compositing (:func:`rh3dgs.ops.rasterize_to_pixels`); each
op dispatches by device, callers never branch on it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor

from .cameras import Cameras
from .errors import ShapeError
from .gaussians import Gaussians
from .ops import isect_tiles, project_gaussians, rasterize_to_pixels, sh_colors

__all__ = ["RenderResult", "render", "project"]

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


def _sh_colors(gaussians: Gaussians, cameras: Cameras) -> Tensor:
    """[B, N, 3] view-dependent colours (gsplat convention: SH + 0.5, clamped at 0)."""
    coeffs = gaussians.sh_coeffs  # [N, K, 3]
    if gaussians.sh_degree == 0:
        C0 = 0.28209479177387814
        col = (C0 * coeffs[:, 0, :] + 0.5).clamp_min(0.0)
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

    Returns:
        :class:`RenderResult`.
    """
    if not rgb and features is None:
        raise ShapeError("render() needs rgb=True or per-Gaussian features")
    B, N = len(cameras), len(gaussians)
    proj = project(gaussians, cameras, tile_size, near_plane, far_plane, eps2d)
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
    )
    rgb_out = out.render[..., :3] if rgb else None
    feat_out = out.render[..., 3:] if (rgb and features is not None) else (out.render if features is not None else None)
    depth = out.d1 / (out.alpha + DEPTH_EPS)
    depth_var = (out.d2 / (out.alpha + DEPTH_EPS) - depth ** 2).clamp_min(0.0)
    return RenderResult(rgb_out, feat_out, out.alpha, depth, depth_var, out.d1, out.d2, proj.radii, proj.radii > 0, proj)
