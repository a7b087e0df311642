"""nerfstudio transforms.json loading / saving."""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

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


# ------------------------------------------------------------------ distortion, missing images, downscale
REALDATA = Path(__file__).resolve().parents[1].parent / "shared" / "realdata"
if not REALDATA.is_dir():
    REALDATA = Path("/work/shared/realdata")


def _distort(x, y, k1, k2, p1, p2, k3):
    """OpenCV's radial-tangential model on normalised coordinates (the formula, written out)."""
    r2 = x * x + y * y
    radial = 1 + k1 * r2 + k2 * r2**2 + k3 * r2**3
    return (x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x),
            y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y)


def _undistort_normalised(xd, yd, coeffs, iters=200):
    """Inverse of :func:`_distort` by fixed-point iteration (independent of OpenCV)."""
    x, y = xd.copy(), yd.copy()
    for _ in range(iters):
        dx, dy = _distort(x, y, *coeffs)
        x, y = x - (dx - xd), y - (dy - yd)
    return x, y


def _blob_image(w, h, K, coeffs, centres, sigma):
    """Distorted photo of Gaussian blobs: pixel centres (i + 0.5) mapped to undistorted normalised coordinates."""
    u, v = np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)
    x, y = _undistort_normalised((u - K[0][2]) / K[0][0], (v - K[1][2]) / K[1][1], coeffs)
    img = np.zeros((h, w))
    for cx, cy in centres:
        img += np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * sigma**2))
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8)


def test_undistortion_matches_opencv_and_the_formula(tmp_path):
    """Three cameras with OpenCV distortion (one per frame): the returned pinhole cameras and the
    undistorted images agree with cv2.undistortPoints and with the distortion formula to < 0.05 px."""
    import cv2

    w, h = 160, 120
    f, cx, cy = 150.0, 81.3, 58.7
    dists = [(0.12, -0.05, 0.002, -0.0015, 0.0), (-0.18, 0.04, -0.001, 0.002, 0.01), (0.12, -0.05, 0.002, -0.0015, 0.0)]
    rng = np.random.default_rng(0)
    centres = [(a, b) for a in (-0.33, -0.11, 0.11, 0.33) for b in (-0.25, 0.0, 0.25)]  # >= 16 px apart
    frames = []
    for i, (k1, k2, p1, p2, k3) in enumerate(dists):
        fr = {"file_path": f"images/f{i}.png", "transform_matrix": pose((float(i), 0.0, 5.0))}
        if i == 1:  # per-frame coefficients, nerfstudio's distortion_params order [k1, k2, k3, k4, p1, p2]
            fr["distortion_params"] = [k1, k2, k3, 0.0, p1, p2]
        frames.append(fr)
        img = _blob_image(w, h, [[f, 0, cx], [0, f, cy]], (k1, k2, p1, p2, k3), centres, 0.012)
        make_image(tmp_path / fr["file_path"], w, h)
        Image.fromarray(np.repeat(img[..., None], 3, -1)).save(tmp_path / fr["file_path"])
    k1, k2, p1, p2, k3 = dists[0]
    meta = {"fl_x": f, "fl_y": f, "cx": cx, "cy": cy, "w": w, "h": h, "k1": k1, "k2": k2, "p1": p1, "p2": p2,
            "frames": frames}  # instant-ngp style: no camera_model key
    (tmp_path / "transforms.json").write_text(json.dumps(meta))
    cams, paths = load_transforms(tmp_path, image_cache=tmp_path / "cache", progress=False)
    assert all(str(p).startswith(str(tmp_path / "cache")) for p in paths) and [p.stem for p in paths] == ["f0", "f1", "f2"]
    assert cams.names == ["f0", "f1", "f2"]
    for i, coeffs in enumerate(dists):
        K = cams.Ks[i].double().numpy()
        und = np.asarray(Image.open(paths[i]).convert("L"), np.float64)
        assert und.shape == (cams.height, cams.width)
        # 1) geometry: distorted pixels of points -> cv2.undistortPoints (OpenCV pixel centres at i) -> our camera
        xs = rng.uniform(-0.4, 0.4, size=(50, 2))
        xd, yd = _distort(xs[:, 0], xs[:, 1], *coeffs)
        ud = np.stack([f * xd + cx, f * yd + cy], -1)  # rh3dgs / nerfstudio pixels (centres at i + 0.5)
        Kcv = np.array([[f, 0, cx - 0.5], [0, f, cy - 0.5], [0, 0, 1]])
        Pcv = K.copy()
        Pcv[0, 2] -= 0.5
        Pcv[1, 2] -= 0.5
        crit = (cv2.TERM_CRITERIA_COUNT | cv2.TERM_CRITERIA_EPS, 100, 1e-12)
        cv = cv2.undistortPoints(ud[:, None] - 0.5, Kcv, np.array(coeffs), None, None, Pcv, crit)[:, 0] + 0.5
        ours = np.stack([K[0, 0] * xs[:, 0] + K[0, 2], K[1, 1] * xs[:, 1] + K[1, 2]], -1)
        assert np.abs(cv - ours).max() < 0.05, np.abs(cv - ours).max()
        # 2) image: each blob's centroid in the undistorted image sits where our pinhole camera projects it
        errs = []
        for bx, by in centres:
            u0, v0 = K[0, 0] * bx + K[0, 2], K[1, 1] * by + K[1, 2]
            if not (8 < u0 < cams.width - 8 and 8 < v0 < cams.height - 8):
                continue
            ii, jj = int(v0), int(u0)
            win = und[ii - 6:ii + 7, jj - 6:jj + 7]
            vv, uu = np.mgrid[ii - 6:ii + 7, jj - 6:jj + 7] + 0.5
            wgt = np.clip(win - 3.0, 0, None)
            errs.append(np.hypot((wgt * uu).sum() / wgt.sum() - u0, (wgt * vv).sum() / wgt.sum() - v0))
        assert len(errs) >= 6 and max(errs) < 0.05, errs
    # the second load reuses the cached images
    before = [p.stat().st_mtime_ns for p in paths]
    _, again = load_transforms(tmp_path, image_cache=tmp_path / "cache", progress=False)
    assert again == paths and [p.stat().st_mtime_ns for p in again] == before
    # cameras only (a scene folder): the same undistorted cameras, nothing read or written
    cams2, src = load_transforms(tmp_path, check_images=False, require_images=False)
    assert torch.equal(cams2.Ks, cams.Ks) and src[0] == tmp_path / "images/f0.png"


