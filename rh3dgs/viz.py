"""Colour maps for PNG outputs (turbo heat maps, depth), overlays and result sheets.

* :func:`turbo`, :func:`colorize`: scalar maps -> turbo RGB.
* :func:`overlay_heatmap`: turbo blended over the image where the heat is above a threshold, pixel by
  pixel (the live viewers' overlay).
* :func:`highlight`: the overlay for pictures: the image desaturated and dimmed, the heat map blended
  in above the threshold and the region's outline drawn in white over black, so the result stays
  visible on any object colour (a turbo overlay on a red object alone vanishes).
* :func:`result_sheet`: one PNG per view for text queries: the render, then per query the relevancy
  (turbo on the absolute [0, 1] scale, with a titled colour bar in its own column) and :func:`highlight`,
  each panel titled, laid out by the image's aspect (portrait or landscape; matplotlib, Agg backend: no
  display needed).
* :func:`with_colorbar`: a single heat-map or depth picture with its colour bar and units.

>>> sheet = result_sheet(rgb, rel, ["red ball", "blue box"], title="frame_00000")  # doctest: +SKIP
>>> atomic_save_png("sheet.png", sheet)                                                            # doctest: +SKIP
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from .query import THRESHOLD

__all__ = ["colorize", "overlay_heatmap", "highlight", "result_sheet", "with_colorbar", "turbo"]

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


def _turbo_cmap():
    from matplotlib.colors import ListedColormap

    return ListedColormap(turbo(torch.linspace(0, 1, 256, dtype=torch.float64)).numpy())


def _panel_inches(height: int, width: int, panel_inches: float) -> Tuple[float, float]:
    """(width, height) of an image panel whose longer side is ``panel_inches``: portrait and landscape alike."""
    a = width / max(height, 1)
    return (panel_inches * a, panel_inches) if a < 1 else (panel_inches, panel_inches / a)


def _wrap(text: str, width_inches: float, fontsize: float = 9.0) -> str:
    """``text`` broken into lines that fit a panel ``width_inches`` wide (a character ~0.55 em)."""
    import textwrap

    return "\n".join(textwrap.wrap(text, max(8, int(width_inches * 72 / (0.55 * fontsize))))) or text


def _figure_image(fig) -> np.ndarray:
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def with_colorbar(picture: np.ndarray, vmin: float, vmax: float, label: str, threshold: Optional[float] = None,
                  dpi: int = 100) -> np.ndarray:
    """uint8 [H', W', 3]: a turbo-coded ``picture`` [H, W, 3] (:func:`colorize`, :func:`highlight`) at its own pixel
    size with a colour bar from ``vmin`` to ``vmax`` titled ``label`` (say the units: "depth (scene units)",
    "relevancy (0-1)"); ``threshold`` is marked on the bar. Portrait and landscape alike (the bar on the long side's
    right, at the image's height).

    >>> import torch
    >>> with_colorbar(colorize(torch.rand(40, 30)), 0.0, 1.0, "relevancy (0-1)").shape[:2]   # doctest: +SKIP
    (160, 250)
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    h, w = picture.shape[:2]
    scale = max(1.0, 160.0 / h)  # small renders are enlarged so that the bar's labels stay readable
    fig = Figure(figsize=(w * scale / dpi + 1.2, h * scale / dpi + 0.15), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.imshow(picture, interpolation="nearest")
    ax.set_axis_off()
    bar = fig.colorbar(ScalarMappable(Normalize(vmin, vmax), _turbo_cmap()), ax=ax, fraction=0.08, pad=0.02)
    bar.set_label(label, fontsize=8)
    bar.ax.tick_params(labelsize=7)
    if threshold is not None:
        bar.ax.axhline(threshold, color="white", linewidth=1.5)
        bar.ax.axhline(threshold, color="black", linewidth=0.6, linestyle="--")
    return _figure_image(fig)


def result_sheet(rgb: torch.Tensor, relevancy: torch.Tensor, queries: Sequence[str], threshold: float = THRESHOLD,
                 title: str = "", dpi: int = 100, panel_inches: float = 3.0) -> np.ndarray:
    """uint8 [H', W', 3] sheet: per query a row (the RGB render, its relevancy, :func:`highlight`), the colour bar in a
    column of its own on the right; panels keep the image's aspect (portrait or landscape), titles on two lines.

    Args:
        rgb: [H, W, 3] in [0, 1]. relevancy: [Q, H, W] in [0, 1]. queries: Q phrases (panel titles).
        threshold: the selection threshold (drawn on the colour bar, and the highlight's region).
        title: the sheet's title (e.g. the view's name).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # no pyplot: no display, no global state
    from matplotlib.figure import Figure

    rel = relevancy.detach().float().cpu().clamp(0, 1)
    Q = rel.shape[0]
    rgb_np = rgb.detach().float().cpu().clamp(0, 1).numpy()
    pw, ph = _panel_inches(rgb_np.shape[0], rgb_np.shape[1], panel_inches)
    rows, cols = max(Q, 1), (3 if Q else 1)
    bar_w = 0.9 if Q else 0.0
    fig = Figure(figsize=(pw * cols + bar_w + 0.3, (ph + 0.55) * rows + (0.35 if title else 0.1)), dpi=dpi,
                 layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(rows, cols + (1 if Q else 0), width_ratios=[pw] * cols + ([bar_w * 0.25] if Q else []))
    im = None
    for q in range(rows):
        ax = fig.add_subplot(grid[q, 0])
        ax.imshow(rgb_np, interpolation="nearest")
        ax.set_title("render", fontsize=9)
        ax.set_axis_off()
        if not Q:
            break
        ax = fig.add_subplot(grid[q, 1])
        im = ax.imshow(rel[q].numpy(), cmap=_turbo_cmap(), vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(_wrap(f"'{queries[q]}'", pw) + f"\nrelevancy (max {float(rel[q].max()):.2f})", fontsize=9)
        ax.set_axis_off()
        ax = fig.add_subplot(grid[q, 2])
        ax.imshow(highlight(rgb, rel[q], threshold), interpolation="nearest")
        share = float((rel[q] > threshold).float().mean())
        ax.set_title(_wrap(f"'{queries[q]}' > {threshold:.2f}", pw) + f"\n({100 * share:.1f} % of pixels)", fontsize=9)
        ax.set_axis_off()
    if title:
        fig.suptitle(title, fontsize=11)
    if im is not None:
        bar = fig.colorbar(im, cax=fig.add_subplot(grid[:, cols]))
        bar.set_label("relevancy (LERF, absolute 0-1)", fontsize=9)
        bar.ax.axhline(threshold, color="white", linewidth=1.5)
        bar.ax.axhline(threshold, color="black", linewidth=0.6, linestyle="--")
    return _figure_image(fig)
