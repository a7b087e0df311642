"""teachers/maps.py: the one provider ``dataset -> per-view maps`` and its one cache default.

``rh3dgs extract`` and the ``ns-train rh3dgs`` data manager go through :func:`dataset_maps` with the
same teacher config, so what one computed the other reuses (issues 17 / 18: they used to cache in
``DATA/.rh3dgs_cache`` and ``DATA/rh3dgs_cache``, and training recomputed every feature).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rh3dgs.cli import main as cli_main
from rh3dgs.errors import ConfigError, ShapeError
from rh3dgs.io.transforms import load_transforms
from rh3dgs.teachers import (
    DEFAULT_CACHE_DIRNAME,
    TeacherConfig,
    dataset_maps,
    default_cache_dir,
    load_cached,
    make_teacher,
    teacher_cache_dir,
)
from _scenes import synthetic_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return synthetic_dataset(tmp_path_factory.mktemp("maps") / "scene", 10, 32, 800.0)


def test_one_default_cache_folder(data):
    assert DEFAULT_CACHE_DIRNAME == ".rh3dgs_cache"
    assert default_cache_dir(data) == data / ".rh3dgs_cache"


def test_precomputed_maps_are_read_in_place(data):
    _, images = load_transforms(data, check_images=False)
    teacher = TeacherConfig(name="precomputed").setup(data)
    maps = dataset_maps(teacher, images, data_dir=data)
    assert not maps.cached and len(maps) == len(images)
    assert maps.stats["computed"] == 0 and not default_cache_dir(data).exists()
    assert [p.name for p in maps.files] == [f"{Path(p).stem}.npy" for p in images]
    m = maps[2]
    assert torch.equal(m, teacher.load_feature_map(Path(images[2]).stem))
    assert torch.allclose(m.norm(dim=-1), torch.ones(m.shape[:2]), atol=1e-5)


def test_computed_maps_are_cached_once(data, tmp_path):
    _, images = load_transforms(data, check_images=False)
    teacher = make_teacher("tiny-clip", device="cpu")
    first = dataset_maps(teacher, images, tmp_path / "cache", progress=False)
    assert first.cached and first.stats["computed"] == len(set(first.files)) > 0
    again = dataset_maps(teacher, images, tmp_path / "cache", progress=False)
    assert again.stats["computed"] == 0 and again.files == first.files
    assert all(p.parent == teacher_cache_dir(teacher, tmp_path / "cache") for p in again.files)
    assert torch.equal(again[1], load_cached(first.files[1]))
    with pytest.raises(ConfigError, match="cache"):
        dataset_maps(teacher, images, progress=False)  # neither a cache folder nor the dataset folder


def test_teacher_specs_from_one_method_per_teacher(data):
    spec = TeacherConfig(name="precomputed").spec(data)
    assert spec == {"name": "precomputed", "features_dir": str((data / "features").resolve())}
    tiny = TeacherConfig(name="tiny-clip", seed=3).spec()
    assert tiny["name"] == "tiny-clip" and tiny["seed"] == 3 and "model" not in tiny
    clip = TeacherConfig(name="clip", checkpoint="w.bin").spec()
    assert clip["checkpoint"] == "w.bin" and clip["model"] == "ViT-B-16" and "seed" not in clip
    with pytest.raises(ConfigError, match="features_dir"):
        TeacherConfig(name="precomputed").spec()


def test_extract_then_ns_train_datamanager_recomputes_nothing(data, tmp_path):
    """`rh3dgs extract` (default cache) then the `ns-train rh3dgs` data manager on the same data with the
    same teacher and no cache option: 0 features computed in training, the same maps."""
    pytest.importorskip("nerfstudio")
    import shutil

    work = tmp_path / "scene"
    shutil.copytree(data, work)
    assert cli_main(["extract", "--data", str(work), "--teacher", "tiny-clip"]) == 0
    assert (work / ".rh3dgs_cache").is_dir()

    from rh3dgs.nerfstudio.config import rh3dgs_lite_config

    c = rh3dgs_lite_config()
    c.pipeline.datamanager.data = work
    c.pipeline.datamanager.teacher = TeacherConfig(name="tiny-clip")
    dm = c.pipeline.datamanager.setup(device="cpu", test_mode="val")
    for split in ("train", "eval"):
        maps = dm.dataset_maps(split)
        assert maps.cached and len(maps) > 0
        assert maps.stats["computed"] == 0 and maps.stats["reused"] > 0, (split, maps.stats)
        assert all(p.is_relative_to(work / ".rh3dgs_cache") for p in maps.files)
    _, images = load_transforms(work, check_images=False)
    by_name = {Path(p).name: i for i, p in enumerate(images)}
    cli = dataset_maps(TeacherConfig(name="tiny-clip").setup(work), images, data_dir=work, progress=False)
    assert cli.stats["computed"] == 0
    train_images = dm.train_dataset._dataparser_outputs.image_filenames
    for j, p in enumerate(train_images[:3]):
        ref = cli[by_name[Path(p).name]].half().float()
        np.testing.assert_array_equal(dm.teacher_map("train", j).numpy(), ref.numpy())


def test_run_configs_naming_the_old_teacher_config_module_still_load():
    """config.yml of runs trained before TeacherConfig moved from teachers/base.py to teachers/registry.py."""
    import yaml

    cfg = yaml.load("!!python/object:rh3dgs.teachers.base.TeacherConfig {name: tiny-clip, seed: 2}",
                    Loader=yaml.Loader)
    assert isinstance(cfg, TeacherConfig) and cfg.spec()["seed"] == 2


# ----------------------------------------------------------------------------- guided upsampling
def _reference_guided(m, guide, sc, ss, r):
    """Per-pixel loops of the formula in guided_upsample's docstring."""
    h, w, D = m.shape
    H, W = guide.shape[:2]
    gbar = torch.nn.functional.adaptive_avg_pool2d(guide.permute(2, 0, 1)[None], (h, w))[0].permute(1, 2, 0)
    out = torch.zeros(H, W, D, dtype=torch.float64)
    support = torch.zeros(H, W, dtype=torch.float64)
    for y in range(H):
        for x in range(W):
            py, px = (y + 0.5) * h / H - 0.5, (x + 0.5) * w / W - 0.5
            cy, cx = min(max(round(py), 0), h - 1), min(max(round(px), 0), w - 1)
            for qy in range(cy - r, cy + r + 1):
                for qx in range(cx - r, cx + r + 1):
                    if 0 <= qy < h and 0 <= qx < w and float(m[qy, qx].norm()) > 1e-8:
                        wgt = np.exp(-((py - qy) ** 2 + (px - qx) ** 2) / (2 * ss ** 2)
                                     - float(((guide[y, x] - gbar[qy, qx]) ** 2).sum()) / (2 * sc ** 2))
                        out[y, x] += wgt * m[qy, qx].double()
                        support[y, x] += wgt
    out[support < 1e-8] = 0  # no nearby cell of this pixel's colour: no feature
    return torch.nn.functional.normalize(out, dim=-1).float()


