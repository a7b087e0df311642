"""Colour maps for PNG outputs (turbo heat maps, depth), overlays and result sheets.

* :func:`turbo`, :func:`colorize`: scalar maps -> turbo RGB.
* :func:`overlay_heatmap`: turbo blended over the image where the heat is above a threshold, pixel by
  pixel (the live viewers' overlay).
* :func:`highlight`: the overlay for pictures: the image desaturated and dimmed, the heat map blended
  in above the threshold and the region's outline drawn in white over black, so the result stays
  visible on any object colour (a turbo overlay on a red object alone vanishes).
* :func:`result_sheet`: one PNG per view for text queries: the render, then per query the relevancy
  (turbo on the absolute [0, 1] scale, with a titled colour bar) and :func:`highlight`, each panel
  titled (matplotlib, Agg backend: no display needed).

>>> sheet = result_sheet(rgb, rel, ["red ball", "blue box"], title="frame_00000")  # doctest: +SKIP
>>> atomic_save_png("sheet.png", sheet)                                                            # doctest: +SKIP
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from .query import THRESHOLD

__all__ = ["colorize", "overlay_heatmap", "highlight", "result_sheet", "turbo"]

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


def _outline(mask: torch.Tensor) -> torch.Tensor:
    """bool [H, W] -> the mask's boundary pixels (inside, with a 4-neighbour outside), bool [H, W]."""
    m = mask.float()[None, None]
    eroded = -torch.nn.functional.max_pool2d(-m, 3, stride=1, padding=1)  # min over the 3x3 window
    return (mask & (eroded[0, 0] < 0.5))


def highlight(rgb: torch.Tensor, heat: torch.Tensor, threshold: float = THRESHOLD, strength: float = 0.6,
              background: float = 0.45) -> np.ndarray:
    """[H, W, 3] image, [H, W] heat in [0, 1] -> uint8 [H, W, 3] picture of where ``heat > threshold``.

    The image becomes grey (its luminance) times ``background``, :func:`overlay_heatmap`'s blend of
    turbo is laid over it above the threshold, and the region gets a 2-pixel outline (white inside a
    black line), visible on any colour.
    """
    rgb = rgb.detach().float().cpu().clamp(0, 1)
    heat = heat.detach().float().cpu().clamp(0, 1)
    lum = (rgb * torch.tensor([0.299, 0.587, 0.114])).sum(-1, keepdim=True)
    base = (lum * background).expand_as(rgb)
    inside = heat > threshold
    out = torch.from_numpy(overlay_heatmap(torch.where(inside[..., None], rgb, base), heat, threshold, strength))
    out = out.float() / 255
    edge = _outline(inside)
    grown = torch.nn.functional.max_pool2d(edge.float()[None, None], 3, stride=1, padding=1)[0, 0] > 0
    out[grown & ~inside] = 0.0  # black line outside the region
    out[edge] = 1.0  # white line on its border
    return (out * 255).round().to(torch.uint8).numpy()


def result_sheet(rgb: torch.Tensor, relevancy: torch.Tensor, queries: Sequence[str], threshold: float = THRESHOLD,
                 title: str = "", dpi: int = 100, panel_inches: float = 3.0) -> np.ndarray:
    """uint8 [H', W', 3] sheet: per query a row (the RGB render, its relevancy, :func:`highlight`).

    Args:
        rgb: [H, W, 3] in [0, 1]. relevancy: [Q, H, W] in [0, 1]. queries: Q phrases (panel titles).
        threshold: the selection threshold (drawn on the colour bar, and the highlight's region).
        title: the sheet's title (e.g. the view's name).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # no pyplot: no display, no global state
    from matplotlib.figure import Figure
    from matplotlib.colors import ListedColormap

    rel = relevancy.detach().float().cpu().clamp(0, 1)
    Q = rel.shape[0]
    rgb_np = rgb.detach().float().cpu().clamp(0, 1).numpy()
    cmap = ListedColormap(turbo(torch.linspace(0, 1, 256, dtype=torch.float64)).numpy())
    cols = 3 if Q > 1 else 1 + 2 * Q  # one row per query: render, relevancy, highlight
    rows = max(1, Q) if Q > 1 else 1
    fig = Figure(figsize=(panel_inches * cols + 0.8, panel_inches * rows + 0.5), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    im = None
    for q in range(max(Q, 1)):
        ax_rgb, ax_rel, ax_hi = axes[q] if Q > 1 else (axes[0][0], *(axes[0][1:3] if Q else (None, None)))
        ax_rgb.imshow(rgb_np, interpolation="nearest")
        ax_rgb.set_title("render", fontsize=10)
        if Q == 0:
            break
        im = ax_rel.imshow(rel[q].numpy(), cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
        ax_rel.set_title(f"'{queries[q]}': relevancy (max {float(rel[q].max()):.2f})", fontsize=9)
        ax_hi.imshow(highlight(rgb, rel[q], threshold), interpolation="nearest")
        share = float((rel[q] > threshold).float().mean())
        ax_hi.set_title(f"'{queries[q]}' > {threshold:.2f} ({100 * share:.1f} % of pixels)", fontsize=9)
    for ax in axes.reshape(-1):
        ax.set_xticks([])
        ax.set_yticks([])
    if title:
        fig.suptitle(title, fontsize=11)
    if im is not None:
        bar = fig.colorbar(im, ax=list(axes.reshape(-1)), fraction=0.03, pad=0.01, aspect=25 * rows)
        bar.set_label("relevancy (LERF, absolute 0-1)", fontsize=9)
        bar.ax.axhline(threshold, color="white", linewidth=1.5)
        bar.ax.axhline(threshold, color="black", linewidth=0.6, linestyle="--")
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
