"""Filling: features for the Gaussians the views never showed, from their observed 3D neighbours.

The last feature step of the lift (:func:`rh3dgs.lifting.lift`, ``LiftConfig.fill``): a Gaussian
with too little weight, or seen only through the surfaces in front of it, takes the colour-weighted
vote of its nearest observed Gaussians (scipy ``cKDTree``), so that a 3D query selects whole objects,
their hidden parts included.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = ["fill_from_neighbours"]


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
