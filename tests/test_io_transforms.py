"""nerfstudio transforms.json loading / saving."""
from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from rh3dgs.cameras import Cameras
from rh3dgs.errors import CameraFormatError
from rh3dgs.io.transforms import load_transforms, save_transforms

W, H = 16, 12


def make_image(path, w=W, h=H):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((h, w, 3), 128, np.uint8)).save(path)


def pose(t=(0.0, 0.0, 5.0), rot=None):
    m = np.eye(4)
    if rot is not None:
        m[:3, :3] = rot
    m[:3, 3] = t
    return m.tolist()


def rot_y(deg):
    a = math.radians(deg)
    return np.array([[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0, math.cos(a)]])


def write_dataset(root, meta=None, frames=None, images=True):
    if frames is None:
        frames = [
            {"file_path": "images/frame_00001.png", "transform_matrix": pose()},
            {"file_path": "images/frame_00002.png", "transform_matrix": pose((1.0, 2.0, 3.0), rot_y(30)), "fl_x": 22.0, "cx": 7.5},
        ]
    meta = {"camera_model": "OPENCV", "fl_x": 20.0, "fl_y": 21.0, "cx": 8.0, "cy": 6.5, "w": W, "h": H, **(meta or {})}
    meta["frames"] = frames
    if images:
        for fr in frames:
            if isinstance(fr, dict) and isinstance(fr.get("file_path"), str):
                make_image(root / fr["file_path"])
    p = root / "transforms.json"
    p.write_text(json.dumps(meta, indent=2))
    return p


def expect_error(path_or_dir, field=None, match=None, **kw):
    with pytest.raises(CameraFormatError) as ei:
        load_transforms(path_or_dir, **kw)
    msg = str(ei.value)
    json_path = path_or_dir if str(path_or_dir).endswith(".json") else path_or_dir / "transforms.json"
    assert str(json_path) in msg
    if field is not None:
        assert ei.value.field == field, msg
        assert f"[{field}]" in msg
    if match is not None:
        assert match in msg, msg
    return msg


# ------------------------------------------------------------------ valid files
def test_valid_load_intrinsics_and_override(tmp_path):
    p = write_dataset(tmp_path)
    cams, paths = load_transforms(tmp_path)  # folder form
    assert isinstance(cams, Cameras) and len(cams) == 2
    assert (cams.width, cams.height) == (W, H)
    assert paths == [tmp_path / "images/frame_00001.png", tmp_path / "images/frame_00002.png"]
    assert cams.names == ["frame_00001", "frame_00002"]
    K0, K1 = cams.Ks[0].tolist(), cams.Ks[1].tolist()
    assert K0 == [[20.0, 0.0, 8.0], [0.0, 21.0, 6.5], [0.0, 0.0, 1.0]]
    assert K1 == [[22.0, 0.0, 7.5], [0.0, 21.0, 6.5], [0.0, 0.0, 1.0]]  # per-frame fl_x / cx win
    cams2, _ = load_transforms(p)  # file form
    assert torch.equal(cams2.viewmats, cams.viewmats)


def test_opengl_to_opencv(tmp_path):
    write_dataset(tmp_path)
    cams, _ = load_transforms(tmp_path)
    # camera at (0,0,5), identity rotation in OpenGL -> looks down world -z at the origin
    origin = torch.tensor([0.0, 0.0, 0.0, 1.0])
    cam_pt = cams.viewmats[0] @ origin
    assert torch.allclose(cam_pt, torch.tensor([0.0, 0.0, 5.0, 1.0]), atol=1e-6)
    # a world point above the axis (+y world = up) is at negative camera y (OpenCV y down)
    up_pt = cams.viewmats[0] @ torch.tensor([0.0, 1.0, 0.0, 1.0])
    assert up_pt[1].item() == pytest.approx(-1.0) and up_pt[2].item() == pytest.approx(5.0)
    right_pt = cams.viewmats[0] @ torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert right_pt[0].item() == pytest.approx(1.0)
    # centres come back
    assert torch.allclose(cams.centers, torch.tensor([[0.0, 0.0, 5.0], [1.0, 2.0, 3.0]]), atol=1e-6)
    # matches Cameras.from_c2w_opengl
    ref = Cameras.from_c2w_opengl(torch.tensor([pose()]), 20.0, 21.0, 8.0, 6.5, W, H)
    assert torch.allclose(ref.viewmats[0], cams.viewmats[0], atol=1e-6)


