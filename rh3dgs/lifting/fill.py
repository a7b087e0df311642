"""Filling: features for the Gaussians the views never showed, from their observed 3D neighbours.

The last feature step of the lift (:func:`rh3dgs.lifting.lift`, ``LiftConfig.fill``): a Gaussian
with too little weight, or seen only through the surfaces in front of it, takes the vote of the
observed Gaussians around it under a bilateral (space x colour) kernel (scipy ``cKDTree``, all cores;
the weighted sums as torch's ``embedding_bag``), so that
a 3D query selects whole objects, their hidden parts included.
"""
from __future__ import annotations

from typing import Optional, Protocol, Tuple

import torch
from torch import Tensor

__all__ = ["RowSource", "fill_from_neighbours"]


class RowSource(Protocol):
    """Where one block of a distributed lift reads the features of other blocks' Gaussians
    (:class:`rh3dgs.lifting.shard.LiftShard`). Both calls are collective: every block makes them alike."""

    def rounds(self, n: int) -> int:
        """The number of fetches every block makes when this one needs ``n`` (the largest ``n``)."""

    def __call__(self, ids: Tensor) -> Tensor:
        """``[len(ids), D]`` features of the Gaussians ``ids`` (sorted, unique scene rows; may be empty)."""


def fill_from_neighbours(means: Tensor, colors: Tensor, features: Tensor, observed: Tensor, k: int = 512,
                         color_sigma: float = 0.05, radius: Optional[float] = None,
                         confidence: Optional[Tensor] = None, start: int = 0,
                         fetch: Optional[RowSource] = None) -> Tuple[Tensor, Tensor]:
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
        start, fetch: a block of a distributed lift: ``features`` holds rows ``start .. start + n`` only, those rows
            are filled, and ``fetch`` gives the features of observed Gaussians in any block (``means``, ``colors``,
            ``observed`` and ``confidence`` stay [N]: every block builds the same k-d tree; the rows filled are the
            single process's rows, bit for bit, from the same features).
    Returns:
        ``(features [n, D], filled [n] bool)`` (n = N unless ``fetch``): observed rows unchanged, filled rows set.

    >>> import torch
    >>> m = torch.tensor([[0., 0, 0], [1., 0, 0], [0.1, 0, 0]]); c = torch.zeros(3, 3)
    >>> f = torch.tensor([[1., 0], [0., 1], [0., 0]]); obs = torch.tensor([True, True, False])
    >>> fill_from_neighbours(m, c, f, obs, k=2, radius=2.0)[0][2]   # nearer to Gaussian 0
    tensor([0.8306, 0.5568])
    """
    from scipy.spatial import cKDTree

    n = features.shape[0]  # rows start .. start + n of the scene (all of them without fetch)
    filled = torch.zeros(n, dtype=torch.bool, device=features.device)
    todo = torch.nonzero(~observed[start:start + n]).flatten().cpu() + start
    src = torch.nonzero(observed).flatten().cpu()
    if len(src) == 0 or (fetch is None and len(todo) == 0):  # (src is the same in every block)
        return features, filled
    pts = means.detach().double().cpu()
    if radius is None:
        lo, hi = torch.quantile(pts, torch.tensor([0.02, 0.98], dtype=torch.float64), dim=0)
        radius = 0.1 * float(torch.linalg.vector_norm(hi - lo))
    radius = max(float(radius), 1e-12)
    kk = min(int(k), len(src))
    tree = cKDTree(pts[src].numpy()) if len(todo) else None
    col = colors.detach().float().cpu()
    col_src = col[src]  # the observed Gaussians' colours, votes and features, indexed by the tree's ids
    conf_src = None if confidence is None else confidence.detach().float().cpu()[src].clamp_min(1e-12)
    dev = features.device
    feat_src = features[src.to(dev)] if fetch is None else None
    out = features.clone()
    chunk = max(1, (1 << 22) // kk)  # rows per chunk: ~4M (row, neighbour) pairs at a time
    starts = list(range(0, len(todo), chunk))
    for c in range(len(starts) if fetch is None else fetch.rounds(len(starts))):
        if c >= len(starts):  # this block is done; the others still fetch
            fetch(src[:0])
            continue
        rows = todo[starts[c]:starts[c] + chunk]
        dist, j = tree.query(pts[rows].numpy(), k=kk, distance_upper_bound=radius, workers=-1)
        dist = torch.from_numpy(dist.reshape(len(rows), kk)).float()
        j = torch.from_numpy(j.reshape(len(rows), kk))
        got = torch.isfinite(dist[:, 0])  # missing neighbours: inf distance, index len(src); nearest first
        if not bool(got.any()):
            if fetch is not None:
                fetch(src[:0])
            continue
        jj = j[got].clamp_max_(len(src) - 1)
        dc2 = (col_src[jj] - col[rows[got]][:, None]).square_().sum(-1)
        # log weights; a missing neighbour's inf distance gives -inf, weight 0 (softmax: no underflow)
        w = torch.softmax(-dc2 / (2.0 * color_sigma ** 2) - dist[got] ** 2 / (2.0 * (0.5 * radius) ** 2), dim=1)
        if conf_src is not None:
            w = w * conf_src[jj]
        if fetch is not None:  # the neighbours' features from their blocks, as a table of the ones needed
            need, jj = torch.unique(jj, return_inverse=True)
            table = fetch(src[need]).to(dev, features.dtype)
        else:
            table = feat_src
        # each row's kk weighted neighbour features summed (a bag of rows of the table)
        f = torch.nn.functional.embedding_bag(jj.to(dev), table, per_sample_weights=w.to(dev, features.dtype),
                                              mode="sum")
        idx = (rows[got] - start).to(dev)
        out[idx] = torch.nn.functional.normalize(f, dim=-1)
        filled[idx] = True
    return out, filled
