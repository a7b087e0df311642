"""rh3dgs.nerfstudio.dataparser: seed points read with plyfile (no open3d / libusb), and the
``rh3dgs-lite`` preset's initial Gaussians with and without seed points.

open3d is made unimportable in every test here (``sys.modules["open3d"] = None`` in process, a
``open3d`` package that raises ImportError on ``PYTHONPATH`` for ``ns-train``): the state of a
machine without ``libusb-1.0.so.0``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("nerfstudio")
pytest.importorskip("gsplat")

from nerfstudio.configs.dataparser_configs import AnnotatedDataParserUnion  # noqa: E402
from plyfile import PlyData, PlyElement  # noqa: E402

from test_nerfstudio import _make_dataset, _ns_env  # noqa: E402  (the nerfstudio tests' helpers)

from rh3dgs.errors import PlyFormatError  # noqa: E402
from rh3dgs.nerfstudio.dataparser import Rh3dgsDataParserConfig, read_seed_points  # noqa: E402

VENV_BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True)
def _no_open3d(monkeypatch):
    monkeypatch.setitem(sys.modules, "open3d", None)  # `import open3d` raises ImportError


def _write_cloud(path: Path, xyz: np.ndarray, rgb=None, *, text=False, xyz_type="f4", rgb_type="u1") -> Path:
    fields = [(k, xyz_type) for k in "xyz"] + ([] if rgb is None else [(k, rgb_type) for k in ("red", "green", "blue")])
    arr = np.empty(len(xyz), dtype=fields)
    for i, k in enumerate("xyz"):
        arr[k] = xyz[:, i]
    if rgb is not None:
        for i, k in enumerate(("red", "green", "blue")):
            arr[k] = rgb[:, i]
    PlyData([PlyElement.describe(arr, "vertex")], text=text).write(str(path))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return _make_dataset(tmp_path_factory.mktemp("dp") / "scene", views=6, size=32, density=800.0)


# ---------------------------------------------------------------------------- read_seed_points
@pytest.mark.parametrize("text", [False, True])
@pytest.mark.parametrize("xyz_type", ["f4", "f8"])
def test_read_seed_points_values(tmp_path, text, xyz_type):
    rng = np.random.default_rng(0)
    xyz = rng.normal(size=(257, 3)).astype(xyz_type)
    rgb = rng.integers(0, 256, size=(257, 3), dtype=np.uint8)
    p, c = read_seed_points(_write_cloud(tmp_path / "pc.ply", xyz, rgb, text=text, xyz_type=xyz_type))
    assert p.dtype == torch.float32 and p.shape == (257, 3)
    assert torch.equal(p, torch.from_numpy(xyz.astype(np.float32)))
    assert c.dtype == torch.uint8 and torch.equal(c, torch.from_numpy(rgb))


def test_read_seed_points_float_colours_and_none(tmp_path):
    xyz = np.arange(12, dtype=np.float32).reshape(4, 3)
    rgbf = np.array([[0, 0.5, 1], [1, 1, 1], [0.2, 0.4, 0.6], [0, 0, 0]], np.float32)
    _, c = read_seed_points(_write_cloud(tmp_path / "f.ply", xyz, rgbf, rgb_type="f4"))
    assert c.tolist() == [[0, 128, 255], [255, 255, 255], [51, 102, 153], [0, 0, 0]]
    p, c = read_seed_points(_write_cloud(tmp_path / "n.ply", xyz))
    assert torch.equal(p, torch.from_numpy(xyz)) and c.shape == (0, 3) and c.dtype == torch.uint8


def _bad_files(tmp_path: Path):
    xyz = np.ones((10, 3), np.float32)
    good = _write_cloud(tmp_path / "good.ply", xyz, np.zeros((10, 3), np.uint8))
    (tmp_path / "truncated.ply").write_bytes(good.read_bytes()[:-20])
    (tmp_path / "text.ply").write_text("x y z\n0 0 0\n")
    nan = xyz.copy()
    nan[3, 1] = np.nan
    _write_cloud(tmp_path / "nan.ply", nan)
    arr = np.zeros(3, dtype=[("x", "f4"), ("z", "f4")])
    PlyData([PlyElement.describe(arr, "vertex")]).write(str(tmp_path / "no_y.ply"))
    return {"missing.ply": "not found", "truncated.ply": "truncated", "text.ply": "not a valid PLY",
            "nan.ply": "1 point(s) with a NaN / Inf coordinate out of 10, first at vertex 3",
            "no_y.ply": "missing point coordinates: y"}


def test_read_seed_points_bad_input_one_clear_line(tmp_path):
    for name, msg in _bad_files(tmp_path).items():
        with pytest.raises(PlyFormatError) as e:
            read_seed_points(tmp_path / name)
        text = str(e.value)
        assert text.startswith(str(tmp_path / name)) and msg in text and "\n" not in text, text


# ---------------------------------------------------------------------------- the dataparser
def test_dataparser_seed_points_in_the_normalised_frame(data):
    """points3D_xyz = (dataparser_transform @ [x, 1]) * dataparser_scale of the PLY's points, colours as written."""
    out = Rh3dgsDataParserConfig(data=data).setup().get_dataparser_outputs("train")
    raw, rgb = read_seed_points(data / json.loads((data / "transforms.json").read_text())["ply_file_path"])
    T, s = out.dataparser_transform.double(), out.dataparser_scale
    want = (raw.double() @ T[:, :3].T + T[:, 3]) * s
    assert out.metadata["points3D_xyz"].shape == raw.shape
    assert torch.allclose(out.metadata["points3D_xyz"].double(), want, atol=1e-5)
    assert torch.equal(out.metadata["points3D_rgb"], rgb)
    # the cameras went through the same transform: camera centres against the raw poses
    frames = json.loads((data / "transforms.json").read_text())["frames"]
    c_raw = torch.tensor([f["transform_matrix"] for f in frames], dtype=torch.float64)[:, :3, 3]
    names = [Path(f["file_path"]).name for f in frames]
    idx = [names.index(Path(p).name) for p in out.image_filenames]
    c_ns = out.cameras.camera_to_worlds[:, :3, 3].double()
    assert torch.allclose(c_ns, (c_raw[idx] @ T[:, :3].T + T[:, 3]) * s, atol=1e-5)


