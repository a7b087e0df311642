"""Pictures (rh3dgs.viz): the highlight stays visible on any colour; result sheets have their panels."""
from __future__ import annotations

import numpy as np
import torch

from rh3dgs.viz import highlight, overlay_heatmap, result_sheet


def _disc(n=48):
    yy, xx = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    return (1 - ((xx - n / 2) ** 2 + (yy - n / 2) ** 2).float().sqrt() / (n / 2)).clamp(0, 1)


def test_highlight_is_visible_on_a_red_object():
    heat = _disc()
    rgb = torch.zeros(48, 48, 3)
    rgb[..., 0] = 0.9  # a red object everywhere: turbo's top end is red too
    inside = (heat > 0.5).numpy()
    out = highlight(rgb, heat, threshold=0.5).astype(int)
    plain = overlay_heatmap(rgb, heat, threshold=0.5).astype(int)
    # outside the region: grey (luminance x 0.45), no longer red
    outside = ~inside & (np.abs(np.arange(48)[:, None] - 24) > 22)
    assert (np.abs(out[outside][:, 0] - out[outside][:, 1]) <= 1).all()
    assert out[outside].max() <= round(0.9 * 0.299 * 0.45 * 255) + 1
    # a white border line inside and a black one outside the region
    white = (out == 255).all(-1)
    assert white.sum() > 40 and inside[white].all()
    # the region stands out from its surroundings much more than with the plain overlay
    def contrast(img):
        return np.abs(img[inside].mean(0) - img[~inside].mean(0)).sum()
    assert contrast(out) > 3 * contrast(plain), (contrast(out), contrast(plain))


def test_result_sheet_has_render_relevancy_and_highlight_panels():
    rgb = torch.rand(32, 40, 3, generator=torch.Generator().manual_seed(0))
    rel = torch.stack([_disc(40)[:32], 1 - _disc(40)[:32]])
    sheet = result_sheet(rgb, rel, ["red ball", "blue box"], threshold=0.5, title="view 0", dpi=50)
    assert sheet.dtype == np.uint8 and sheet.ndim == 3 and sheet.shape[2] == 3
    one = result_sheet(rgb, rel[:1], ["red ball"], threshold=0.5, dpi=50)
    assert sheet.shape[0] > 1.5 * one.shape[0]  # one row per query
    assert sheet.std() > 20  # not blank


def test_sheets_follow_the_image_aspect_and_single_maps_get_a_colour_bar():
    """Portrait and landscape sheets: the panels keep the image's aspect (a portrait sheet is taller for its width);
    a single heat map / depth picture gets a colour bar beside it (the bar's ends: turbo(0) and turbo(1))."""
    from rh3dgs.viz import colorize, turbo, with_colorbar

    def sheet(h, w):
        rel = torch.linspace(0, 1, w).expand(1, h, w)
        return result_sheet(torch.full((h, w, 3), 0.5), rel, ["red ball"], title="v", dpi=50)

    portrait, landscape = sheet(80, 40), sheet(40, 80)
    assert portrait.shape[0] / portrait.shape[1] > 1.5 * landscape.shape[0] / landscape.shape[1]
    pic = colorize(torch.linspace(0, 1, 30).expand(60, 30), vmin=0.0, vmax=1.0)
    out = with_colorbar(pic, 0.0, 1.0, "relevancy (0-1)")
    assert out.shape[1] > pic.shape[1] + 20 and out.shape[0] >= pic.shape[0]
    ends = (turbo(torch.tensor([0.0, 1.0])) * 255).round().numpy()
    for c in ends:  # both ends of the colour bar are drawn
        assert (np.abs(out.astype(float) - c).max(-1) < 8).sum() > 20
