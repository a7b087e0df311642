"""The 3D protocols of rh3dgs.eval.protocols (LERF-OVS 3D selection, LERF-Mask, ScanNet 19/15/10) against
hand-computed ground truth: an isotropic Gaussian whose rendered silhouette is an analytic disk, masks with
counted pixels, label vectors with IoUs worked out by hand; and the 8-bit conversion against torchvision."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from rh3dgs import Gaussians
from rh3dgs.api import Scene, TextEmbeddings
from rh3dgs.cameras import Cameras
from rh3dgs.eval import protocols as P
from rh3dgs.eval.metrics import miou_3d
from rh3dgs.field import SemanticField

# one pinhole camera at the origin looking down +z, 32 x 32 px, f = 32
W = H = 32
F = 32.0
SIGMA, DEPTH, EPS2D = 0.25, 2.0, 0.3
S2 = (F * SIGMA / DEPTH) ** 2 + EPS2D  # screen-space variance of the Gaussian: (f sigma / z)^2 + eps2d


def _camera(name="frame_00001", w=W, h=H):
    K = torch.tensor([[[F * w / W, 0.0, w / 2], [0.0, F * h / H, h / 2], [0.0, 0.0, 1.0]]])
    return Cameras(torch.eye(4)[None], K, w, h, names=[name])


def _gaussians(xs, opacity):
    n = len(xs)
    means = torch.tensor([[x, 0.0, DEPTH] for x in xs])
    quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).repeat(n, 1)
    return Gaussians.from_activated(means, torch.full((n, 3), SIGMA), quats, torch.full((n,), opacity),
                                    torch.full((n, 3), 0.5))


def _disk(x_world, opacity, level):
    """Analytic silhouette: pixels whose alpha = o exp(-r^2 / (2 S2)) is >= level, and the smallest
    |log(alpha / level)| of any pixel (so the test can check that no pixel is borderline)."""
    u = F * x_world / DEPTH + W / 2
    jj, ii = np.meshgrid(np.arange(W) + 0.5, np.arange(H) + 0.5)
    r2 = (jj - u) ** 2 + (ii - H / 2) ** 2
    r2_max = 2 * S2 * math.log(opacity / level)
    return r2 <= r2_max, float(np.abs(r2 - r2_max).min() / (2 * S2))


# the level at which torchvision's 8-bit image is > 10: uint8(a * 255 + 0.5) >= 11  <=>  a >= 10.5 / 255
LEVEL_8BIT = 10.5 / 255


def test_to_uint8_image_is_torchvision_save_image(tmp_path):
    from torchvision.utils import save_image

    x = torch.tensor([0.0, 10.4 / 255, 10.5 / 255 + 1e-6, 0.5, 127.5 / 255, 1.0, 1.7, -0.3, 0.12345])
    save_image(x.reshape(1, 1, -1), tmp_path / "x.png")
    ref = np.array(Image.open(tmp_path / "x.png").convert("L"))[0]
    got = P.to_uint8_image(x)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got[:3], [0, 10, 11])
    assert P.to_uint8_image(np.array([np.nan]))[0] == 0


def test_selection_alpha_mask_is_the_analytic_disk():
    g = _gaussians([0.0, 0.6], 0.8)
    expect, margin = _disk(0.0, 0.8, LEVEL_8BIT)
    assert margin > 1e-3 and 150 < expect.sum() < 400  # no pixel's alpha within 0.1 % of the level
    got = P.selection_alpha_masks(g, torch.tensor([True, False]), _camera())
    assert got.shape == (1, H, W) and got.dtype == bool
    np.testing.assert_array_equal(got[0], expect)
    # the selection of relevancy > 0.6 keeps only the first Gaussian; nothing selected -> empty
    masks = P.lerf3d_selection_masks(g, np.array([[0.7, 0.59], [0.1, 0.6]]), _camera())
    np.testing.assert_array_equal(masks[0, 0], expect)
    assert not masks[1].any()


def test_lerf3d_iou_and_summary_by_hand():
    a = np.zeros((10, 10), bool)
    b = np.zeros((10, 10), bool)
    a[2:6, 2:6] = True  # 16 px
    b[4:8, 2:6] = True  # 16 px, 8 shared
    assert P.lerf3d_iou(a, b) == pytest.approx(8 / 24)
    assert P.lerf3d_iou(np.zeros((3, 3)), np.zeros((3, 3))) == 0.0  # OpenGaussian: empty union scores 0
    s = P.lerf3d_summary([0.25, 0.26, 0.5, 0.9, 0.0])
    assert s["miou"] == pytest.approx(1.91 / 5)
    assert s["acc@0.25"] == pytest.approx(3 / 5)  # strictly above 0.25
    assert s["acc@0.5"] == pytest.approx(1 / 5) and s["pairs"] == 5


def _scene(xs, feats, opacity=0.8, cameras=None, extra_text=None):
    """Scene of isotropic Gaussians at (x, 0, 2) with one-hot features e_k (D = d = 4, identity decoder);
    texts: 'red apple' = e0, 'mug' = e1, the canonical negatives = e2 / e3."""
    lat = torch.nn.functional.one_hot(torch.tensor(feats), 4).float()
    e = torch.eye(4)
    table = {"red apple": e[0], "mug": e[1], "object": e[2], "things": e[3], "stuff": e[2], "texture": e[3]}
    table.update(extra_text or {})
    return Scene(_gaussians(xs, opacity), SemanticField(lat, torch.eye(4)), cameras or _camera(),
                 text_encoder=TextEmbeddings(table))


def test_evaluate_lerf_ovs_3d_end_to_end(tmp_path):
    label = tmp_path / "label" / "toy"
    label.mkdir(parents=True)
    # GT of 'red apple': the rectangle of columns 20..44 and rows 24..40 (PIL fills the outline too);
    # 'mug' is labelled at the far left where nothing 'mug' is rendered at this frame's 64 x 64 size
    objects = [{"category": "red apple", "bbox": [10, 12, 22, 20],
                "segmentation": [[20, 24], [44, 24], [44, 40], [20, 40]]},
               {"category": "mug", "bbox": [0, 0, 6, 6], "segmentation": [[0, 0], [6, 0], [6, 6], [0, 6]]}]
    (label / "frame_00001.json").write_text(json.dumps(
        {"info": {"height": 64, "width": 64, "name": "frame_00001.jpg"}, "objects": objects}))
    scene = _scene([0.0, 0.6], [0, 1])
    out = P.evaluate_lerf_ovs_3d(scene, label)
    # by hand: at 64 x 64 (intrinsics scaled x2) the apple Gaussian's silhouette is the disk of
    # radius^2 <= 2 S2' ln(o / level), S2' = (2 f sigma / z)^2 + 0.3, centred at (32, 32)
    s2 = (2 * F * SIGMA / DEPTH) ** 2 + EPS2D
    jj, ii = np.meshgrid(np.arange(64) + 0.5, np.arange(64) + 0.5)
    r2 = (jj - 32) ** 2 + (ii - 32) ** 2
    r2_max = 2 * s2 * math.log(0.8 / LEVEL_8BIT)
    assert np.abs(r2 - r2_max).min() / (2 * s2) > 1e-3
    disk = r2 <= r2_max
    rect = np.zeros((64, 64), bool)
    rect[24:41, 20:45] = True
    apple = (disk & rect).sum() / (disk | rect).sum()
    # 'mug' Gaussian at x = 0.6 -> u = 2 * (32 * 0.6 / 2) + 32 = 51.2: its disk misses the 7x7 corner box
    assert [p[:2] for p in out["per_pair"]] == [("frame_00001", "red apple"), ("frame_00001", "mug")]
    assert out["per_pair"][0][2] == pytest.approx(apple) and out["per_pair"][1][2] == 0.0
    assert out["miou"] == pytest.approx(apple / 2) and out["acc@0.25"] == (0.5 if apple > 0.25 else 0.0)
    assert out["frames"] == ["frame_00001"] and out["threshold"] == 0.6


def test_evaluate_lerf_ovs_3d_names_missing_frames(tmp_path):
    from rh3dgs.errors import ConfigError, InputFileError

    label = tmp_path / "figurines"
    label.mkdir()
    (label / "frame_00041.json").write_text(json.dumps({"info": {"height": 8, "width": 8}, "objects": []}))
    with pytest.raises(InputFileError, match="frame_00105.json.*3 of 4 missing"):
        P.evaluate_lerf_ovs_3d(_scene([0.0], [0]), label)  # OpenGaussian's 4 figurines frames
    with pytest.raises(ConfigError, match="no camera named 'frame_00041'"):
        P.evaluate_lerf_ovs_3d(_scene([0.0], [0]), label, frames=["frame_00041"])


# ------------------------------------------------------------------------------- LERF-Mask
def _square(n, r0, r1, c0, c1, value=255, dtype=np.uint8):
    m = np.zeros((n, n), dtype)
    m[r0:r1 + 1, c0:c1 + 1] = value
    return m


def test_lerf_mask_scores_by_hand():
    gt = _square(20, 5, 14, 5, 14)  # 100 px
    pred = _square(20, 8, 17, 5, 14, True, bool)  # 100 px, 70 shared
    iou, biou = P.lerf_mask_scores(pred, gt)
    assert iou == pytest.approx(70 / 130)
    # band width max(1, round(0.02 * sqrt(20^2 + 20^2))) = 1: each square's 36-pixel outer ring;
    # the rings share 2 (row 8) + 5 x 2 (rows 9-13, both side columns) + 2 (row 14) = 14 pixels
    assert biou == pytest.approx(14 / (36 + 36 - 14))
    # > 128: a float prediction of exactly 0.5 is 128 in 8 bits and does not count; 0.51 does
    assert P.lerf_mask_scores(np.full((20, 20), 0.5), gt)[0] == 0.0
    assert P.lerf_mask_scores(np.full((20, 20), 0.51), gt)[0] == pytest.approx(100 / 400)
    # a prediction at half the size is resized with nearest neighbour: each pixel becomes 2 x 2
    half = np.zeros((10, 10), bool)
    half[4:9, 2:7] = True  # -> rows 8..17, cols 4..13 at full size
    assert P.lerf_mask_scores(half, gt)[0] == pytest.approx((7 * 9) / (100 + 100 - 7 * 9))
    assert math.isnan(P.lerf_mask_scores(np.zeros((4, 4), bool), np.zeros((4, 4), np.uint8))[0])


def _gg_boundary_iou(gt8, dt8, ratio=0.02):
    """Gaussian Grouping's boundary IoU, written out with OpenCV: pad by 1 with 0, erode (3x3, d times)."""
    import cv2

    def boundary(mask):
        h, w = mask.shape
        d = max(1, int(round(ratio * math.sqrt(h * h + w * w))))
        padded = cv2.copyMakeBorder(mask, 1, 1, 1, 1, cv2.BORDER_CONSTANT, value=0)
        eroded = cv2.erode(padded, np.ones((3, 3), np.uint8), iterations=d)[1:h + 1, 1:w + 1]
        return mask - eroded

    g, p = boundary((gt8 > 128).astype(np.uint8)), boundary((dt8 > 128).astype(np.uint8))
    return ((g * p) > 0).sum() / ((g + p) > 0).sum()


