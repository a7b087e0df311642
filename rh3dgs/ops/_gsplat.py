"""gsplat behind one module: every gsplat function rh3dgs calls is named here, and only here.

Written against gsplat 1.4.0 (:data:`GSPLAT_VERSION`, the version nerfstudio 1.1.5 pins);
``tests/test_ops_gsplat.py`` pins what these wrappers expect of it (the names exist, their
parameters, and the numbers on tiny cases against hand-written references). A gsplat upgrade
changes this file and its test, nothing else.

Two kinds of function, as in gsplat itself:

* pure-torch functions (gsplat's private ``gsplat.cuda._torch_impl``; they run on any device): the
  references of rh3dgs's native projection and SH ops (:mod:`rh3dgs.ops._ref`) and the run reader's
  SH rotation: :func:`quat_scale_to_covar`, :func:`fully_fused_projection_torch`,
  :func:`spherical_harmonics_torch`, :func:`eval_sh_bases`, :func:`isect_tiles_torch`,
  :func:`isect_offset_encode_torch`;
* CUDA kernels (``gsplat.cuda._wrapper``), rh3dgs's CUDA path where it has no kernel of its own:
  :func:`fully_fused_projection_cuda`, :func:`spherical_harmonics_cuda`, :func:`isect_tiles_cuda`,
  :func:`isect_offset_encode_cuda`, :func:`rasterize_to_pixels_cuda`. The first call of one JIT-builds
  gsplat's extension: never give them CPU tensors (the ops in ``rh3dgs/ops`` choose by device).

Importing this module imports no gsplat; each wrapper imports what it calls.

Shapes (gsplat's, non-packed): N Gaussians, C cameras, M tile intersections.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from torch import Tensor

__all__ = [
    "GSPLAT_VERSION", "EXPECTED",
    "quat_scale_to_covar", "fully_fused_projection_torch", "spherical_harmonics_torch", "eval_sh_bases",
    "isect_tiles_torch", "isect_offset_encode_torch",
    "fully_fused_projection_cuda", "spherical_harmonics_cuda", "isect_tiles_cuda", "isect_offset_encode_cuda",
    "rasterize_to_pixels_cuda",
]

GSPLAT_VERSION = "1.4.0"
"""The gsplat version these wrappers are written (and tested) against."""

_TORCH = "gsplat.cuda._torch_impl"
_CUDA = "gsplat.cuda._wrapper"

EXPECTED: Dict[Tuple[str, str], Tuple[str, ...]] = {
    (_TORCH, "_quat_scale_to_covar_preci"): ("quats", "scales", "compute_covar", "compute_preci", "triu"),
    (_TORCH, "_fully_fused_projection"): ("means", "covars", "viewmats", "Ks", "width", "height", "eps2d",
                                          "near_plane", "far_plane"),
    (_TORCH, "_spherical_harmonics"): ("degree", "dirs", "coeffs"),
    (_TORCH, "_eval_sh_bases_fast"): ("basis_dim", "dirs"),
    (_TORCH, "_isect_tiles"): ("means2d", "radii", "depths", "tile_size", "tile_width", "tile_height"),
    (_TORCH, "_isect_offset_encode"): ("isect_ids", "C", "tile_width", "tile_height"),
    (_CUDA, "fully_fused_projection"): ("means", "covars", "quats", "scales", "viewmats", "Ks", "width", "height",
                                        "eps2d", "near_plane", "far_plane", "radius_clip", "packed"),
    (_CUDA, "spherical_harmonics"): ("degrees_to_use", "dirs", "coeffs"),
    (_CUDA, "isect_tiles"): ("means2d", "radii", "depths", "tile_size", "tile_width", "tile_height", "sort",
                             "packed"),
    (_CUDA, "isect_offset_encode"): ("isect_ids", "n_cameras", "tile_width", "tile_height"),
    (_CUDA, "rasterize_to_pixels"): ("means2d", "conics", "colors", "opacities", "image_width", "image_height",
                                     "tile_size", "isect_offsets", "flatten_ids", "backgrounds"),
}
"""(module, function) -> the leading parameter names each wrapper relies on (checked by the test)."""


# ------------------------------------------------------------------------------ pure torch
def quat_scale_to_covar(quats: Tensor, scales: Tensor) -> Tensor:
    """[N, 4] (w, x, y, z) quaternions, [N, 3] activated scales -> [N, 3, 3] covariances R S S R^T."""
    from gsplat.cuda._torch_impl import _quat_scale_to_covar_preci

    covars, _ = _quat_scale_to_covar_preci(quats, scales, compute_covar=True, compute_preci=False, triu=False)
    return covars


def fully_fused_projection_torch(means: Tensor, covars: Tensor, viewmats: Tensor, Ks: Tensor, width: int,
                                 height: int, eps2d: float, near_plane: float, far_plane: float
                                 ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Pinhole projection of [N, 3] means / [N, 3, 3] covariances into [C, 4, 4] world-to-camera
    ``viewmats`` with [C, 3, 3] ``Ks`` -> radii [C, N] int (0 = culled), means2d [C, N, 2] (pixels),
    depths [C, N], conics [C, N, 3] (upper triangle of the inverse 2D covariance + ``eps2d`` I)."""
    from gsplat.cuda._torch_impl import _fully_fused_projection

    radii, means2d, depths, conics, _ = _fully_fused_projection(
        means, covars, viewmats, Ks, width, height, eps2d=eps2d, near_plane=near_plane, far_plane=far_plane)
    return radii, means2d, depths, conics


