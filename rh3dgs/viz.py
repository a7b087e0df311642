"""Colour maps for PNG outputs (turbo heat maps, depth) and overlays."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

__all__ = ["colorize", "overlay_heatmap", "turbo"]

# Google's turbo colormap, polynomial approximation (Mikhailov 2019), good to < 1 % of the LUT.
_TURBO_R = (0.13572138, 4.61539260, -42.66032258, 132.13108234, -152.94239396, 59.28637943)
_TURBO_G = (0.09140261, 2.19418839, 4.84296658, -14.18503333, 4.27729857, 2.82956604)
_TURBO_B = (0.10667330, 12.64194608, -60.58204836, 110.36276771, -89.90310912, 27.34824973)


def turbo(x: torch.Tensor) -> torch.Tensor:
    """[...] values in [0, 1] -> [..., 3] turbo RGB in [0, 1]."""
    x = x.clamp(0, 1)[..., None]
    coeffs = torch.tensor([_TURBO_R, _TURBO_G, _TURBO_B], dtype=x.dtype, device=x.device).T  # [6, 3]
    rgb = coeffs[5].expand(*x.shape[:-1], 3)
    for i in range(4, -1, -1):  # Horner: 5 multiply-adds on [..., 3]
        rgb = torch.addcmul(coeffs[i], rgb, x)
    return rgb.clamp(0, 1)


def colorize(values: torch.Tensor, mask: Optional[torch.Tensor] = None, vmin: Optional[float] = None,
             vmax: Optional[float] = None) -> np.ndarray:
    """[H, W] scalar map -> uint8 [H, W, 3] turbo image, min-max scaled over ``mask`` (black outside)."""
    v = values.detach().float().cpu()
    m = torch.ones_like(v, dtype=torch.bool) if mask is None else mask.detach().cpu().bool()
    if m.any():
        lo = float(v[m].min()) if vmin is None else vmin
        hi = float(v[m].max()) if vmax is None else vmax
    else:
        lo, hi = 0.0, 1.0
    x = (v - lo) / max(hi - lo, 1e-12)
    rgb = turbo(x) * m[..., None]
    return (rgb * 255).round().to(torch.uint8).numpy()


def overlay_heatmap(rgb: torch.Tensor, heat: torch.Tensor, threshold: float = 0.0, strength: float = 0.6) -> np.ndarray:
    """Blend a [H, W] heat map in [0, 1] (turbo) over an [H, W, 3] image where heat > threshold."""
    rgb = rgb.detach().float().cpu().clamp(0, 1)
    heat = heat.detach().float().cpu().clamp(0, 1)
    a = (strength * (heat > threshold).float() * heat.clamp_min(0.25))[..., None]
    out = (1 - a) * rgb + a * turbo(heat)
    return (out * 255).round().to(torch.uint8).numpy()