def test_defaults_for_missing_fly_cx_cy(tmp_path):
    meta = {"fl_x": 30.0, "w": W, "h": H}
    frames = [{"file_path": "a.png", "transform_matrix": pose()}]
    make_image(tmp_path / "a.png")
    (tmp_path / "transforms.json").write_text(json.dumps({**meta, "frames": frames}))
    cams, _ = load_transforms(tmp_path)
    assert cams.Ks[0].tolist() == [[30.0, 0.0, W / 2], [0.0, 30.0, H / 2], [0.0, 0.0, 1.0]]


def test_per_frame_only_intrinsics_and_absolute_path(tmp_path):
    img = tmp_path / "elsewhere" / "x.png"
    make_image(img)
    frames = [{"file_path": str(img), "transform_matrix": pose(), "fl_x": 10, "fl_y": 11, "w": W, "h": H}]
    root = tmp_path / "ds"
    root.mkdir()
    (root / "transforms.json").write_text(json.dumps({"frames": frames}))
    cams, paths = load_transforms(root)
    assert paths == [img]
    assert cams.Ks[0, 0, 0].item() == 10.0 and cams.Ks[0, 1, 1].item() == 11.0


def test_distortion_is_ignored_with_warning(tmp_path):
    write_dataset(tmp_path, meta={"k1": 0.1, "p2": 0.0})
    with pytest.warns(UserWarning, match="distortion"):
        cams, _ = load_transforms(tmp_path)
    assert cams.Ks[0, 0, 0].item() == 20.0
    write_dataset(tmp_path, meta={"k1": 0.0, "k2": 0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_transforms(tmp_path)


# ------------------------------------------------------------------ errors
def test_missing_file(tmp_path):
    expect_error(tmp_path / "nope.json", match="file not found")
    expect_error(tmp_path, match="no transforms.json")


def test_invalid_json_reports_line(tmp_path):
    p = tmp_path / "transforms.json"
    p.write_text('{\n  "fl_x": 10,\n  "frames": [\n    {"file_path": "a.png",}\n  ]\n}\n')
    msg = expect_error(p, match="invalid JSON at line 4")
    assert "column" in msg


@pytest.mark.parametrize(
    "mutate,field,match",
    [
        (lambda m: m.pop("frames"), "frames", "missing key 'frames'"),
        (lambda m: m["frames"][1].pop("transform_matrix"), "frames[1].transform_matrix", "missing key"),
        (lambda m: m["frames"][0].pop("file_path"), "frames[0].file_path", "missing key"),
        (lambda m: [m.pop("fl_x"), m["frames"][0].pop("fl_x", None)], "frames[0].fl_x", "missing key 'fl_x'"),
        (lambda m: m.pop("w"), "frames[0].w", "missing key 'w'"),
        (lambda m: m["frames"][1].update(transform_matrix=[[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]), "frames[1].transform_matrix", "4x4"),
        (lambda m: m["frames"][0].update(transform_matrix=[[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]]), "frames[0].transform_matrix", "4x4"),
        (lambda m: m["frames"][0].update(transform_matrix="eye"), "frames[0].transform_matrix", "4x4"),
        (lambda m: m["frames"][0]["transform_matrix"][1].__setitem__(2, "x"), "frames[0].transform_matrix[1][2]", "expected a number"),
        (lambda m: m["frames"][0]["transform_matrix"][0].__setitem__(3, float("nan")), "frames[0].transform_matrix[0][3]", "non-finite"),
        (lambda m: m["frames"][1].update(transform_matrix=[[0] * 4] * 3 + [[0, 0, 0, 1]]), "frames[1].transform_matrix", "singular"),
        (lambda m: m.update(fl_y=float("inf")), "fl_y", "non-finite"),
        (lambda m: m["frames"][1].update(cx=float("nan")), "frames[1].cx", "non-finite"),
        (lambda m: m.update(fl_y=-3), "fl_y", "> 0"),
        (lambda m: m.update(camera_model="OPENCV_FISHEYE"), "camera_model", "not supported"),
        (lambda m: m.update(camera_model="EQUIRECTANGULAR"), "camera_model", "not supported"),
        (lambda m: m["frames"][1].update(w=W * 2), "frames[1].w", "mixed image sizes are not supported"),
        (lambda m: m.update(frames=[]), "frames", "no frames"),
    ],
)
def test_bad_fields(tmp_path, mutate, field, match):
    p = write_dataset(tmp_path)
    meta = json.loads(p.read_text())
    mutate(meta)
    p.write_text(json.dumps(meta))  # json.dumps writes NaN / Infinity, which json.loads accepts
    expect_error(tmp_path, field=field, match=match)


def test_missing_images_listed(tmp_path):
    frames = [{"file_path": f"images/{i}.png", "transform_matrix": pose()} for i in range(8)]
    write_dataset(tmp_path, frames=frames, images=False)
    make_image(tmp_path / "images/0.png")
    make_image(tmp_path / "images/2.png")
    msg = expect_error(tmp_path, field="frames[1].file_path", match="6 of 8 images not found")
    assert str(tmp_path / "images/1.png") in msg and str(tmp_path / "images/7.png") not in msg
    assert "and 1 more" in msg
    # existence is checked even without check_images
    expect_error(tmp_path, field="frames[1].file_path", check_images=False)


def test_wrong_image_size(tmp_path):
    write_dataset(tmp_path)
    make_image(tmp_path / "images/frame_00002.png", w=W + 1, h=H)
    msg = expect_error(tmp_path, field="frames[1].file_path", match=f"is {W + 1}x{H}")
    assert "frame_00002.png" in msg
    cams, _ = load_transforms(tmp_path, check_images=False)  # size not checked
    assert len(cams) == 2


def test_unreadable_image(tmp_path):
    write_dataset(tmp_path)
    (tmp_path / "images/frame_00001.png").write_bytes(b"not an image")
    expect_error(tmp_path, field="frames[0].file_path", match="cannot read image")


# ------------------------------------------------------------------ save / round trip
def test_round_trip(tmp_path):
    p = write_dataset(tmp_path)
    cams, paths = load_transforms(p)
    out = tmp_path / "out.json"
    assert save_transforms(out, cams, paths) == out
    meta = json.loads(out.read_text())
    assert meta["w"] == W and meta["h"] == H and meta["fl_y"] == 21.0 and meta["cy"] == 6.5
    assert "fl_x" not in meta and meta["frames"][1]["fl_x"] == 22.0  # differs per frame
    assert meta["frames"][0]["file_path"] == "images/frame_00001.png"  # relative, POSIX
    np.testing.assert_allclose(meta["frames"][0]["transform_matrix"], pose(), atol=1e-6)
    cams2, paths2 = load_transforms(out)
    assert paths2 == paths
    assert torch.allclose(cams2.viewmats, cams.viewmats, atol=1e-5, rtol=0)
    assert torch.equal(cams2.Ks, cams.Ks)
    assert cams2.names == cams.names


def test_round_trip_random_cameras(tmp_path):
    torch.manual_seed(0)
    eyes = torch.randn(5, 3) * 4
    cams = Cameras.look_at(eyes, torch.zeros(3), width=W, height=H)
    paths = [tmp_path / f"img{i}.png" for i in range(5)]
    for ip in paths:
        make_image(ip)
    save_transforms(tmp_path, cams, paths)  # folder form -> transforms.json
    cams2, paths2 = load_transforms(tmp_path)
    assert paths2 == paths
    assert (cams2.viewmats - cams.viewmats).abs().max().item() < 1e-5
    assert torch.equal(cams2.Ks, cams.Ks)
    meta = json.loads((tmp_path / "transforms.json").read_text())
    assert meta["camera_model"] == "PINHOLE" and "fl_x" in meta and "fl_x" not in meta["frames"][0]


def test_lazy_package_export(tmp_path):
    import rh3dgs

    write_dataset(tmp_path)
    cams, _ = rh3dgs.load_transforms(tmp_path)
    assert len(cams) == 2
