"""Frames of a scene (rh3dgs.io.coordinate_frames): similarity maps, nerfstudio's normalisation, PLY frame detection.

The reference for nerfstudio's frame is nerfstudio's own ``nerfstudio-data`` parser: the map
``applied_transform @ (s T)^-1`` built from the ``dataparser_transforms.json`` it writes takes the
dataset's cameras to the cameras it trains with. A lift of an ``ns-export``-frame PLY end to end
(``rh3dgs lift`` on a real ``ns-train`` run) is in tests/test_quickstart.py.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rh3dgs.data.synthetic import SceneConfig, make_scene, write_dataset
from rh3dgs.io.coordinate_frames import (FrameError, Similarity, frame_fit, nerfstudio_to_data, read_dataparser_transforms,
                              to_data_frame, transform_c2w, transform_gaussians)
from rh3dgs.io.ply import save_ply
from rh3dgs.rendering import render

# ns-process-data's applied_transform for COLMAP (what nerfstudio assumes without the field)
A_COLMAP = [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, -1.0, 0.0]]


def _rot(axis, deg):
    a = math.radians(deg)
    x, y, z = torch.nn.functional.normalize(torch.tensor(axis, dtype=torch.float64), dim=0)
    K = torch.tensor([[0, -z, y], [z, 0, -x], [-y, x, 0]], dtype=torch.float64)
    return torch.eye(3, dtype=torch.float64) + math.sin(a) * K + (1 - math.cos(a)) * K @ K


@pytest.fixture(scope="module")
def scene():
    return make_scene(SceneConfig(num_views=6, image_size=48, gaussians_per_unit_area=1500.0))


@pytest.fixture(scope="module")
def dataset(scene, tmp_path_factory):
    root = tmp_path_factory.mktemp("frames") / "data"
    write_dataset(scene, root, progress=False)
    return root


def test_similarity_algebra():
    S = Similarity(_rot([1, 2, 3], 40), torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64), 0.7)
    x = torch.randn(50, 3, dtype=torch.float64)
    torch.testing.assert_close(S.inverse().apply(S.apply(x)), x)
    torch.testing.assert_close((S @ S.inverse()).apply(x), x)
    M = torch.cat([S.s * S.R, S.t[:, None]], 1)
    back = Similarity.from_matrix(M)
    torch.testing.assert_close(back.apply(x), S.apply(x))
    torch.testing.assert_close(Similarity.from_matrix(M, 2.0).apply(x), 2.0 * S.apply(x))
    with pytest.raises(FrameError, match="not a rotation"):
        Similarity.from_matrix(torch.diag(torch.tensor([1.0, 1.0, -1.0, 1.0]))[:3])
    with pytest.raises(FrameError, match="shears"):
        Similarity.from_matrix([[1.0, 0.5, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]])


def test_mapped_gaussians_render_as_the_scene_through_mapped_cameras(scene):
    """Means, log-scales, rotations and SH move together: image(S g, S cams) == image(g, cams)."""
    g = scene.gaussians
    g = type(g)(g.means, g.scales, g.quats, g.opacities, g.sh0, torch.randn(len(g), 3, 3) * 0.3)  # SH degree 1
    S = Similarity(_rot([0.2, -1, 0.5], 70), torch.tensor([1.0, 2.0, -0.5], dtype=torch.float64), 0.35)
    cams = scene.cameras[:2]
    c2w = transform_c2w(cams.c2w_opengl.double(), S)
    from rh3dgs.cameras import OPENGL_TO_OPENCV, Cameras

    cams_s = Cameras(torch.linalg.inv(c2w @ OPENGL_TO_OPENCV.double()).float(), cams.Ks, cams.width, cams.height)
    a = render(g, cams).rgb
    b = render(transform_gaussians(g, S), cams_s).rgb
    assert (a - b).abs().mean() < 1e-4 and (a - b).abs().max() < 0.05, float((a - b).abs().max())


def test_nerfstudio_to_data_matches_nerfstudios_own_parser(dataset, tmp_path):
    """nerfstudio's cameras == our map of the dataset's cameras, with an applied_transform in transforms.json."""
    pytest.importorskip("nerfstudio")
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    from rh3dgs.io.transforms import load_transforms

    data = tmp_path / "data"
    data.mkdir()
    meta = json.loads((dataset / "transforms.json").read_text())
    meta.pop("ply_file_path", None)
    meta["applied_transform"] = A_COLMAP
    (data / "transforms.json").write_text(json.dumps(meta))
    (data / "images").symlink_to(dataset / "images")
    out = NerfstudioDataParserConfig(data=data, load_3D_points=False).setup().get_dataparser_outputs("train")
    out.save_dataparser_transform(tmp_path / "dataparser_transforms.json")
    to_data = nerfstudio_to_data(tmp_path / "dataparser_transforms.json", data)
    cams, _ = load_transforms(data, check_images=False)
    ours = transform_c2w(cams.c2w_opengl.double(), to_data.inverse())[:, :3]
    names = [Path(p).stem for p in out.image_filenames]
    ref = out.cameras.camera_to_worlds.double()
    idx = [cams.names.index(n) for n in names]
    torch.testing.assert_close(ours[idx], ref, atol=1e-5, rtol=0)
    # the capture frame is folded into nerfstudio's transform: T != transform of the saved poses alone
    assert not read_dataparser_transforms(tmp_path / "dataparser_transforms.json").is_identity()


def _ns_frame(scene, folder: Path, with_transforms: bool) -> Path:
    """The scene's Gaussians in a nerfstudio-like normalised frame (as ns-export writes them)."""
    S = Similarity(_rot([0, 0, 1], 25), torch.tensor([0.0, 0.0, -0.52], dtype=torch.float64), 0.327)
    folder.mkdir(parents=True, exist_ok=True)
    ply = save_ply(folder / "splat.ply", transform_gaussians(scene.gaussians, S), plain=True)
    if with_transforms:
        M = torch.cat([S.R, (S.t / S.s)[:, None]], 1)
        (folder.parent / "dataparser_transforms.json").write_text(json.dumps({"transform": M.tolist(), "scale": S.s}))
    return Path(ply)