def test_lerf_mask_boundary_iou_matches_opencv_erosion():
    rng = np.random.default_rng(0)
    for n in (40, 97, 160):
        for _ in range(3):
            gt = np.zeros((n, n), np.uint8)
            pred = np.zeros((n, n), np.uint8)
            for m in (gt, pred):
                r0, c0 = rng.integers(0, n // 2, 2)
                m[r0:r0 + rng.integers(5, n // 2), c0:c0 + rng.integers(5, n // 2)] = 255
                m[rng.random((n, n)) < 0.02] = 255
            assert P.lerf_mask_scores(pred, gt)[1] == pytest.approx(_gg_boundary_iou(gt, pred))


def test_lerf_mask_summary_averages_per_prompt_first():
    s = P.lerf_mask_summary([("a", 1.0, 0.5), ("a", 0.0, 0.5), ("b", 0.5, 1.0)])
    assert s["per_prompt"]["a"] == {"iou": 0.5, "biou": 0.5, "views": 2}
    assert s["miou"] == pytest.approx(0.5) and s["mbiou"] == pytest.approx(0.75)  # pair means: 0.5 / 0.667
    assert s["prompts"] == 2 and s["pairs"] == 3


def _lerf_mask_folder(root, gt_mask, view="0"):
    """lerf_mask/<scene> with 3 images (frame_00002 is the only test image), a PINHOLE COLMAP model whose
    test camera is the identity pose, and test_mask/<view>/red apple.png."""
    for d in ("images", "images_train", "sparse/0", f"test_mask/{view}"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for i in (1, 2, 3):
        Image.new("RGB", (W, H)).save(root / "images" / f"frame_{i:05d}.jpg")
        if i != 2:
            Image.new("RGB", (W, H)).save(root / "images_train" / f"frame_{i:05d}.jpg")
    (root / "sparse/0/cameras.txt").write_text(f"# camera list\n1 PINHOLE {W} {H} {F} {F} {W / 2} {H / 2}\n")
    lines = []
    for i, (q, t) in enumerate([((1, 0, 0, 0), (0, 0, 5)), ((1, 0, 0, 0), (0, 0, 0)), ((0, 1, 0, 0), (1, 2, 3))], 1):
        lines += [f"{i} {' '.join(map(str, q))} {' '.join(map(str, t))} 1 frame_{i:05d}.jpg", ""]
    (root / "sparse/0/images.txt").write_text("# image list\n" + "\n".join(lines) + "\n")
    Image.fromarray(gt_mask).save(root / "test_mask" / view / "red apple.png")


def test_evaluate_lerf_mask_end_to_end(tmp_path):
    gt = _square(H, 12, 20, 10, 22)  # rows 12..20, cols 10..22
    _lerf_mask_folder(tmp_path / "toy", gt)
    scene = _scene([0.0, 2.0], [0, 1], cameras=_camera("unused"))  # the mug Gaussian is off-screen
    rect = gt > 128
    # selection: relevancy > 0.6 per Gaussian, alpha > 10/255 -> the analytic disk
    disk, _ = _disk(0.0, 0.8, LEVEL_8BIT)
    sel = P.evaluate_lerf_mask(scene, tmp_path / "toy", source="selection")
    assert sel["per_pair"][0][:2] == ("0", "red apple")
    assert sel["miou"] == pytest.approx((disk & rect).sum() / (disk | rect).sum())
    # relevancy map: the composited latent is alpha * e0, whose cosine to 'red apple' is 1 wherever it is
    # rendered (relevancy sigmoid(10) > 0.5), and 0 where the accumulated opacity is below 0.1: the mask
    # is the disk at level 0.1
    rel = P.evaluate_lerf_mask(scene, tmp_path / "toy", source="relevancy")
    d01, margin = _disk(0.0, 0.8, 0.1)
    assert margin > 1e-3
    assert rel["miou"] == pytest.approx((d01 & rect).sum() / (d01 | rect).sum())
    assert rel["source"] == "relevancy" and rel["threshold"] == 0.5


# --------------------------------------------------------------------------------- ScanNet
def test_scannet_subsets_and_labels():
    assert [len(P.SCANNET_SUBSETS[k]) for k in (19, 15, 10)] == [19, 15, 10]
    ids, names = P.scannet_classes(10)
    assert names == ("wall", "floor", "bed", "chair", "sofa", "table", "door", "window", "bookshelf", "toilet")
    assert P.scannet_classes(19)[1][15] == "showercurtain"  # OpenGaussian queries the NYU40 spelling
    nyu = [0, 1, 2, 13, 33, 36, 28, 39]
    np.testing.assert_array_equal(P.scannet_gt_labels(nyu, 10), [0, 1, 2, 0, 10, 0, 0, 0])
    np.testing.assert_array_equal(P.scannet_gt_labels(nyu, 19), [0, 1, 2, 0, 17, 19, 16, 0])
    np.testing.assert_array_equal(P.scannet_gt_labels(nyu, 15, opacity=[1, 1, 0.05, 1, 1, 1, 1, 1]),
                                  [0, 1, 0, 0, 14, 0, 0, 0])
    with pytest.raises(ValueError, match="one of"):
        P.scannet_classes(20)


def test_scannet_eval_by_hand():
    gt = [1, 1, 1, 2, 2, 0, 3]
    pred = [1, 1, 2, 2, 3, 1, 3]  # the unlabelled Gaussian's prediction is dropped
    r = P.scannet_eval(pred, gt, 3)
    np.testing.assert_allclose(r["per_class_iou"], [2 / 3, 1 / 3, 1 / 2])
    np.testing.assert_allclose(r["per_class_acc"], [2 / 3, 1 / 2, 1.0])
    assert r["miou"] == pytest.approx(0.5) and r["macc"] == pytest.approx((2 / 3 + 1 / 2 + 1) / 3)
    assert r["accuracy"] == pytest.approx(4 / 6) and r["labelled"] == 6
    # class 4 predicted but absent from the GT: OpenGaussian leaves it out of the mean (miou_3d counts it as 0)
    r4 = P.scannet_eval([1, 1, 4, 2, 2, 0, 3], gt, 4)
    assert math.isnan(r4["per_class_iou"][3]) and r4["classes_present"] == 3
    assert r4["miou"] == pytest.approx((2 / 3 + 1 + 1) / 3)
    assert miou_3d(np.array([1, 1, 4, 2, 2, 0, 3]), np.array(gt), ignore_index=0) == pytest.approx((2 / 3 + 1 + 1 + 0) / 4)


def test_evaluate_scannet_end_to_end(tmp_path):
    import plyfile

    ids, names = P.scannet_classes(19)
    D = 19
    e = torch.eye(D)
    table = {n: e[k] for k, n in enumerate(names)}
    # 6 Gaussians: wall, floor, chair, toilet (feature of 'sink': wrong), bathtub, and a transparent chair
    nyu = np.array([1, 2, 5, 33, 36, 5])
    feat_class = [0, 1, 4, 17, 18, 4]  # index into the 19 names; 'toilet' is 16, 'sink' 17
    lat = e[feat_class]
    g = _gaussians([0.0] * 6, 0.8)
    g.opacities[5] = -10.0  # sigmoid(-10) < 0.1: ignored
    scene = Scene(g, SemanticField(lat, torch.eye(D)), None, text_encoder=TextEmbeddings(table))
    out = P.evaluate_scannet(scene, nyu, subsets=(19, 10))
    # 19 classes: wall, floor, chair, bathtub right (IoU 1), toilet wrong (IoU 0, its 'sink' prediction is a
    # class absent from the GT and does not count): mIoU 4/5, mAcc 4/5
    assert out[19]["miou"] == pytest.approx(4 / 5) and out[19]["macc"] == pytest.approx(4 / 5)
    # 10 classes: bathtub is not a class -> ignored; the toilet Gaussian's 'sink' feature is orthogonal to
    # all 10 names, so the argmax takes the first, wall: wall IoU 1/2, toilet 0 -> mIoU 2.5 / 4, mAcc 3 / 4
    assert out[10]["miou"] == pytest.approx(2.5 / 4) and out[10]["macc"] == pytest.approx(3 / 4)
    assert out[10]["labelled"] == 4
    # the same labels from a ScanNet *_vh_clean_2.labels.ply (point i = Gaussian i)
    v = np.zeros(6, dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), ("label", "u2")])
    v["z"], v["label"] = 2.0, nyu
    path = tmp_path / "scene_vh_clean_2.labels.ply"
    plyfile.PlyData([plyfile.PlyElement.describe(v, "vertex")]).write(str(path))
    assert P.evaluate_scannet(scene, path, subsets=(19,))[19]["miou"] == pytest.approx(4 / 5)


def test_scannet_predict_marks_invalid_gaussians():
    field = SemanticField(torch.eye(3)[[2, 0, 1]], torch.eye(3), valid=torch.tensor([True, False, True]))
    np.testing.assert_array_equal(P.scannet_predict(field, torch.eye(3)), [3, 0, 2])


def test_protocol_tables_are_separate():
    md = P.protocol_tables(lerf_ovs_3d={"figurines": {"miou": 0.5, "acc@0.25": 0.75},
                                        "ramen": {"miou": 0.3, "acc@0.25": 0.25}},
                           lerf_mask={"ramen": {"miou": 0.7, "mbiou": 0.6}},
                           scannet={"scene0000_00": {19: {"miou": 0.3, "macc": 0.5}, 10: {"miou": 0.4, "macc": 0.6}}})
    heads = [ln for ln in md.splitlines() if ln.startswith("### ")]
    assert len(heads) == 4 and "OpenGaussian" in heads[0] and "Gaussian Grouping" in heads[1]
    assert heads[2].startswith("### ScanNet 19") and heads[3].startswith("### ScanNet 10")
    assert "| **mean** | 40.0 | 50.0 |" in md and "| ramen | 70.0 | 60.0 |" in md