def test_distortion_refused_when_asked_or_unsupported(tmp_path):
    write_dataset(tmp_path, meta={"k1": 0.1, "p2": 0.0})
    expect_error(tmp_path, field="k1", match="undistort=False", undistort=False)
    write_dataset(tmp_path, meta={"k1": 0.0, "k2": 0})  # zero coefficients: nothing to do, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, paths = load_transforms(tmp_path, undistort=False)
    assert paths[0] == tmp_path / "images/frame_00001.png"
    write_dataset(tmp_path, meta={"k1": 0.1, "k4": 0.01})
    expect_error(tmp_path, field="k4", match="fisheye")
    write_dataset(tmp_path, meta={"distortion_params": [0.1, "x"]})
    expect_error(tmp_path, field="distortion_params[1]", match="expected a number")


def test_missing_images_one_message_or_skipped(tmp_path):
    frames = [{"file_path": f"images/{i}.png", "transform_matrix": pose((float(i), 0.0, 5.0))} for i in range(67)]
    write_dataset(tmp_path, frames=frames, images=False)
    present = [i for i in range(67) if i % 4 != 1]  # 50 of 67 exist, as in the fox dataset
    for i in present:
        make_image(tmp_path / f"images/{i}.png")
    msg = expect_error(tmp_path, field="frames[1].file_path", match="17 of 67 images not found")
    assert "--skip-missing-images" in msg and "the 50 frames" in msg and "and 12 more" in msg
    with pytest.warns(UserWarning) as rec:
        cams, paths = load_transforms(tmp_path, skip_missing_images=True)
    assert len(rec) == 1 and "skipping 17 of 67 frames" in str(rec[0].message)
    assert paths == [tmp_path / f"images/{i}.png" for i in present] and cams.names == [str(i) for i in present]
    assert torch.allclose(cams.centers[:, 0], torch.tensor([float(i) for i in present]), atol=1e-5)
    for i in range(67):
        (tmp_path / f"images/{i}.png").unlink(missing_ok=True)
    expect_error(tmp_path, field="frames[0].file_path", match="67 of 67 images not found", skip_missing_images=True)


def test_downscale_uses_images_n_or_resizes(tmp_path):
    write_dataset(tmp_path)  # 16 x 12, fl 20 / 21, cx 8, cy 6.5 (frame 1: fl_x 22, cx 7.5)
    cams, paths = load_transforms(tmp_path, downscale=2, image_cache=tmp_path / "cache", progress=False)
    assert (cams.width, cams.height) == (W // 2, H // 2)
    assert cams.Ks[1].tolist() == [[11.0, 0.0, 3.75], [0.0, 10.5, 3.25], [0.0, 0.0, 1.0]]
    assert all(np.array(Image.open(p)).shape == (H // 2, W // 2, 3) for p in paths)
    assert str(paths[0]).startswith(str(tmp_path / "cache"))
    # an images_2 folder (ns-process-data's) is used as it is, and its sizes are checked
    for name in ("frame_00001.png", "frame_00002.png"):
        make_image(tmp_path / "images_2" / name, W // 2, H // 2)
    cams2, paths2 = load_transforms(tmp_path, downscale=2)
    assert paths2 == [tmp_path / "images_2/frame_00001.png", tmp_path / "images_2/frame_00002.png"]
    assert torch.equal(cams2.Ks, cams.Ks)
    make_image(tmp_path / "images_2" / "frame_00002.png", W, H)
    expect_error(tmp_path, field="frames[1].file_path", match="w // N x h // N", downscale=2)
    with pytest.raises(Exception, match="downscale"):
        load_transforms(tmp_path, downscale=0)


@pytest.mark.slow
def test_fox_realdata_loads_with_skip_and_downscale(tmp_path):
    fox = REALDATA / "fox"
    if not (fox / "transforms.json").is_file():
        pytest.skip(f"real data not present ({fox}); see shared/realdata/README.md")
    with pytest.raises(CameraFormatError, match="17 of 67 images not found"):
        load_transforms(fox)
    with pytest.warns(UserWarning, match="skipping 17 of 67"):
        cams, paths = load_transforms(fox, skip_missing_images=True, downscale=4, image_cache=tmp_path, progress=False)
    assert len(cams) == 50 and len(paths) == 50 and all(p.is_file() for p in paths)
    assert 250 <= cams.width <= 270 and 460 <= cams.height <= 480  # 1080x1920 / 4, cropped by the undistortion
    im = Image.open(paths[0])
    assert im.size == (cams.width, cams.height)
    assert torch.isfinite(cams.Ks).all() and abs(float(cams.Ks[0, 0, 0]) - 1375.52 / 4) < 10


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