def test_detect_frame_transforms_or_refuses(scene, dataset, tmp_path):
    from rh3dgs.io.ply import load_ply

    g0 = scene.gaussians
    cams = scene.cameras
    inside, cov = frame_fit(g0.means, cams)
    assert inside > 0.99 and cov > 0.4, (inside, cov)
    # a PLY in the dataset's frame is kept as it is
    images = [dataset / "images" / f"{n}.png" for n in cams.names]
    g, frame = to_data_frame(g0, dataset / "scene.ply", cams, dataset, images=images)
    assert frame == "data" and g is g0
    # ns-export's frame with the run's dataparser_transforms.json above it: mapped back
    ply = _ns_frame(scene, tmp_path / "run" / "exports", with_transforms=True)
    g, frame = to_data_frame(load_ply(ply), ply, cams, dataset)
    assert frame == "nerfstudio"
    assert (g.means - g0.means).abs().max() < 1e-4
    assert (g.scales - g0.scales).abs().max() < 1e-5
    # without it: refused with one line naming the frame expected and how to get it
    ply = _ns_frame(scene, tmp_path / "alone", with_transforms=False)
    with pytest.raises(FrameError) as ei:
        to_data_frame(load_ply(ply), ply, cams, dataset)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(str(ply)) and "nerfstudio's normalised frame" in msg
    assert "rh3dgs export" in msg and "dataparser_transforms.json" in msg
    # --frame data takes it as it is
    assert to_data_frame(load_ply(ply), ply, cams, dataset, frame="data")[1] == "data"


def test_capture_frame_from_applied_transform(scene, dataset, tmp_path):
    """An INRIA / COLMAP PLY (capture frame) of a dataset whose transforms.json has an applied_transform."""
    data = tmp_path / "data"
    data.mkdir()
    A = Similarity.from_matrix(A_COLMAP)
    meta = json.loads((dataset / "transforms.json").read_text())
    meta["applied_transform"] = A_COLMAP
    (data / "transforms.json").write_text(json.dumps(meta))
    g_capture = transform_gaussians(scene.gaussians, A.inverse())
    images = [dataset / "images" / f"{n}.png" for n in scene.cameras.names]
    g, frame = to_data_frame(g_capture, data / "point_cloud.ply", scene.cameras, data, images=images)
    assert frame == "capture"
    assert (g.means - scene.gaussians.means).abs().max() < 1e-4
