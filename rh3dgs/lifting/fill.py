"""Filling: features for the Gaussians the views never showed, from their observed 3D neighbours.

The last feature step of the lift (:func:`rh3dgs.lifting.lift`, ``LiftConfig.fill``): a Gaussian
with too little weight, or seen only through the surfaces in front of it, takes the vote of the
observed Gaussians around it under a bilateral (space x colour) kernel (scipy ``cKDTree``, all cores;
the weighted sums as torch's ``embedding_bag``), so that
a 3D query selects whole objects, their hidden parts included.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = ["fill_from_neighbours"]


def fill_from_neighbours(means: Tensor, colors: Tensor, features: Tensor, observed: Tensor, k: int = 512,
                         color_sigma: float = 0.05, radius: Optional[float] = None,
                         confidence: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Features for the Gaussians without one, from their observed 3D neighbours.

    For every Gaussian i with ``observed[i] = False``, its ``k`` nearest observed Gaussians j within
    ``radius`` r (scipy ``cKDTree``) vote with the bilateral weight::

        w_ij = q_j exp(-|c_i - c_j|^2 / (2 sigma_c^2) - d_ij^2 / (2 (r / 2)^2)),   f_i = normalize(sum_j w_ij f_j)

    Colour decides and distance breaks ties within the neighbourhood, so that the floor under a box takes
    the floor's feature and the box's underside the box's, even where the nearest observed Gaussians are
    the other surface's (the wall of a box touches the floor it stands on). The weights are taken relative
    to each row's largest (a softmax of the log weights), so a Gaussian with any observed neighbour in ``radius`` is filled
    whatever its colour. Gaussians with none stay without a feature. ``q_j`` is the neighbour's
    ``confidence`` (1 when None): the lift passes its visibility squared, since an observed Gaussian seen
    mostly through the surface in front of it (the floor at the foot of a box) carries some of that surface's
    feature. Memory: ``[M, k]`` weights for the M filled Gaussians (``embedding_bag``: no ``[M, k, D]`` gather).

    Args:
        means [N, 3], colors [N, 3] in [0, 1], features [N, D] unit rows, observed [N] bool;
        k: observed neighbours per filled Gaussian; color_sigma: sigma_c; radius: r (None: 10 % of the
        diagonal of the means' 2-98 % box); confidence: [N] > 0 vote weights of the observed Gaussians.
    Returns:
        ``(features [N, D], filled [N] bool)``: observed rows unchanged, filled rows set.

    >>> import torch
    >>> m = torch.tensor([[0., 0, 0], [1., 0, 0], [0.1, 0, 0]]); c = torch.zeros(3, 3)
    >>> f = torch.tensor([[1., 0], [0., 1], [0., 0]]); obs = torch.tensor([True, True, False])
    >>> fill_from_neighbours(m, c, f, obs, k=2, radius=2.0)[0][2]   # nearer to Gaussian 0
    tensor([0.8306, 0.5568])
    """
    from scipy.spatial import cKDTree

    N = features.shape[0]
    filled = torch.zeros(N, dtype=torch.bool, device=features.device)
    todo = torch.nonzero(~observed).flatten().cpu()
    src = torch.nonzero(observed).flatten().cpu()
    if len(todo) == 0 or len(src) == 0:
        return features, filled
    pts = means.detach().double().cpu()
    if radius is None:
        lo, hi = torch.quantile(pts, torch.tensor([0.02, 0.98], dtype=torch.float64), dim=0)
        radius = 0.1 * float(torch.linalg.vector_norm(hi - lo))
    radius = max(float(radius), 1e-12)
    kk = min(int(k), len(src))
    tree = cKDTree(pts[src].numpy())
    col = colors.detach().float().cpu()
    col_src = col[src]  # the observed Gaussians' colours, votes and features, indexed by the tree's ids
    conf_src = None if confidence is None else confidence.detach().float().cpu()[src].clamp_min(1e-12)
    dev = features.device
    feat_src = features[src.to(dev)]
    out = features.clone()
    chunk = max(1, (1 << 22) // kk)  # rows per chunk: ~4M (row, neighbour) pairs at a time
    for a in range(0, len(todo), chunk):
        rows = todo[a:a + chunk]
        dist, j = tree.query(pts[rows].numpy(), k=kk, distance_upper_bound=radius, workers=-1)
        dist = torch.from_numpy(dist.reshape(len(rows), kk)).float()
        j = torch.from_numpy(j.reshape(len(rows), kk))
        got = torch.isfinite(dist[:, 0])  # missing neighbours: inf distance, index len(src); nearest first
        if not bool(got.any()):
            continue
        jj = j[got].clamp_max_(len(src) - 1)
        dc2 = (col_src[jj] - col[rows[got]][:, None]).square_().sum(-1)
        # log weights; a missing neighbour's inf distance gives -inf, weight 0 (softmax: no underflow)
        w = torch.softmax(-dc2 / (2.0 * color_sigma ** 2) - dist[got] ** 2 / (2.0 * (0.5 * radius) ** 2), dim=1)
        if conf_src is not None:
            w = w * conf_src[jj]
        # each row's kk weighted neighbour features summed (a bag of rows of feat_src)
        f = torch.nn.functional.embedding_bag(jj.to(dev), feat_src, per_sample_weights=w.to(dev, features.dtype),
                                              mode="sum")
        idx = rows[got].to(dev)
        out[idx] = torch.nn.functional.normalize(f, dim=-1)
        filled[idx] = True
    return out, filled
