"""``guided_upsample``: joint bilateral upsampling of a coarse teacher map (native op on CPU).

The lift's guided maps (:mod:`rh3dgs.lifting.views`; re-exported by :mod:`rh3dgs.teachers.maps`). The formula is in
:func:`guided_upsample`'s docstring; :func:`rh3dgs.ops._ref._ref_guided_upsample` computes it with torch (other
devices, tests).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ShapeError
from ._backend import native_ops
from ._ref import _cell_colors, _ref_guided_upsample

__all__ = ["guided_upsample"]


@torch.no_grad()
def guided_upsample(m: Tensor, guide: Tensor, sigma_color: float = 0.05, sigma_space: float = 0.75,
                    radius: int = 1, min_support: float = 1e-8) -> Tensor:
    """Joint bilateral upsampling of a coarse map ``[h, w, D]`` to the guide's ``[H, W]`` (Kopf et al. 2007).

    A coarse cell describes everything in its footprint (a ViT patch), so bilinear upsampling paints a
    halo of an object's feature over its neighbours' pixels. Here each pixel p takes the cells q of the
    ``(2 radius + 1)^2`` neighbourhood of its own cell, weighted by distance and by how well the colour of
    p matches the mean colour of q's footprint:

        f(p) = normalize( sum_q  exp(-|p - c_q|^2 / (2 sigma_s^2)) exp(-|I(p) - Ibar_q|^2 / (2 sigma_c^2)) m_q )

    (``|p - c_q|`` in cells, colours in [0, 1]; zero cells carry no weight). A floor pixel next to a ball
    takes the floor cells around it rather than the cell it shares with the ball. A pixel whose kernel
    support ``sum_q s r`` is below ``min_support`` (its colour is far from every nearby cell's mean: about
    0.3 in RGB at ``sigma_color`` 0.05) gets no feature: the teacher described no region of its colour
    there, and the lift ignores zero pixels. A native kernel on CPU (one pass over the pixels, ~2 ms a
    128x128 view at D = 64 where the torch reference takes 5-8 ms); the reference on other devices.

    Args:
        m: [h, w, D] map (any rows; zero rows = no feature); guide: [H, W, 3] image in [0, 1], H >= h, W >= w
        (a map finer than the image is resized, not upsampled: :func:`rh3dgs.teachers.maps.prepare_map`).
        Or a batch of B views, m [B, h, w, D] and guide [B, H, W, 3]: one [B, H, W, D] output (the lift's
        chunk of views, written in place rather than stacked from per-view maps).
    Returns:
        [H, W, D] (or [B, H, W, D]) float32 unit rows (zero where no cell with a feature is in reach).

    >>> import torch
    >>> m = torch.tensor([[[1., 0.], [0., 1.]]])           # 1 x 2 cells: left "a", right "b"
    >>> guide = torch.zeros(1, 8, 3); guide[:, 3:] = 1.0   # the colour edge is at pixel 3, not at the cell edge 4
    >>> out = guided_upsample(m, guide)
    >>> bool(out[0, 3, 1] > out[0, 3, 0])                   # pixel 3 has b's colour: it takes b's feature
    True
    """
    batched = m.dim() == 4
    if m.dim() not in (3, 4) or guide.dim() != m.dim() or guide.shape[-1] != 3 or (batched and len(m) != len(guide)):
        raise ShapeError(f"guided_upsample: map must be [h, w, D] and guide [H, W, 3] (or [B, h, w, D] and "
                         f"[B, H, W, 3]), got {list(m.shape)} and {list(guide.shape)}")
    h, w = int(m.shape[-3]), int(m.shape[-2])
    if guide.shape[-3] < h or guide.shape[-2] < w:
        raise ShapeError(f"guided_upsample: the guide {list(guide.shape[-3:-1])} is smaller than the map [{h}, {w}]")
    m, guide = m.float(), guide.float().to(m.device)
    gbar = _cell_colors(guide, h, w)
    mb, gb, cb = (m, guide, gbar) if batched else (m[None], guide[None], gbar[None])  # the op takes a batch
    if m.device.type != "cpu":
        out = torch.stack([_ref_guided_upsample(mb[b], gb[b], cb[b], sigma_color, sigma_space, radius, min_support)
                           for b in range(len(mb))])
    else:
        out = native_ops().guided_upsample(mb.contiguous(), gb.contiguous(), cb.contiguous(), float(sigma_color),
                                           float(sigma_space), int(radius), float(min_support))
    return out if batched else out[0]
