"""Native ops of rh3dgs (one Python entry per op; backend chosen by device).

* :func:`rasterize_to_pixels` - N-D feature compositing + render statistics (A, D1, D2); on CPU it
  can record the contributions it composites for :func:`aggregate_sphere_replay`.
* :func:`aggregate_sphere` - per-Gaussian robust spherical mean accumulation (lift); its passes over
  recorded contributions: :func:`aggregate_sphere_replay`.
* :func:`project_gaussians` - EWA projection into pinhole cameras (autograd).
* :func:`sh_colors` - view-dependent colours from SH coefficients.
* :func:`isect_tiles` - tile binning.
* :func:`relevancy` - text-query relevancy of latent rows (the query fast path).
* :func:`guided_upsample` - joint bilateral upsampling of a coarse teacher map (the lift's guided maps).
* :func:`lic_infonce` - the LIC multi-positive InfoNCE per anchor (autograd).
* :func:`lic_pull` - LIC's pull form per anchor, 1 - cosine to the positives' mean (autograd).
Pure-torch references live in :mod:`rh3dgs.ops._ref`.
"""
from .aggregate import aggregate_sphere, aggregate_sphere_replay
from .binning import isect_tiles
from .guided import guided_upsample
from .lic import lic_infonce, lic_pull
from .projection import project_gaussians
from .sh import sh_colors
from .rasterize import Contributions, RasterOutput, rasterize_to_pixels
from .relevancy import relevancy

__all__ = ["aggregate_sphere", "aggregate_sphere_replay", "Contributions", "isect_tiles", "project_gaussians", "sh_colors", "rasterize_to_pixels", "RasterOutput", "relevancy", "lic_infonce", "lic_pull", "guided_upsample"]
