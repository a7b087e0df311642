"""``guided_upsample``: joint bilateral upsampling of a coarse teacher map (native op on CPU).

The formula is that of :func:`rh3dgs.teachers.maps.guided_upsample` (the lift's guided maps): pixel p
takes the cells q of its cell's ``(2 r + 1)^2`` neighbourhood with weight
``exp(-|p - c_q|^2 / (2 sigma_s^2) - |I(p) - Ibar_q|^2 / (2 sigma_c^2))`` (0 for cells without a feature),
and ``out(p) = normalize(sum_q w_q m_q)`` (0 where the weights sum below ``min_support``).
:func:`rh3dgs.ops._ref._ref_guided_upsample` computes it with torch (other devices, tests).

>>> import torch
>>> from rh3dgs.ops import guided_upsample
>>> m = torch.tensor([[[1., 0.], [0., 1.]]]); guide = torch.zeros(1, 8, 3); guide[:, 3:] = 1.0
>>> guided_upsample(m, guide)[0, 3]      # pixel 3 has the right cell's colour: it takes its feature
tensor([0.0000, 1.0000])
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
    """m [h, w, D] map (zero rows: no feature), guide [H, W, 3] in [0, 1] with H >= h, W >= w -> [H, W, D]
    float32 unit rows (zero where no cell with a feature and a matching colour is in reach)."""
    if m.dim() != 3 or guide.dim() != 3 or guide.shape[2] != 3:
        raise ShapeError(f"guided_upsample: map must be [h, w, D] and guide [H, W, 3], got {list(m.shape)} and "
                         f"{list(guide.shape)}")
    h, w = int(m.shape[0]), int(m.shape[1])
    if guide.shape[0] < h or guide.shape[1] < w:
        raise ShapeError(f"guided_upsample: the guide {list(guide.shape[:2])} is smaller than the map [{h}, {w}]")
    m, guide = m.float(), guide.float().to(m.device)
    gbar = _cell_colors(guide, h, w)
    if m.device.type != "cpu":
        return _ref_guided_upsample(m, guide, gbar, sigma_color, sigma_space, radius, min_support)
    return native_ops().guided_upsample(m.contiguous(), guide.contiguous(), gbar.contiguous(), float(sigma_color),
                                        float(sigma_space), int(radius), float(min_support))
