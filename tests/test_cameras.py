"""rh3dgs.cameras: cameras for a scene that comes without any (scene_bounds, detect_up, orbit_cameras) and
``rh3dgs render SCENE.ply`` without a transforms.json."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rh3dgs.cameras import detect_up, orbit_cameras, scene_bounds


def test_scene_bounds_ignore_floaters_and_transparent_gaussians():
    g = torch.Generator().manual_seed(0)
    body = torch.randn(5000, 3, generator=g) * 0.5 + torch.tensor([1.0, 2.0, 3.0])
    floaters = torch.randn(200, 3, generator=g) * 1e3
    means = torch.cat([body, floaters, torch.full((300, 3), 50.0)])
    opac = torch.cat([torch.full((5200,), 3.0), torch.full((300,), -8.0)])  # the far cluster is transparent
    c, r = scene_bounds(means, opac)
    torch.testing.assert_close(c, torch.tensor([1.0, 2.0, 3.0]), atol=0.05, rtol=0)
    assert 1.2 < r < 2.2  # the 95th percentile of the distances: within the 0.5-sigma cloud (~1.7), not 1e3 away


def test_scene_bounds_frame_a_standing_object_whose_gaussians_crowd_at_its_base():
    """A guitar-like object: a dense body at the bottom, a thin neck up to y = -4 (PLY frame, up -y). The centre is
    the box's middle, well above the median, and the neck's top is in the picture of ``rh3dgs render``'s orbit
    (distance 1.1 r / sin(fov / 2) shows 1.1 r / cos(fov / 2) = 1.21 r either side of the centre at fov 50)."""
    g = torch.Generator().manual_seed(2)
    body = torch.randn(7000, 3, generator=g) * 0.4
    neck = torch.stack([torch.zeros(3000), -torch.rand(3000, generator=g) * 4.0, torch.zeros(3000)], dim=-1)
    means = torch.cat([body, neck])
    c, r = scene_bounds(means)
    assert float(c[1]) < float(means[:, 1].median()) - 1.0  # not the median: the body's centre
    assert float((torch.tensor([0.0, -4.0, 0.0]) - c).norm()) <= 1.1 * r / np.cos(np.deg2rad(25.0))


@pytest.mark.parametrize("axis,shape,expect", [(1, (0.3, 3.0, 0.4), "-y"),   # a standing figure along y
                                               (2, (2.0, 2.0, 0.1), "z"),    # a flat disk in xy
                                               (0, (1.0, 1.0, 1.0), "-y")])  # no dominant axis: PLY convention
def test_detect_up(axis, shape, expect):
    g = torch.Generator().manual_seed(1)
    means = torch.randn(4000, 3, generator=g) * torch.tensor(shape)
    assert detect_up(means)[0] == expect


def test_orbit_cameras_look_at_the_centre_from_above():
    c = torch.tensor([0.5, -1.0, 2.0])
    cams = orbit_cameras(c, 2.0, "-y", views=6, width=40, height=30, elevation_deg=20.0)
    centers = cams.centers.double()
    d = centers - c.double()
    np.testing.assert_allclose(d.norm(dim=-1).numpy(), 5.0, rtol=1e-5)
    np.testing.assert_allclose(-d[:, 1].numpy() / 5.0, np.sin(np.deg2rad(20.0)), atol=1e-5)  # 20 degrees above
    # every camera looks at the centre: it projects to the image centre
    X = torch.cat([c, torch.ones(1)])
    p = (cams.Ks @ (cams.viewmats @ X)[:, :3, None])[:, :, 0]
    np.testing.assert_allclose((p[:, :2] / p[:, 2:]).numpy(), np.tile([20.0, 15.0], (6, 1)), atol=1e-3)
    assert cams.names[0] == "orbit_000" and len(set(map(tuple, centers.round(decimals=4).tolist()))) == 6


def test_render_without_transforms_writes_an_orbit(tmp_path, capsys):
    """`rh3dgs render SCENE.ply --output DIR` with no transforms.json: an orbit's PNGs (depth with a colour bar
    and as .npy), a turntable GIF and the orbit's transforms.json (a dataset of the renders)."""
    import imageio.v3 as iio

    from rh3dgs.cli import main
    from rh3dgs.data.synthetic import SceneConfig, make_scene
    from rh3dgs.io.ply import save_ply
    from rh3dgs.io.transforms import load_transforms

    ply = save_ply(tmp_path / "scene.ply", make_scene(SceneConfig(num_views=2, image_size=16,
                                                                  gaussians_per_unit_area=300.0)).gaussians)
    assert main(["render", str(ply), "--output", str(tmp_path / "orbit"), "--orbit", "5", "--size", "32"]) == 0
    out = capsys.readouterr().out
    assert "5 orbit cameras around the scene's centre" in out and "up z" in out  # the synthetic floor: z up
    frames = iio.imread(tmp_path / "orbit" / "turntable.gif")
    assert frames.shape == (5, 32, 32, 3) and frames.std() > 5
    cams, images = load_transforms(tmp_path / "orbit")
    assert len(cams) == 5 and [p.name for p in images] == [f"orbit_{i:03d}_rgb.png" for i in range(5)]
    depth = np.load(tmp_path / "orbit" / "orbit_000_depth.npy")
    assert depth.shape == (32, 32) and depth.max() > 0
    assert iio.imread(tmp_path / "orbit" / "orbit_000_depth.png").shape[1] > 32  # the colour bar beside the map
    meta = json.loads((tmp_path / "orbit" / "transforms.json").read_text())
    assert meta["w"] == 32 and len(meta["frames"]) == 5
