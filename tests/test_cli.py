"""Every `rh3dgs` subcommand end to end on generated data."""
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rh3dgs.cli import main
from rh3dgs.io.ply import load_ply


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    assert main(["synth", "--output", str(root / "data"), "--views", "20", "--size", "48", "--seed", "1"]) == 0
    return root


def test_synth_writes_a_nerfstudio_dataset(dataset):
    data = dataset / "data"
    meta = json.loads((data / "transforms.json").read_text())
    assert len(meta["frames"]) == 20 and meta["w"] == 48 and meta["ply_file_path"] == "sparse_pc.ply"
    assert np.array(Image.open(data / "images" / "frame_00000.png")).shape == (48, 48, 3)
    labels = np.array(Image.open(data / "masks" / "frame_00000.png"))
    classes = (data / "classes.txt").read_text().split("\n")
    assert labels.max() == 255 and set(np.unique(labels)) - {255} <= set(range(len(classes)))
    g = load_ply(data / "scene.ply")
    assert "class_id" in g.extra and len(g) > 1000


def test_synth_refuses_to_overwrite(dataset, capsys):
    assert main(["synth", "--output", str(dataset / "data")]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_render(dataset, tmp_path):
    data = dataset / "data"
    assert main(["render", str(data / "scene.ply"), "--transforms", str(data), "--output", str(tmp_path / "r")]) == 0
    rgb = np.array(Image.open(tmp_path / "r" / "frame_00003_rgb.png"))
    ref = np.array(Image.open(data / "images" / "frame_00003.png"))
    assert np.abs(rgb.astype(int) - ref.astype(int)).max() <= 1  # same renderer, same cameras
    assert (tmp_path / "r" / "frame_00003_depth.png").exists()


def test_extract_with_tiny_clip_hits_the_cache(dataset, capsys):
    data = dataset / "data"
    args = ["extract", "--data", str(data), "--teacher", "tiny-clip", "--cache", str(dataset / "cache")]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "20 feature maps (20 computed, 0 reused)" in first
    assert main(args) == 0
    assert "20 feature maps (0 computed, 20 reused)" in capsys.readouterr().out


@pytest.mark.parametrize("cache", [None, "elsewhere"])
def test_extract_on_undistorted_copies(dataset, tmp_path, capsys, cache):
    """Distorted photos are undistorted into the cache's images/ folder first: those copies are the cache's own
    products, not inputs it would overwrite (rh3dgs extract refused every distorted dataset before)."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(dataset / "data" / "images", data / "images")
    meta = json.loads((dataset / "data" / "transforms.json").read_text())
    meta.pop("ply_file_path", None)
    meta.update(k1=0.02, k2=-0.01, p1=0.001, p2=0.0005)  # instant-ngp style: no camera_model key
    meta["frames"] = meta["frames"][:4]
    (data / "transforms.json").write_text(json.dumps(meta))
    args = ["extract", "--data", str(data), "--teacher", "tiny-clip"]
    where = data / ".rh3dgs_cache" if cache is None else tmp_path / cache
    if cache is not None:
        args += ["--cache", str(where)]
    assert main(args) == 0
    assert "4 feature maps (4 computed, 0 reused)" in capsys.readouterr().out
    assert len(list((where / "images").rglob("*.png"))) == 4  # the undistorted copies
    # the cache still never holds the user's own files
    assert main(["extract", "--data", str(data), "--teacher", "tiny-clip", "--cache", str(data)]) == 2
    assert "contains the input" in capsys.readouterr().err


def test_lift_query_select_export(dataset, tmp_path, capsys):
    data = dataset / "data"
    from rh3dgs.data.teacher_sim import simulate_teacher

    simulate_teacher(data, progress=False)
    capsys.readouterr()
    assert main(["lift", str(data / "scene.ply"), "--data", str(data), "--output", str(tmp_path / "scene")]) == 0
    assert capsys.readouterr().err == ""  # no terminal: no progress line per chunk or pass (rh3dgs.progress)
    assert (tmp_path / "scene" / "rh3dgs.json").exists() and (tmp_path / "scene" / "field.npz").exists()
    assert main(["query", str(tmp_path / "scene"), "blue box", "--views", "1", "--output", str(tmp_path / "q")]) == 0
    assert len(list((tmp_path / "q").glob("*.png"))) == 2
    assert main(["select", str(tmp_path / "scene"), "blue box", "--output", str(tmp_path / "box.ply")]) == 0
    box = load_ply(tmp_path / "box.ply")
    full = load_ply(tmp_path / "scene" / "semantic.ply")
    assert 0 < len(box) < len(full)
    assert main(["select", str(tmp_path / "scene"), "blue box", "--output", str(tmp_path / "box.ply")]) == 2
    assert main(["export", str(tmp_path / "scene"), "--output", str(tmp_path / "all.ply")]) == 0
    assert len(load_ply(tmp_path / "all.ply")) == len(full)
    assert main(["lift", str(data / "scene.ply"), "--data", str(data), "--output", str(tmp_path / "scene")]) == 2
    preset = Path(__file__).resolve().parents[1] / "configs" / "lift-euclidean.yaml"
    assert main(["lift", str(data / "scene.ply"), "--data", str(data), "--output", str(tmp_path / "eucl"),
                 "--config", str(preset)]) == 0
    info = json.loads((tmp_path / "eucl" / "rh3dgs.json").read_text())["info"]
    assert info["method"] == "euclidean" and info["use_vcd"] is False and info["passes"] == 1
    assert info["guided"] is False  # the baseline's bilinear maps
    assert main(["lift", str(data / "scene.ply"), "--data", str(data), "--output", str(tmp_path / "bilinear"),
                 "--no-guided", "--iters", "1"]) == 0
    info = json.loads((tmp_path / "bilinear" / "rh3dgs.json").read_text())["info"]
    assert info["guided"] is False and info["method"] == "robust"


def test_demo_small(tmp_path, capsys):
    assert main(["demo", "--output", str(tmp_path / "demo"), "--views", "4", "--size", "48"]) == 0
    out = capsys.readouterr().out
    assert "3D mIoU" in out and str((tmp_path / "demo").resolve()) in out
    assert len(list((tmp_path / "demo" / "queries").glob("*.png"))) > 0
    assert len(list((tmp_path / "demo" / "renders").glob("*_rgb.png"))) == 4
    metrics = json.loads((tmp_path / "demo" / "metrics.json").read_text())
    assert all(0 <= r["miou_3d"] <= 1 for r in metrics["results"].values())
    # the suite's comparison on the demo scene's held-out views: baseline, robust lift, trained
    from rh3dgs.demo import DEMO_ROWS
    assert list(metrics["results"]) == list(DEMO_ROWS) and len(metrics["heldout_views"]) == 4
    assert all(row in out for row in DEMO_ROWS) and "held-out" in out


def test_bad_input_has_no_traceback(tmp_path, capsys):
    (tmp_path / "bad.ply").write_bytes(b"ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nend_header\n1\n")
    assert main(["render", str(tmp_path / "bad.ply"), "--transforms", str(tmp_path), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "bad.ply" in err and "Traceback" not in err


# ---- the command line is tyro over the config dataclasses (one place for each default and its help)

def _lift(*extra):
    from rh3dgs.cli import parse

    return parse(["lift", "s.ply", "--data", "d", "--output", "o", *extra]).command


def test_options_are_the_config_dataclasses_fields_and_defaults():
    from rh3dgs.cli import _teacher_config, parse
    from rh3dgs.data.synthetic import SceneConfig
    from rh3dgs.io.transforms import ImageOptions
    from rh3dgs.lifting import LiftConfig
    from rh3dgs.teachers import TeacherConfig

    cmd = _lift()
    assert cmd.lift.config() == LiftConfig() and type(cmd.lift.config()) is LiftConfig
    assert cmd.teacher.config() == TeacherConfig(name="auto")  # the commands' one own default: the data's cache's
    assert _teacher_config(cmd.teacher, Path("no-such-data")) == TeacherConfig(name="precomputed")  # ... or this
    assert cmd.images == ImageOptions()
    assert parse(["synth", "--output", "o"]).command.scene.config() == SceneConfig()
    # every LiftConfig field is an option, under its README name where it has one
    cmd = _lift("--no-vcd", "--no-guided", "--delta", "0.3", "--iters", "2", "--latent-dim", "4",
                "--views-per-batch", "3", "--method", "karcher", "--min-visibility", "0", "--no-fill",
                "--vcd.edge-radius", "2", "--cache-projections", "False", "--teacher", "tiny-clip",
                "--cache", "c", "--features-dir", "f", "--downscale", "2", "--skip-missing-images", "--no-undistort")
    want = LiftConfig(use_vcd=False, guided=False, delta=0.3, iters=2, latent_dim=4, views_per_batch=3,
                      method="karcher", min_visibility=0.0, fill=False, cache_projections=False)
    want.vcd.edge_radius = 2
    assert cmd.lift.config() == want
    assert cmd.teacher.config() == TeacherConfig(name="tiny-clip", cache_dir="c", features_dir="f")
    assert cmd.images == ImageOptions(downscale=2, skip_missing_images=True, undistort=False)
    scene = parse(["demo", "--views", "5", "--size", "32", "--seed", "3", "--layout", "2"]).command.scene
    assert scene.config() == SceneConfig(num_views=5, image_size=32, seed=3, layout=2)


def test_help_text_is_the_dataclass_docstring(capsys):
    from rh3dgs.cli import main
    from rh3dgs.lifting import LiftConfig

    with pytest.raises(SystemExit) as ei:
        main(["lift", "--help"])
    assert ei.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--no-vcd", "--no-guided", "--delta", "--iters", "--latent-dim", "--views-per-batch", "--method",
                 "--teacher", "--cache", "--features-dir", "--checkpoint", "--downscale", "--skip-missing-images",
                 "--no-undistort", "--streaming", "--config", "--frame", "--overwrite"):
        assert flag in text, flag
    assert "Huber threshold (rad)" in text and "(default: 0.2)" in text
    assert f"(default: {LiftConfig.iters})" in text
    with pytest.raises(SystemExit) as ei:
        main(["--help"])
    text = capsys.readouterr().out
    assert ei.value.code == 0 and all(c in text for c in ("demo", "synth", "lift", "query", "eval", "view"))


def test_lift_preset_gives_defaults_and_options_still_win(tmp_path):
    preset = Path(__file__).resolve().parents[1] / "configs" / "lift-euclidean.yaml"
    from rh3dgs.presets import load_preset
    from rh3dgs.lifting import LiftConfig

    base = load_preset(preset, LiftConfig)
    assert _lift("--config", str(preset)).lift.config() == base
    cmd = _lift("--config", str(preset), "--latent-dim", "3")
    assert cmd.lift.config().latent_dim == 3 and cmd.lift.config().method == base.method == "euclidean"


def test_a_command_line_that_does_not_parse_is_one_line(capsys):
    from rh3dgs.cli import main

    for argv, words in ((["lift", "s.ply", "--output", "o"], ["rh3dgs lift", "--data", "required"]),
                        (["query", "--output", "o"], ["SCENE", "QUERIES"]),
                        (["lift", "s", "--data", "d", "--output", "o", "--method", "mean"], ["'mean'", "robust"]),
                        (["synth", "--output", "o", "--views", "abc"], ["--views", "'abc'"]),
                        (["render", "s", "--transforms", "t", "--output", "o", "--bogus"], ["--bogus"]),
                        (["frobnicate"], ["unknown command 'frobnicate'"])):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("rh3dgs: error: "), err
        assert all(w in err for w in words), (argv, err)