def test_guided_upsample_matches_its_formula():
    from rh3dgs.teachers.maps import guided_upsample

    g = torch.Generator().manual_seed(0)
    m = torch.nn.functional.normalize(torch.randn(3, 4, 5, generator=g), dim=-1)
    m[1, 2] = 0  # a cell without a feature carries no weight
    guide = torch.rand(12, 14, 3, generator=g)
    out = guided_upsample(m, guide, sigma_color=0.2, sigma_space=0.8, radius=1)
    assert out.shape == (12, 14, 5)
    ref = _reference_guided(m, guide, 0.2, 0.8, 1)
    assert torch.allclose(out, ref, atol=1e-5)
    guide[5, 6] = torch.tensor([5.0, -5.0, 5.0])  # a colour no cell has: no feature
    assert float(guided_upsample(m, guide, sigma_color=0.2, sigma_space=0.8)[5, 6].abs().max()) == 0.0
    # cells of equal size (16 / 4 px) and a wider neighbourhood; unequal cells in both axes (17 / 5, 7 / 3 px)
    for (h, w, H, W), r in (((4, 4, 16, 16), 2), ((5, 3, 17, 7), 1)):
        m = torch.nn.functional.normalize(torch.randn(h, w, 6, generator=g), dim=-1)
        m[0, 1] = 0
        guide = torch.rand(H, W, 3, generator=g)
        ref = _reference_guided(m, guide, 0.2, 0.8, r)
        assert torch.allclose(guided_upsample(m, guide, sigma_color=0.2, sigma_space=0.8, radius=r), ref, atol=1e-5)