def spherical_harmonics_torch(degree: int, dirs: Tensor, coeffs: Tensor) -> Tensor:
    """Colours [..., 3] of SH ``coeffs`` [..., K, 3] (bands up to ``degree``) in directions ``dirs``
    [..., 3] (normalised here); gsplat's basis and signs, without the +0.5 offset."""
    from gsplat.cuda._torch_impl import _spherical_harmonics

    return _spherical_harmonics(degree, dirs, coeffs)


def eval_sh_bases(basis_dim: int, dirs: Tensor) -> Tensor:
    """The first ``basis_dim`` (a square, 1..25) real SH basis functions at unit ``dirs`` [..., 3] -> [..., basis_dim]."""
    from gsplat.cuda._torch_impl import _eval_sh_bases_fast

    return _eval_sh_bases_fast(basis_dim, dirs)


def isect_tiles_torch(means2d: Tensor, radii: Tensor, depths: Tensor, tile_size: int, tile_width: int,
                      tile_height: int) -> Tuple[Tensor, Tensor, Tensor]:
    """gsplat's (slow, Python-loop) reference of tile binning -> tiles_per_gauss [C, N] int32, sorted
    isect_ids [M] int64 ((camera, tile, depth bits) keys), flatten_ids [M] int32 (c * N + n)."""
    from gsplat.cuda._torch_impl import _isect_tiles

    return _isect_tiles(means2d, radii, depths, tile_size, tile_width, tile_height)


def isect_offset_encode_torch(isect_ids: Tensor, n_cameras: int, tile_width: int, tile_height: int) -> Tensor:
    """Sorted isect_ids [M] -> isect_offsets [C, tile_height, tile_width] int32 (each tile's first index)."""
    from gsplat.cuda._torch_impl import _isect_offset_encode

    return _isect_offset_encode(isect_ids, n_cameras, tile_width, tile_height)


# ------------------------------------------------------------------------------ CUDA kernels
def fully_fused_projection_cuda(means: Tensor, quats: Tensor, scales: Tensor, viewmats: Tensor, Ks: Tensor,
                                width: int, height: int, eps2d: float, near_plane: float, far_plane: float
                                ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`fully_fused_projection_torch` on CUDA, from quaternions and activated scales (non-packed)."""
    from gsplat.cuda._wrapper import fully_fused_projection

    radii, means2d, depths, conics, _ = fully_fused_projection(
        means, None, quats, scales, viewmats, Ks, width, height, eps2d=eps2d, near_plane=near_plane,
        far_plane=far_plane, packed=False)
    return radii, means2d, depths, conics


def spherical_harmonics_cuda(degree: int, dirs: Tensor, coeffs: Tensor) -> Tensor:
    """:func:`spherical_harmonics_torch` on CUDA."""
    from gsplat.cuda._wrapper import spherical_harmonics

    return spherical_harmonics(degree, dirs, coeffs)


def isect_tiles_cuda(means2d: Tensor, radii: Tensor, depths: Tensor, tile_size: int, tile_width: int,
                     tile_height: int) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`isect_tiles_torch` on CUDA (non-packed, sorted)."""
    from gsplat.cuda._wrapper import isect_tiles

    return isect_tiles(means2d, radii, depths, tile_size, tile_width, tile_height, sort=True, packed=False)


def isect_offset_encode_cuda(isect_ids: Tensor, n_cameras: int, tile_width: int, tile_height: int) -> Tensor:
    """:func:`isect_offset_encode_torch` on CUDA."""
    from gsplat.cuda._wrapper import isect_offset_encode

    return isect_offset_encode(isect_ids, n_cameras, tile_width, tile_height)


def rasterize_to_pixels_cuda(means2d: Tensor, conics: Tensor, colors: Tensor, opacities: Tensor, width: int,
                             height: int, tile_size: int, isect_offsets: Tensor, flatten_ids: Tensor,
                             backgrounds: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """gsplat's CUDA compositing of ``colors`` [C, N, K] -> (render [C, H, W, K], alpha [C, H, W, 1])."""
    from gsplat.cuda._wrapper import rasterize_to_pixels

    return rasterize_to_pixels(means2d, conics, colors, opacities, width, height, tile_size, isect_offsets,
                               flatten_ids, backgrounds=backgrounds)
