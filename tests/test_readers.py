"""Readers for LERF-OVS labels, 3D-OVS scenes and labelled point clouds (fixtures written in the real formats)."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from rh3dgs.cameras import Cameras
from rh3dgs.data.readers import (
    LerfLabelError,
    OVS3DFormatError,
    PointLabelError,
    llff_to_opencv_viewmats,
    load_lerf_ovs,
    load_ovs3d,
    read_labelled_points,
    read_lerf_label,
    transfer_labels_to_gaussians,
    transfer_predictions_to_points,
)
from rh3dgs.errors import InputFileError


# ----------------------------------------------------------------------------- LERF-OVS
def _frame(**over):
    d = {"info": {"height": 20, "width": 30, "name": "frame_00001.jpg"},
         "objects": [{"category": "red apple", "bbox": [2, 3, 9, 8],
                      "segmentation": [[2, 3], [9, 3], [9, 8], [2, 8]]},
                     {"category": "red apple", "bbox": [20, 10, 25, 15],
                      "segmentation": [20, 10, 25, 10, 25, 15, 20, 15]},
                     {"category": "mug", "bbox": [0, 0, 4, 4], "segmentation": [[0, 0], [4, 0], [0, 4]]}]}
    d.update(over)
    return d


def test_lerf_label_masks_and_boxes(tmp_path):
    scene = tmp_path / "label" / "figurines"
    scene.mkdir(parents=True)
    (scene / "frame_00002.json").write_text(json.dumps(_frame(info={"height": 20, "width": 30, "name": "frame_00002.jpg"})))
    (scene / "frame_00001.json").write_text(json.dumps(_frame()))
    frames = load_lerf_ovs(scene)
    assert [f.stem for f in frames] == ["frame_00001", "frame_00002"]
    f = frames[0]
    assert (f.height, f.width) == (20, 30) and f.categories == ["red apple", "mug"]
    m = f.mask("red apple")
    assert m.shape == (20, 30) and m.dtype == bool
    # both polygons (union), inclusive rectangles: 8 x 6 + 6 x 6 pixels
    assert m[3:9, 2:10].all() and m[10:16, 20:26].all()
    assert int(m.sum()) == 8 * 6 + 6 * 6
    assert not m[0, 0] and f.mask("absent").sum() == 0
    assert f.masks().keys() == {"red apple", "mug"}
    np.testing.assert_array_equal(f.boxes("red apple"), [[2, 3, 9, 8], [20, 10, 25, 15]])
    assert f.boxes("absent").shape == (0, 4)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["info"].pop("height"), "info.height"),
    (lambda d: d["info"].__setitem__("width", -3), "info.width"),
    (lambda d: d.pop("objects"), "objects"),
    (lambda d: d["objects"][1].__setitem__("category", ""), "objects[1].category"),
    (lambda d: d["objects"][0].__setitem__("bbox", [1, 2, 3]), "objects[0].bbox"),
    (lambda d: d["objects"][2].__setitem__("segmentation", [[0, 0], [1, 1]]), "objects[2].segmentation"),
    (lambda d: d["objects"][2].pop("segmentation"), "objects[2].segmentation"),
])
def test_lerf_label_errors_name_file_and_field(tmp_path, mutate, field):
    d = _frame()
    mutate(d)
    p = tmp_path / "frame_00001.json"
    p.write_text(json.dumps(d))
    with pytest.raises(LerfLabelError) as ei:
        read_lerf_label(p)
    assert isinstance(ei.value, InputFileError)
    assert str(p) in str(ei.value) and f"[{field}]" in str(ei.value)


def test_lerf_label_not_json_and_missing(tmp_path):
    p = tmp_path / "frame_00001.json"
    p.write_text("{not json")
    with pytest.raises(LerfLabelError, match="not valid JSON"):
        read_lerf_label(p)
    with pytest.raises(LerfLabelError, match="no label files"):
        load_lerf_ovs(tmp_path / "empty" if (tmp_path / "empty").mkdir() is None else tmp_path)


# ----------------------------------------------------------------------------- 3D-OVS
def _write_ovs3d(root, n=3, W=16, H=12, hwf=(24.0, 32.0, 20.0)):
    eyes = torch.tensor([[3.0, 0.5, 1.0], [0.2, 3.0, 1.5], [-2.0, -2.0, 0.8]])[:n]
    cams = Cameras.look_at(eyes, torch.zeros(3), width=W, height=H)
    c2w = torch.linalg.inv(cams.viewmats).double().numpy()  # OpenCV: [right, down, forward]
    P = np.zeros((n, 3, 5))
    P[:, :, 0] = c2w[:, :3, 1]   # down
    P[:, :, 1] = c2w[:, :3, 0]   # right
    P[:, :, 2] = -c2w[:, :3, 2]  # backwards
    P[:, :, 3] = c2w[:, :3, 3]
    P[:, :, 4] = hwf
    arr = np.concatenate([P.reshape(n, 15), np.tile([[0.5, 10.0]], (n, 1))], 1)
    (root / "images").mkdir(parents=True)
    np.save(root / "poses_bounds.npy", arr)
    for i in range(n):
        Image.fromarray(np.zeros((H, W, 3), np.uint8)).save(root / "images" / f"{i:02d}.png")
    seg = root / "segmentations"
    seg.mkdir()
    (seg / "classes.txt").write_text("banana\nmug\n")
    v = seg / "01"
    v.mkdir()
    a = np.zeros((H, W), np.uint8)
    a[2:5, 3:8] = 255
    Image.fromarray(a).save(v / "banana.png")
    b = np.zeros((H, W), np.uint8)
    b[6:9, 3:8] = 255
    Image.fromarray(b).save(v / "mug.png")
    return cams, arr


def test_ovs3d_llff_poses_to_opencv(tmp_path):
    cams, arr = _write_ovs3d(tmp_path)
    sc = load_ovs3d(tmp_path)
    assert sc.cameras.names == ["00", "01", "02"] and (sc.cameras.width, sc.cameras.height) == (16, 12)
    torch.testing.assert_close(sc.cameras.viewmats, cams.viewmats, atol=1e-5, rtol=0)
    # focal of the 32 x 24 poses scaled to the 16 x 12 images, principal point at the centre
    torch.testing.assert_close(sc.cameras.Ks[0], torch.tensor([[10.0, 0, 8], [0, 10.0, 6], [0, 0, 1]]))
    # the scene centre is in front of every camera (OpenCV +z forward)
    pc = sc.cameras.viewmats[:, :3, :3] @ torch.zeros(3) + sc.cameras.viewmats[:, :3, 3]
    assert (pc[:, 2] > 0).all()
    np.testing.assert_allclose(sc.bounds, [[0.5, 10.0]] * 3)
    assert sc.class_names == ["banana", "mug"] and list(sc.masks) == ["01"]
    m = sc.masks["01"]
    assert m.shape == (2, 12, 16) and m.dtype == bool and m[0].sum() == 15 and m[1].sum() == 15
    lab = sc.labels("01")
    assert lab[3, 4] == 0 and lab[7, 4] == 1 and lab[0, 0] == 255
    # NeRF's load_llff route: [P1, -P0, P2] is OpenGL c2w; via Cameras.from_c2w_opengl the same viewmats
    P = arr[:, :15].reshape(-1, 3, 5)
    gl = np.concatenate([P[:, :, 1:2], -P[:, :, 0:1], P[:, :, 2:4]], 2)
    ref = Cameras.from_c2w_opengl(torch.from_numpy(gl).float(), 1, 1, 0, 0, 16, 12)
    torch.testing.assert_close(llff_to_opencv_viewmats(P), ref.viewmats, atol=1e-5, rtol=0)


def test_ovs3d_missing_class_png_is_empty(tmp_path):
    _write_ovs3d(tmp_path)
    (tmp_path / "segmentations" / "01" / "mug.png").unlink()
    sc = load_ovs3d(tmp_path)
    assert sc.missing == [("01", "mug")] and sc.masks["01"][1].sum() == 0


def test_ovs3d_errors(tmp_path):
    root = tmp_path / "a"
    _write_ovs3d(root)
    np.save(root / "poses_bounds.npy", np.zeros((3, 15)))
    with pytest.raises(OVS3DFormatError, match=r"poses_bounds.npy \[shape\]"):
        load_ovs3d(root)
    root = tmp_path / "b"
    _, arr = _write_ovs3d(root)
    np.save(root / "poses_bounds.npy", arr[:2])
    with pytest.raises(OVS3DFormatError, match=r"2 poses for 3 images"):
        load_ovs3d(root)
    root = tmp_path / "c"
    _write_ovs3d(root)
    Image.fromarray(np.zeros((5, 5), np.uint8)).save(root / "segmentations" / "01" / "mug.png")
    with pytest.raises(OVS3DFormatError, match="mug.png.*differs"):
        load_ovs3d(root)
    root = tmp_path / "d"
    _write_ovs3d(root)
    (root / "segmentations" / "07").mkdir()
    with pytest.raises(OVS3DFormatError, match="matches no image"):
        load_ovs3d(root)
    root = tmp_path / "e"
    _, arr = _write_ovs3d(root)
    arr[1, :3] *= 2.0
    np.save(root / "poses_bounds.npy", arr)
    with pytest.raises(OVS3DFormatError, match=r"\[row 1 rotation\]"):
        load_ovs3d(root)
    root = tmp_path / "f"
    _write_ovs3d(root)
    (root / "segmentations" / "classes.txt").write_text("a\na\n")
    with pytest.raises(OVS3DFormatError, match="duplicate"):
        load_ovs3d(root)


# ----------------------------------------------------------------------------- ScanNet-style points
def _write_ply(path, pts, labels, label_name="label"):
    from plyfile import PlyData, PlyElement

    arr = np.empty(len(pts), dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), (label_name, "u2")])
    arr["x"], arr["y"], arr["z"] = pts.T
    arr[label_name] = labels
    PlyData([PlyElement.describe(arr, "vertex")]).write(str(path))


def test_labelled_points_formats(tmp_path):
    pts = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [5, 5, 5]], np.float32)
    raw = np.array([3, 0, 5, 3])
    _write_ply(tmp_path / "s.ply", pts, raw)
    p, lab = read_labelled_points(tmp_path / "s.ply")
    np.testing.assert_allclose(p, pts)
    np.testing.assert_array_equal(lab, [3, -1, 5, 3])  # ScanNet 0 = unannotated -> ignore
    _, lab = read_labelled_points(tmp_path / "s.ply", label_map={3: 0, 5: 1})
    np.testing.assert_array_equal(lab, [0, -1, 1, 0])
    _, lab = read_labelled_points(tmp_path / "s.ply", label_map={3: 0})  # unmapped -> ignore
    np.testing.assert_array_equal(lab, [0, -1, -1, 0])
    np.save(tmp_path / "s.npy", np.concatenate([pts, raw[:, None]], 1))
    p2, lab2 = read_labelled_points(tmp_path / "s.npy")
    np.testing.assert_allclose(p2, pts)
    np.testing.assert_array_equal(lab2, [3, -1, 5, 3])
    np.savez(tmp_path / "s.npz", points=pts, labels=raw)
    np.testing.assert_array_equal(read_labelled_points(tmp_path / "s.npz")[1], [3, -1, 5, 3])


def test_labelled_points_errors(tmp_path):
    pts = np.zeros((3, 3), np.float32)
    _write_ply(tmp_path / "nolabel.ply", pts, np.zeros(3), label_name="foo")
    with pytest.raises(PointLabelError, match=r"nolabel.ply \[vertex.label\]"):
        read_labelled_points(tmp_path / "nolabel.ply")
    np.save(tmp_path / "bad.npy", np.zeros((4, 3)))
    with pytest.raises(PointLabelError, match=r"bad.npy \[shape\]"):
        read_labelled_points(tmp_path / "bad.npy")
    np.save(tmp_path / "frac.npy", np.array([[0, 0, 0, 1.5]]))
    with pytest.raises(PointLabelError, match="integers"):
        read_labelled_points(tmp_path / "frac.npy")
    np.savez(tmp_path / "x.npz", points=pts)
    with pytest.raises(PointLabelError, match=r"\[labels\]"):
        read_labelled_points(tmp_path / "x.npz")
    (tmp_path / "junk.ply").write_bytes(b"not a ply")
    with pytest.raises(PointLabelError, match="junk.ply"):
        read_labelled_points(tmp_path / "junk.ply")
    with pytest.raises(PointLabelError, match="not found"):
        read_labelled_points(tmp_path / "missing.ply")


def test_nearest_gaussian_transfer():
    means = torch.tensor([[0.0, 0, 0], [1.0, 0, 0], [10.0, 0, 0]])
    pred = torch.tensor([4, 7, 9])
    pts = np.array([[0.1, 0, 0], [0.9, 0.1, 0], [5.0, 0, 0], [20.0, 0, 0]])
    np.testing.assert_array_equal(transfer_predictions_to_points(pred, means, pts), [4, 7, 7, 9])
    np.testing.assert_array_equal(transfer_predictions_to_points(pred, means, pts, max_distance=1.0), [4, 7, -1, -1])
    labels = np.array([1, 2, -1, 3])
    np.testing.assert_array_equal(transfer_labels_to_gaussians(pts, labels, means), [1, 2, 2])  # (5,0,0) is ignored
    np.testing.assert_array_equal(transfer_labels_to_gaussians(pts, labels, means, max_distance=0.5), [1, 2, -1])


# ----------------------------------------------------------------------------- LERF-Mask + COLMAP
def _write_lerf_mask(root, views=("0",), model="PINHOLE", params="20 22 8 6"):
    """3 images, frame_00002 the only one not in images_train; COLMAP text model; 8-bit masks per view."""
    from rh3dgs.data.readers import load_lerf_mask  # noqa: F401  (import check)

    for d in ("images", "images_train", "sparse/0"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for i in (1, 2, 3):
        Image.new("RGB", (16, 12)).save(root / "images" / f"frame_{i:05d}.jpg")
        if i != 2:
            Image.new("RGB", (16, 12)).save(root / "images_train" / f"frame_{i:05d}.jpg")
    (root / "sparse/0/cameras.txt").write_text(f"# Camera list\n1 {model} 16 12 {params}\n")
    c, s = np.cos(np.pi / 4), np.sin(np.pi / 4)  # 90 degrees about z
    (root / "sparse/0/images.txt").write_text(
        "# Image list\n"
        f"1 1 0 0 0 0 0 0 1 frame_00001.jpg\n\n"
        f"2 {c} 0 0 {s} 1 2 3 1 frame_00002.jpg\n\n"
        f"3 1 0 0 0 0 0 1 1 frame_00003.jpg\n\n")
    for v in views:
        (root / "test_mask" / v).mkdir(parents=True)
        m = np.zeros((12, 16), np.uint8)
        m[2:5, 3:9] = 255
        Image.fromarray(m).save(root / "test_mask" / v / "red apple.png")
        Image.fromarray(255 - m).save(root / "test_mask" / v / "table.png")


def test_lerf_mask_views_masks_and_colmap_cameras(tmp_path):
    from rh3dgs.data.readers import load_lerf_mask, read_colmap_cameras

    _write_lerf_mask(tmp_path, views=("0", "frame_00003"))
    ds = load_lerf_mask(tmp_path)
    # view "0" is the first test image (images/ minus images_train/, by name); a folder may name its image
    assert [(v.name, v.image) for v in ds.views] == [("0", "frame_00002"), ("frame_00003", "frame_00003")]
    assert ds.prompts == ["red apple", "table"]
    m = ds.views[0].masks["red apple"]
    assert m.dtype == np.uint8 and m.shape == (12, 16) and int((m > 128).sum()) == 18
    cams = ds.cameras
    assert cams.names == ["frame_00002", "frame_00003"] and (cams.width, cams.height) == (16, 12)
    R = torch.tensor([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # qvec (cos 45, 0, 0, sin 45)
    torch.testing.assert_close(cams.viewmats[0, :3, :3], R, atol=1e-6, rtol=0)
    torch.testing.assert_close(cams.viewmats[0, :3, 3], torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(cams.Ks[0], torch.tensor([[20.0, 0, 8], [0, 22, 6], [0, 0, 1]]))
    allc = read_colmap_cameras(tmp_path / "sparse/0")
    assert allc.names == ["frame_00001", "frame_00002", "frame_00003"]
    torch.testing.assert_close(allc.centers[2], torch.tensor([0.0, 0.0, -1.0]))


def test_lerf_mask_errors_name_the_file(tmp_path):
    from rh3dgs.data.readers import LerfMaskFormatError, load_lerf_mask

    with pytest.raises(LerfMaskFormatError, match="test_mask.*folder not found"):
        load_lerf_mask(tmp_path)
    _write_lerf_mask(tmp_path / "a", views=("3",))
    with pytest.raises(LerfMaskFormatError, match="test view 3 but only 1 test images"):
        load_lerf_mask(tmp_path / "a")
    _write_lerf_mask(tmp_path / "b", model="OPENCV", params="20 22 8 6 0.1 0 0 0")
    with pytest.raises(LerfMaskFormatError, match=r"\[camera_model\].*OPENCV camera.*image_undistorter"):
        load_lerf_mask(tmp_path / "b")
    assert load_lerf_mask(tmp_path / "b", cameras=False).cameras is None
    _write_lerf_mask(tmp_path / "c")
    Image.fromarray(np.zeros((5, 5), np.uint8)).save(tmp_path / "c/test_mask/0/zebra.png")
    with pytest.raises(LerfMaskFormatError, match=r"zebra.png: mask is 5x5, the view.s other masks 16x12"):
        load_lerf_mask(tmp_path / "c")