def test_guided_upsample_removes_the_patch_halo():
    """A disc on a floor, its features area-pooled into 8-pixel patches: guided by the image's colours, the
    upsampled map labels the pixels around the disc as floor where bilinear upsampling paints the disc's halo."""
    from rh3dgs.teachers.maps import guided_upsample, prepare_map

    H = W = 64
    yy, xx = torch.meshgrid(torch.arange(H) + 0.5, torch.arange(W) + 0.5, indexing="ij")
    disc = ((yy - 29) ** 2 + (xx - 35) ** 2) < 11.0 ** 2
    feat = torch.where(disc[..., None], torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
    coarse = torch.nn.functional.avg_pool2d(feat.permute(2, 0, 1)[None], 8)[0].permute(1, 2, 0)  # [8, 8, 2]
    image = torch.where(disc[..., None], torch.tensor([0.9, 0.1, 0.1]), torch.tensor([0.5, 0.5, 0.5]))

    def iou(up):
        pred = up[..., 0] > up[..., 1]
        return float((pred & disc).sum() / (pred | disc).sum())

    bilinear, guided = iou(prepare_map(coarse, (H, W))), iou(guided_upsample(coarse, image))
    assert bilinear < 0.92 and guided > 0.97, (bilinear, guided)  # measured 0.898 and 1.0


def test_principal_basis_spans_the_maps_and_projected_maps_keep_zero_and_nan_rows():
    from rh3dgs.teachers.maps import ProjectedMaps, principal_basis

    g = torch.Generator().manual_seed(0)
    Q = torch.linalg.qr(torch.randn(24, 3, generator=g))[0]  # the maps' rows live in span(Q)
    maps = torch.nn.functional.normalize(torch.randn(5, 6, 7, 3, generator=g), dim=-1) @ Q.T
    maps[0, 0, 0] = 0.0  # a zero row (no feature) is ignored
    P = principal_basis(maps, 3, views=5)
    assert P.shape == (24, 3) and torch.allclose(P.T @ P, torch.eye(3), atol=1e-5)
    assert torch.allclose(P @ (P.T @ Q), Q, atol=1e-4)  # span(P) = span(Q)
    assert torch.equal(principal_basis(maps, 3, views=5), P)  # deterministic (signs fixed)
    proj = ProjectedMaps(maps, P, 5)
    assert len(proj) == 5 and proj[2].shape == (6, 7, 3)
    assert torch.allclose(proj[2] @ P.T, maps[2], atol=1e-5) and torch.equal(proj[0][0, 0], torch.zeros(3))
    bad = maps.clone()
    bad[1, 2, 3, 0] = float("nan")
    assert torch.isnan(ProjectedMaps(bad, P, 5)[1][2, 3]).all()  # left where it was, for prepare_map to name
    with pytest.raises(ShapeError, match="view 1 has 5 channels"):
        ProjectedMaps([maps[0], torch.zeros(6, 7, 5)], P, 2)[1]


def _voronoi_masks(h: int, w: int, k: int, D: int, seed: int = 0):
    """A mask teacher's map: k random seed points, each pixel takes its nearest seed's unit embedding."""
    g = torch.Generator().manual_seed(seed)
    seeds = torch.rand(k, 2, generator=g) * torch.tensor([h, w])
    yy, xx = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    owner = ((torch.stack([yy, xx], -1)[:, :, None] - seeds) ** 2).sum(-1).argmin(-1)  # [h, w]
    emb = torch.nn.functional.normalize(torch.randn(k, D, generator=g), dim=-1)
    return emb[owner], owner


def test_constant_regions_and_their_fraction_against_a_flood_fill():
    from rh3dgs.teachers.maps import constant_regions, region_fraction

    m, owner = _voronoi_masks(20, 24, 6, 5)
    m[3:6, 4:9] = 0.0  # a hole without feature
    m[15, 20] = m[0, 0]  # an isolated pixel with another region's embedding: its own region
    ids = constant_regions(m)
    # reference: breadth-first flood fill over 4-neighbours with exactly equal rows
    ref = torch.full((20, 24), -1, dtype=torch.long)
    nxt = 0
    for y in range(20):
        for x in range(24):
            if ref[y, x] >= 0 or float(m[y, x].norm()) == 0.0:
                continue
            ref[y, x], stack = nxt, [(y, x)]
            while stack:
                a, b = stack.pop()
                for c, d in ((a + 1, b), (a - 1, b), (a, b + 1), (a, b - 1)):
                    if 0 <= c < 20 and 0 <= d < 24 and ref[c, d] < 0 and torch.equal(m[c, d], m[a, b]):
                        ref[c, d] = nxt
                        stack.append((c, d))
            nxt += 1
    assert int(ids.max()) + 1 == nxt and torch.equal(ids < 0, ref < 0)
    pairs = torch.stack([ids[ref >= 0], ref[ref >= 0]], 1).unique(dim=0)
    assert len(pairs) == nxt  # the same partition (ids may be numbered differently)
    frac = region_fraction(m)
    counts = torch.bincount(ref[ref >= 0])
    expect = torch.where(ref >= 0, counts[ref.clamp_min(0)].float() / (20 * 24), torch.zeros(()))
    assert torch.allclose(frac, expect)
    assert float(frac[15, 20]) == pytest.approx(1 / 480)
    # resolution-free: the same masks at twice the resolution cover the same shares
    up = m.repeat_interleave(2, 0).repeat_interleave(2, 1)
    assert torch.allclose(region_fraction(up)[::2, ::2], frac)
    assert region_fraction(m, (40, 48)).shape == (40, 48) and region_fraction(torch.stack([m, m])).shape == (2, 20, 24)
    # a dense teacher: every cell its own region
    dense = torch.nn.functional.normalize(torch.randn(6, 7, 4), dim=-1)
    assert torch.allclose(region_fraction(dense), torch.full((6, 7), 1 / 42))
    # a batch (one graph for all views) gives each view's own ids and fractions, bit for bit, also resized
    m2, _ = _voronoi_masks(20, 24, 3, m.shape[-1], seed=1)
    m2[0] = 0.0  # a first row without feature
    views = [m, m2, torch.nn.functional.normalize(torch.randn(20, 24, m.shape[-1]), dim=-1)]
    for size in (None, (40, 48)):
        assert torch.equal(constant_regions(torch.stack(views), size), torch.stack([constant_regions(v, size) for v in views]))
        assert torch.equal(region_fraction(views, size), torch.stack([region_fraction(v, size) for v in views]))
    # maps of different sizes: one graph each, resized to one size
    mixed = region_fraction([m, m[:10]], (8, 8))
    assert mixed.shape == (2, 8, 8) and torch.equal(mixed[1], region_fraction(m[:10], (8, 8)))
    with pytest.raises(ShapeError):
        constant_regions(torch.zeros(4, 4))


@pytest.mark.slow
def test_one_cache_on_a_distorted_downscaled_capture_with_missing_images(data, tmp_path, capsys):
    """The fox data's shape (OpenCV distortion, a missing image, no images_2 folder) at downscale 2: `rh3dgs extract`
    then the `ns-train` data manager then `rh3dgs lift` compute 0 maps after extract; the data manager first, then
    lift, also 0. One keying rule: the bytes of the image every entry point gets from load_posed_images."""
    pytest.importorskip("nerfstudio")
    import json
    import shutil

    from rh3dgs.data.synthetic import SceneConfig, make_scene
    from rh3dgs.io.ply import save_ply
    from rh3dgs.nerfstudio.config import rh3dgs_lite_config

    ply = save_ply(tmp_path / "scene.ply", make_scene(SceneConfig(num_views=10, image_size=32,
                                                                  gaussians_per_unit_area=800.0)).gaussians)
    opts = ["--downscale", "2", "--skip-missing-images", "--teacher", "tiny-clip"]

    def capture(name: str) -> Path:
        root = tmp_path / name
        shutil.copytree(data, root)
        tf = json.loads((root / "transforms.json").read_text())
        tf.update(k1=-0.04, k2=0.01, p1=0.001, p2=0.0)
        (root / "transforms.json").write_text(json.dumps(tf))
        (root / tf["frames"][3]["file_path"]).unlink()
        return root

    def datamanager_stats(root: Path):
        c = rh3dgs_lite_config()
        c.pipeline.datamanager.data = root
        c.pipeline.datamanager.dataparser.downscale_factor = 2
        c.pipeline.datamanager.dataparser.skip_missing_images = True
        c.pipeline.datamanager.teacher = TeacherConfig(name="tiny-clip")
        dm = c.pipeline.datamanager.setup(device="cpu", test_mode="val")
        return [dm.dataset_maps(split).stats for split in ("train", "eval")]

    def lift_line(root: Path) -> str:
        capsys.readouterr()
        assert cli_main(["lift", str(ply), "--data", str(root), "--output", str(root / "lifted"), *opts]) == 0
        return next(ln for ln in capsys.readouterr().out.splitlines() if "teacher maps" in ln)

    first = capture("extract_first")
    assert cli_main(["extract", "--data", str(first), *opts]) == 0
    assert "9 feature maps (9 computed, 0 reused)" in capsys.readouterr().out
    stats = datamanager_stats(first)
    assert [s["computed"] for s in stats] == [0, 0] and sum(s["reused"] for s in stats) == 9, stats
    assert "0 computed, 9 reused" in lift_line(first)

    second = capture("train_first")
    assert sum(s["computed"] for s in datamanager_stats(second)) == 9
    assert "0 computed, 9 reused" in lift_line(second)
