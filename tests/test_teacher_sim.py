"""rh3dgs.data.teacher_sim: the simulated CLIP-like teacher, corruption by corruption."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rh3dgs.data.teacher_sim import (
    CANONICAL_NEGATIVES,
    TeacherSimConfig,
    make_prototypes,
    simulate_feature_maps,
    simulate_teacher,
    upsample_feature_map,
)
from rh3dgs.errors import ConfigError, InputFileError, ShapeError
from _scenes import synthetic_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """A small rendered synthetic dataset (3 views, 64 x 64)."""
    return synthetic_dataset(tmp_path_factory.mktemp("synth") / "data", 3, 64, 2000, teacher=False)


def load_views(root: Path):
    stems = sorted(p.stem for p in (root / "masks").glob("*.png"))
    masks = torch.stack([torch.from_numpy(np.array(Image.open(root / "masks" / f"{s}.png")).astype(np.int64))
                         for s in stems])
    depths = torch.stack([torch.from_numpy(np.load(root / "depth" / f"{s}.npy")) for s in stems])
    names = (root / "classes.txt").read_text().split("\n")
    return stems, masks, depths, [n for n in names if n]


def cos_to(feat: torch.Tensor, proto: np.ndarray) -> torch.Tensor:
    return feat.double() @ torch.from_numpy(proto)


# ----------------------------------------------------------------------- prototypes
@pytest.mark.parametrize("cone_cos", [0.5, 0.7, 0.85])
def test_prototypes_cone_mean_cosine(cone_cos):
    P = make_prototypes(8, TeacherSimConfig(cone_cos=cone_cos, seed=3))
    C = P.classes
    assert C.shape == (8, 64)
    np.testing.assert_allclose(np.linalg.norm(C, axis=1), 1.0, atol=1e-12)
    pair = (C @ C.T)[np.triu_indices(8, 1)]
    assert abs(pair.mean() - cone_cos) < 0.05
    # negatives sit near the cone centre: more similar to the centre than any class
    for v in P.negatives.values():
        assert v @ P.center > (C @ P.center).max()
    # prototypes of the first classes do not depend on the number of classes
    np.testing.assert_array_equal(make_prototypes(3, TeacherSimConfig(cone_cos=cone_cos, seed=3)).classes, C[:3])


# ------------------------------------------------------------------- clean teacher
def test_clean_features_equal_prototypes_inside_objects(dataset):
    stems, masks, depths, names = load_views(dataset)
    cfg = TeacherSimConfig.clean(patch_size=4)
    feats = simulate_feature_maps(masks, depths, cfg, num_classes=len(names))
    B, H, W = masks.shape
    assert feats.shape == (B, H // 4, W // 4, 64) and feats.dtype == torch.float32
    protos = make_prototypes(len(names), cfg).classes
    blocks = masks.reshape(B, H // 4, 4, W // 4, 4).permute(0, 1, 3, 2, 4).reshape(B, H // 4, W // 4, 16)
    pure = (blocks == blocks[..., :1]).all(-1) & (blocks[..., 0] != 255)
    assert pure.sum() > 100
    cls = blocks[..., 0][pure]
    cos = (feats[pure].double() * torch.from_numpy(protos)[cls]).sum(-1)
    assert cos.min() > 0.999
    # background patches carry the background prototype, not a class
    bg = (blocks == 255).all(-1)
    bgp = make_prototypes(len(names), cfg).background
    assert cos_to(feats[bg], bgp).min() > 0.999


# -------------------------------------------------------------------------- bleed
def two_halves(H=32, W=64, split=29):
    m = torch.zeros(1, H, W, dtype=torch.long)
    m[:, :, split:] = 1
    return m


def test_bleed_mixes_patch_by_area_and_lowers_boundary_cosine():
    m = two_halves()
    cfg = TeacherSimConfig.clean(bleed=1.0, patch_size=8)
    f = simulate_feature_maps(m, None, cfg)
    P = make_prototypes(2, cfg).classes
    # the patch of columns 24..31 holds 5 px of class 0 and 3 px of class 1 per row
    mix = 5 / 8 * P[0] + 3 / 8 * P[1]
    mix /= np.linalg.norm(mix)
    assert cos_to(f[0, 0, 3], mix).item() > 0.9999
    assert cos_to(f[0, 0, 1], P[0]).item() > 0.9999  # interior patch untouched
    # with bleed off the straddling patch takes its majority class
    f0 = simulate_feature_maps(m, None, TeacherSimConfig.clean(bleed=0.0, patch_size=8))
    assert cos_to(f0[0, 0, 3], P[0]).item() > 0.9999
    # pixel level (bilinear upsampling): pixels within one patch of the boundary are worse off
    up = upsample_feature_map(f, 32, 64, 8)[0]  # [H, W, D]
    own = torch.from_numpy(P)[m[0]]
    cos = (up.double() * own).sum(-1)
    dist = (torch.arange(64) - 28.5).abs()[None].expand(32, 64)
    near, interior = cos[dist <= 8], cos[dist > 16]
    assert interior.min() > 0.999
    assert near.mean() < interior.mean() - 0.01 and near.min() < 0.95


def test_context_blur_spreads_further():
    m = two_halves()
    P = make_prototypes(2, TeacherSimConfig()).classes
    sharp = simulate_feature_maps(m, None, TeacherSimConfig.clean(bleed=1.0))
    blur = simulate_feature_maps(m, None, TeacherSimConfig.clean(bleed=1.0, context_sigma=1.0))
    # patch column 1 (two patches from the boundary) is pure in the sharp map only
    assert cos_to(sharp[0, 0, 1], P[0]).item() > 0.9999
    assert cos_to(blur[0, 0, 1], P[0]).item() < 1 - 1e-5
    assert cos_to(blur[0, 0, 2], P[0]).item() < cos_to(sharp[0, 0, 2], P[0]).item() - 1e-3


# ---------------------------------------------------------------------- occlusion
def occlusion_scene():
    """32 x 32: background rows 0..3 (depth 0), floor (class 0, depth 5), square (class 1, depth 2)."""
    m = torch.zeros(1, 32, 32, dtype=torch.long)
    d = torch.full((1, 32, 32), 5.0)
    m[:, 12:20, 12:20] = 1
    d[:, 12:20, 12:20] = 2.0
    m[:, :4] = 255
    d[:, :4] = 0.0
    return m, d


def test_occlusion_contamination_only_on_far_side_of_depth_edges():
    m, d = occlusion_scene()
    band, c = 3, 0.6
    on_cfg = TeacherSimConfig.clean(patch_size=1, occlusion_contamination=c, occlusion_band_px=band)
    f_on = simulate_feature_maps(m, d, on_cfg)[0]
    f_off = simulate_feature_maps(m, d, TeacherSimConfig.clean(patch_size=1))[0]
    changed = ((f_on * f_off).sum(-1) < 0.9999).numpy()

    # independent "far side" set: some pixel within `band` px is nearer by > 5 %
    z = np.where(d[0].numpy() > 0, d[0].numpy(), np.inf)
    far_side = np.zeros_like(changed)
    for y in range(32):
        for x in range(32):
            y0, y1, x0, x1 = max(0, y - band), min(32, y + band + 1), max(0, x - band), min(32, x + band + 1)
            yy, xx = np.mgrid[y0:y1, x0:x1]
            ok = (yy - y) ** 2 + (xx - x) ** 2 <= band * band
            far_side[y, x] = (z[y0:y1, x0:x1][ok] * 1.05 < z[y, x]).any()
    assert changed.any()
    assert not (changed & ~far_side).any()  # only far-side pixels are touched
    assert not changed[12:20, 12:20].any()  # the occluder (near side) keeps its features
    assert changed[15, 11] and changed[11, 15] and changed[3, 20]  # floor and background next to edges
    assert not changed[15, 12 - band - 1] and not changed[28, 28]  # outside the band

    P = make_prototypes(2, on_cfg)
    # distance 1 from the square: normalize(0.4 floor + 0.6 square)
    mix = (1 - c) * P.classes[0] + c * P.classes[1]
    mix /= np.linalg.norm(mix)
    assert cos_to(f_on[15, 11], mix).item() > 0.9999
    # cosine to the own prototype drops, more so closer to the edge
    own_near = cos_to(f_on[15, 11], P.classes[0]).item()
    own_mid = cos_to(f_on[15, 9], P.classes[0]).item()
    assert own_near < own_mid < 0.9999
    assert cos_to(f_on[15, 14], P.classes[1]).item() > 0.9999


def test_occlusion_needs_depth_and_skips_without():
    m, d = occlusion_scene()
    cfg = TeacherSimConfig.clean(patch_size=1, occlusion_contamination=0.6)
    no_depth = simulate_feature_maps(m, None, cfg)
    clean = simulate_feature_maps(m, d, TeacherSimConfig.clean(patch_size=1))
    torch.testing.assert_close(no_depth, clean)


# ------------------------------------------------------------------- view failures
def test_view_failures_flip_argmax_at_configured_rate():
    B, rate = 400, 0.25
    m = torch.zeros(B, 16, 16, dtype=torch.long)
    m[:, :8, 8:], m[:, 8:, :8], m[:, 8:, 8:] = 1, 2, 3
    cfg = TeacherSimConfig.clean(view_failure_rate=rate, patch_size=4, seed=7)
    f, fails = simulate_feature_maps(m, None, cfg, return_failures=True)
    P = torch.from_numpy(make_prototypes(4, cfg).classes).float()
    flipped = 0
    for k in range(4):
        sel = (m == k).reshape(B, 4, 4, 4, 4).permute(0, 1, 3, 2, 4).reshape(B, 4, 4, 16).all(-1)
        mean = (f * sel[..., None]).sum((1, 2))
        arg = (mean @ P.T).argmax(-1)
        for v in range(B):
            assert (arg[v].item() != k) == (k in fails[v])  # exactly the logged failures flip
            if k in fails[v]:
                assert arg[v].item() == fails[v][k] != k
        flipped += int((arg != k).sum())
    frac = flipped / (4 * B)
    assert abs(frac - rate) < 0.05, frac
    # failure draws do not depend on other corruptions being on
    _, fails2 = simulate_feature_maps(m, None, TeacherSimConfig(view_failure_rate=rate, patch_size=4, seed=7),
                                      return_failures=True)
    assert fails2 == fails


def test_azimuth_failures_fail_a_class_over_one_arc_of_views():
    """view_failure_mode='azimuth': a class fails in exactly the views whose azimuth lies in its arc (20 % of the
    orbit), the same confuser each time; without the azimuths the mode refuses to run."""
    import math

    from rh3dgs.data.teacher_sim import azimuth_arcs, in_arc

    B, rate = 360, 0.2
    m = torch.zeros(B, 16, 16, dtype=torch.long)
    m[:, :8, 8:], m[:, 8:, :8], m[:, 8:, 8:] = 1, 2, 3
    az = [2 * math.pi * v / B for v in range(B)]
    cfg = TeacherSimConfig.clean(view_failure_rate=rate, view_failure_mode="azimuth", patch_size=4, seed=7)
    _, fails = simulate_feature_maps(m, None, cfg, return_failures=True, view_azimuths=az)
    centres, _, half = azimuth_arcs(7, 5, 4, rate)
    assert half == pytest.approx(rate * math.pi)
    for k in range(4):
        failed = [v for v in range(B) if k in fails[v]]
        assert failed == [v for v in range(B) if in_arc(az[v], centres[k], half)]
        assert abs(len(failed) / B - rate) < 0.01 and len({fails[v][k] for v in failed}) == 1
        runs = sum(1 for v in failed if (v - 1) % B not in failed)  # one contiguous arc of views
        assert runs == 1
    with pytest.raises(ConfigError, match="view_azimuths"):
        simulate_feature_maps(m, None, cfg)
    with pytest.raises(ConfigError, match="view_failure_mode"):
        TeacherSimConfig(view_failure_mode="nope")


# ---------------------------------------------------------------------------- noise
def test_heavy_tailed_noise_and_outliers():
    m = torch.zeros(1, 256, 256, dtype=torch.long)
    cfg = TeacherSimConfig.clean(noise_deg=5.0, noise_dof=3.0, outlier_fraction=0.05, patch_size=2, seed=1)
    f = simulate_feature_maps(m, None, cfg)[0].reshape(-1, 64)
    p = make_prototypes(1, cfg).classes[0]
    ang = np.degrees(np.arccos(np.clip(cos_to(f, p).numpy(), -1, 1)))
    inliers = ang[ang < 60]
    outlier_frac = (ang >= 60).mean()
    assert abs(outlier_frac - 0.05) < 0.01  # random directions are ~90 degrees away in 64-D
    med = np.median(inliers)
    assert 2.5 < med < 6.0  # 5 deg * median |t_3| (0.77)
    assert (inliers > 5 * med).mean() > 0.005  # heavy tail (Gaussian: ~1e-6)


# ----------------------------------------------------------- files written to disk
def test_simulate_teacher_writes_valid_files(dataset, tmp_path):
    root = tmp_path / "d"
    shutil.copytree(dataset, root)
    cfg = TeacherSimConfig(patch_size=8, seed=5, view_failure_rate=0.3)
    out = simulate_teacher(root, cfg, progress=False)
    stems, masks, depths, names = load_views(root)
    assert [p.name for p in out.feature_files] == [f"{s}.npy" for s in stems]
    for p in out.feature_files:
        a = np.load(p)
        assert a.dtype == np.float16 and a.shape == (64 // 8, 64 // 8, 64)
        np.testing.assert_allclose(np.linalg.norm(a.astype(np.float32), axis=-1), 1.0, atol=1e-2)
    emb = np.load(out.text_embeddings)
    assert set(emb.files) == set(names) | set(CANONICAL_NEGATIVES)
    assert "floor" in emb.files
    np.testing.assert_allclose(emb["floor"], make_prototypes(len(names), cfg).classes[0], atol=1e-6)
    meta = json.loads(out.config.read_text())
    assert meta["config"]["seed"] == 5 and meta["classes"] == names
    assert abs(meta["prototype_stats"]["mean_pairwise_cos"] - cfg.cone_cos) < 0.05
    # the files are the in-memory simulation (view i = stream i), rounded to float16
    mem, fails = simulate_feature_maps(masks, depths, cfg, num_classes=len(names), return_failures=True)
    disk = torch.stack([torch.from_numpy(np.load(p).astype(np.float32)) for p in out.feature_files])
    assert (mem - disk).abs().max() < 2e-3
    logged = {s: {names[k]: names[c] for k, c in fl.items()} for s, fl in zip(stems, fails) if fl}
    assert meta["view_failures"] == logged
    assert not list(root.rglob(".*.tmp"))  # atomic writes leave no temp files


def test_simulate_teacher_deterministic(dataset, tmp_path):
    roots = []
    for name in ("a", "b", "c"):
        shutil.copytree(dataset, tmp_path / name)
        roots.append(tmp_path / name)
    cfg = TeacherSimConfig(seed=11)
    outs = [simulate_teacher(roots[0], cfg, progress=False), simulate_teacher(roots[1], cfg, progress=False),
            simulate_teacher(roots[2], TeacherSimConfig(seed=12), progress=False)]
    for fa, fb, fc in zip(*(o.feature_files for o in outs)):
        assert fa.read_bytes() == fb.read_bytes()
        assert fa.read_bytes() != fc.read_bytes()
    ea, eb = np.load(outs[0].text_embeddings), np.load(outs[1].text_embeddings)
    for k in ea.files:
        assert ea[k].tobytes() == eb[k].tobytes()
    assert outs[0].config.read_bytes() == outs[1].config.read_bytes()


# --------------------------------------------------------------------------- errors
def test_config_validation():
    for bad in (dict(dim=2), dict(cone_cos=1.0), dict(patch_size=0), dict(bleed=1.5), dict(view_failure_rate=-0.1),
                dict(noise_dof=0), dict(seed=-1), dict(occlusion_band_px=-1)):
        with pytest.raises(ConfigError):
            TeacherSimConfig(**bad)


def test_input_errors(tmp_path, dataset):
    with pytest.raises(InputFileError):
        simulate_teacher(tmp_path / "nothing", progress=False)
    with pytest.raises(ShapeError):
        simulate_feature_maps(torch.full((1, 4, 4), 5), None, TeacherSimConfig(), num_classes=3)
    with pytest.raises(ShapeError):
        simulate_feature_maps(torch.zeros(1, 4, 4, dtype=torch.long), torch.zeros(1, 4, 5))
    root = tmp_path / "nodepth"
    shutil.copytree(dataset, root)
    shutil.rmtree(root / "depth")
    with pytest.raises(InputFileError):
        simulate_teacher(root, TeacherSimConfig(), progress=False)
    out = simulate_teacher(root, TeacherSimConfig(occlusion_contamination=0.0), progress=False)
    assert len(out.feature_files) == 3


def test_upsample_handles_non_multiple_sizes():
    f = torch.nn.functional.normalize(torch.randn(2, 3, 4, 8), dim=-1)
    up = upsample_feature_map(f, 20, 30, 8)
    assert up.shape == (2, 20, 30, 8)
    torch.testing.assert_close(up.norm(dim=-1), torch.ones(2, 20, 30))
    m = torch.zeros(1, 20, 30, dtype=torch.long)
    assert simulate_feature_maps(m, None, TeacherSimConfig(patch_size=8)).shape == (1, 3, 4, 64)