_REFERENCE = """
import sys
from pathlib import Path

import torch
try:
    import open3d  # noqa: F401
except Exception as e:  # ImportError / OSError of a missing libusb
    print(f"{type(e).__name__}: {e}")
    sys.exit(3)
from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig
m = NerfstudioDataParserConfig(data=Path(sys.argv[1]), load_3D_points=True).setup().get_dataparser_outputs("train").metadata
torch.save({k: m[k] for k in ("points3D_xyz", "points3D_rgb")}, sys.argv[2])
"""


def test_seed_points_match_nerfstudios_open3d_reader(data, tmp_path):
    """The reference: where open3d imports (libusb present), nerfstudio's own reader gives the same
    points and colours, bit for bit (run in a subprocess: open3d stays out of this one)."""
    out = tmp_path / "ref.pt"
    r = subprocess.run([sys.executable, "-c", _REFERENCE, str(data), str(out)], capture_output=True, text=True,
                       timeout=300)
    if r.returncode == 3:
        pytest.skip(f"nerfstudio's reference reader needs open3d, which cannot be imported here: {r.stdout.strip()}")
    assert r.returncode == 0, r.stderr[-3000:]
    ref = torch.load(out, weights_only=True)
    ours = Rh3dgsDataParserConfig(data=data).setup().get_dataparser_outputs("train").metadata
    for k in ("points3D_xyz", "points3D_rgb"):
        assert ours[k].dtype == ref[k].dtype and torch.equal(ours[k], ref[k]), k


def test_dataparser_bad_seed_file_names_it(data, tmp_path):
    import shutil

    root = tmp_path / "scene"
    shutil.copytree(data, root)
    (root / "sparse_pc.ply").write_text("not a ply\n")
    with pytest.raises(PlyFormatError, match=r"sparse_pc\.ply: not a valid PLY"):
        Rh3dgsDataParserConfig(data=root).setup().get_dataparser_outputs("train")


@dataclass
class Holder:
    """The datamanager's ``dataparser`` field as ns-train's tyro sees it."""

    dataparser: AnnotatedDataParserUnion = field(default_factory=Rh3dgsDataParserConfig)


def test_method_configs_use_the_dataparser_on_the_command_line():
    """tyro keeps the presets' Rh3dgsDataParserConfig, also when `nerfstudio-data` is named."""
    import tyro

    from rh3dgs.nerfstudio.config import rh3dgs_config, rh3dgs_lite_config

    for preset in (rh3dgs_config(), rh3dgs_lite_config()):
        default = Holder(preset.pipeline.datamanager.dataparser)
        for args in ([], ["nerfstudio-data", "--downscale-factor", "2"]):
            dp = tyro.cli(Holder, args=args, default=default).dataparser
            assert type(dp) is Rh3dgsDataParserConfig and dp.load_3D_points, (args, type(dp))
        assert dp.downscale_factor == 2


# ---------------------------------------------------------------------------- rh3dgs-lite's initial Gaussians
def _lite_model(data: Path, out: Path):
    from rh3dgs.nerfstudio.config import rh3dgs_lite_config

    c = rh3dgs_lite_config()
    c.pipeline.datamanager.data = data
    c.pipeline.datamanager.teacher_cache_dir = out / "teacher_cache"
    c.machine.device_type = "cpu"
    return c.pipeline.setup(device="cpu", test_mode="val").model


def test_lite_starts_from_the_seed_points(data, tmp_path):
    m = _lite_model(data, tmp_path)
    seeds = Rh3dgsDataParserConfig(data=data).setup().get_dataparser_outputs("train").metadata["points3D_xyz"]
    assert m.num_points == min(len(seeds), m.config.max_init_points) > 0
    d = torch.cdist(m.means.detach(), seeds, compute_mode="donot_use_mm_for_euclid_dist")
    assert d.min(1).values.max() == 0  # each Gaussian sits exactly on a seed point


def test_lite_without_seed_points_is_cpu_sized(data, tmp_path):
    """A dataset without ply_file_path: a few thousand random Gaussians (the preset's num_random), not 50,000."""
    import shutil

    root = tmp_path / "scene"
    shutil.copytree(data, root)
    tf = json.loads((root / "transforms.json").read_text())
    del tf["ply_file_path"]
    (root / "transforms.json").write_text(json.dumps(tf))
    (root / "sparse_pc.ply").unlink()
    m = _lite_model(root, tmp_path)
    assert m.config.num_random == 4000
    assert m.num_points == 4000
    assert float(m.means.detach().abs().max()) <= m.config.random_scale / 2
    assert m.latents.shape == (4000, m.config.latent_dim)


# ---------------------------------------------------------------------------- ns-train without open3d
@pytest.mark.slow
def test_ns_train_lite_with_open3d_unimportable(data, tmp_path):
    """`ns-train rh3dgs-lite` with an `open3d` that raises ImportError (a machine without libusb):
    it trains, and its Gaussians are the dataset's seed points (not a random start)."""
    block = tmp_path / "block"
    (block / "open3d").mkdir(parents=True)
    (block / "open3d" / "__init__.py").write_text(
        "raise ImportError('libusb-1.0.so.0: cannot open shared object file (simulated by rh3dgs tests)')\n")
    env = _ns_env()
    env["PYTHONPATH"] = os.pathsep.join([str(block)] + [p for p in [env.get("PYTHONPATH")] if p])
    probe = subprocess.run([sys.executable, "-c", "import open3d"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "simulated by rh3dgs tests" in probe.stderr
    out = tmp_path / "outputs"
    steps = 3  # < warmup_length: no densification, the checkpoint holds the initial Gaussians
    cmd = [str(VENV_BIN / "ns-train"), "rh3dgs-lite", "--machine.device-type", "cpu", "--vis", "tensorboard",
           "--output-dir", str(out), "--experiment-name", "synth", "--timestamp", "run",
           "--max-num-iterations", str(steps), "--steps-per-save", str(steps),
           "--viewer.quit-on-train-completion", "True",
           "--pipeline.datamanager.teacher-cache-dir", str(tmp_path / "cache"), "--data", str(data)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    assert "random point cloud initialization" not in r.stdout
    ckpts = sorted((out / "synth" / "rh3dgs-lite" / "run" / "nerfstudio_models").glob("step-*.ckpt"))
    assert ckpts, r.stdout[-2000:]
    means = torch.load(ckpts[-1], map_location="cpu", weights_only=True)["pipeline"]["_model.gauss_params.means"]
    seeds = Rh3dgsDataParserConfig(data=data).setup().get_dataparser_outputs("train").metadata["points3D_xyz"]
    assert means.shape == (min(len(seeds), 4000), 3)
    assert torch.cdist(means, seeds, compute_mode="donot_use_mm_for_euclid_dist").min(1).values.max() < 1e-3  # on the seed points after 3 small steps


# ---------------------------------------------------------------------------- real captures: rh3dgs's image rule
def _capture(data: Path, root: Path, *, drop: int = 0, k1: float = 0.0) -> Path:
    """A copy of ``data`` as a phone capture: the first ``drop`` frames' images deleted, OpenCV distortion ``k1``,
    no seed points."""
    import shutil

    shutil.copytree(data, root)
    tf = json.loads((root / "transforms.json").read_text())
    tf.pop("ply_file_path", None)
    if k1:
        tf.update(k1=k1, k2=0.0, p1=0.0, p2=0.0)
        tf.pop("camera_model", None)  # instant-ngp writes none
    (root / "transforms.json").write_text(json.dumps(tf))
    for fr in tf["frames"][:drop]:
        (root / fr["file_path"]).unlink()
    return root


def test_dataparser_missing_images_one_error_or_skipped(data, tmp_path, capsys):
    """Missing images: one CameraFormatError naming transforms.json and the option; skip_missing_images leaves
    those frames out (what `rh3dgs extract --skip-missing-images` does)."""
    from rh3dgs.errors import CameraFormatError

    root = _capture(data, tmp_path / "cap", drop=2)
    with pytest.raises(CameraFormatError, match=r"transforms\.json \[frames\[0\]\.file_path\]: 2 of 6 images not "
                                                 r"found: .*nerfstudio-data --skip-missing-images True"):
        Rh3dgsDataParserConfig(data=root).setup().get_dataparser_outputs("train")
    parser = Rh3dgsDataParserConfig(data=root, skip_missing_images=True, eval_mode="all").setup()
    out = parser.get_dataparser_outputs("train")
    assert "skipping 2 of 6 frames whose images are missing" in " ".join(capsys.readouterr().out.split())
    assert [p.stem for p in out.image_filenames] == ["frame_00002", "frame_00003", "frame_00004", "frame_00005"]
    assert all(p.is_file() for p in out.image_filenames)


def test_dataparser_undistorts_and_downscales_like_load_transforms(data, tmp_path):
    """A distorted capture at downscale 2 without images_2: nerfstudio's cameras are the pinhole cameras of
    rh3dgs's undistorted, resized images (load_transforms'), with no distortion left for nerfstudio to apply."""
    from rh3dgs.io.transforms import load_transforms

    root = _capture(data, tmp_path / "cap", k1=-0.05)
    out = Rh3dgsDataParserConfig(data=root, downscale_factor=2, eval_mode="all").setup().get_dataparser_outputs("train")
    cams, images = load_transforms(root, downscale=2, progress=False)
    assert [Path(p).resolve() for p in out.image_filenames] == [Path(p).resolve() for p in images]
    assert all(p.suffix == ".png" and ".rh3dgs_cache" in p.parts for p in out.image_filenames)
    c = out.cameras
    assert c.distortion_params is None or float(c.distortion_params.abs().max()) == 0.0
    assert int(c.width[0]) == cams.width < 16 and int(c.height[0]) == cams.height
    torch.testing.assert_close(c.fx[:, 0], cams.Ks[:, 0, 0], rtol=1e-6, atol=0)
    torch.testing.assert_close(c.cy[:, 0], cams.Ks[:, 1, 2], rtol=1e-6, atol=0)
    assert "points3D_xyz" not in out.metadata  # no seed points: the model starts from random Gaussians


def test_dataparser_plain_dataset_is_read_by_nerfstudio_as_is(data):
    """Pinhole, every image there, full size: nerfstudio's own outputs (no derived file, the dataset's paths)."""
    out = Rh3dgsDataParserConfig(data=data).setup().get_dataparser_outputs("train")
    assert all(p.parent == data / "images" for p in out.image_filenames)


def test_ns_train_input_error_is_one_line_and_leaves_no_run_folder(data, tmp_path):
    """`ns-train rh3dgs-lite` on a capture with missing images: exit code != 0, one `ns-train: error:` line naming
    transforms.json and the option, no traceback, and no run folder (nerfstudio writes config.yml before set-up)."""
    root = _capture(data, tmp_path / "cap", drop=1)
    out = tmp_path / "outputs"
    cmd = [str(VENV_BIN / "ns-train"), "rh3dgs-lite", "--machine.device-type", "cpu", "--vis", "tensorboard",
           "--output-dir", str(out), "--max-num-iterations", "2", "--data", str(root)]
    r = subprocess.run(cmd, env=_ns_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr + r.stdout, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("ns-train: error:")]
    assert len(errors) == 1 and "transforms.json [frames[0].file_path]: 1 of 6 images not found" in errors[0], r.stderr
    assert "--skip-missing-images True" in errors[0]
    assert not out.exists(), sorted(out.rglob("*"))


def test_automatic_downscale_is_nerfstudios(tmp_path):
    """nerfstudio_downscale (the data parser's and rh3dgs.load's factor) is nerfstudio 1.1.5's rule: halve while
    over 1600 px and an images_2^k copy of the first frame exists; never resizing by itself."""
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import MAX_AUTO_RESOLUTION

    from rh3dgs.io.transforms import NERFSTUDIO_MAX_AUTO_RESOLUTION, nerfstudio_downscale

    assert NERFSTUDIO_MAX_AUTO_RESOLUTION == MAX_AUTO_RESOLUTION
    eye = [[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0], [0, 0, 0, 1.0]]
    (tmp_path / "transforms.json").write_text(json.dumps(
        {"fl_x": 3000.0, "w": 4000, "h": 3000, "frames": [{"file_path": "images/a.jpg", "transform_matrix": eye}]}))
    assert nerfstudio_downscale(tmp_path) == 1  # no images_2: nerfstudio keeps the full size
    for k in (2, 4):
        (tmp_path / f"images_{k}").mkdir()
        (tmp_path / f"images_{k}" / "a.jpg").write_bytes(b"")
    assert nerfstudio_downscale(tmp_path) == 4 and nerfstudio_downscale(tmp_path, 2) == 2
