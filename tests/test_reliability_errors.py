"""One error hierarchy: every user-facing failure is an Rh3dgsError subclass whose message
names the file / field / value; the CLI prints it as one line without a traceback, and
``rh3dgs --debug ...`` re-raises it (traceback)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rh3dgs import errors
from rh3dgs.cli import main

from fuzz.targets import seed_dir


def _bad_inputs(tmp):
    """(case, argv, expected error class, substrings the message must contain)."""
    seeds = seed_dir()
    (tmp / "garbage.ply").write_bytes(b"not a ply at all")
    trunc = (seeds / "scene.ply").read_bytes()
    (tmp / "trunc.ply").write_bytes(trunc[: len(trunc) - 7])
    nan_json = json.loads((seeds / "data" / "transforms.json").read_text())
    nan_json["frames"][0]["transform_matrix"][0][3] = float("nan")
    (tmp / "nan").mkdir()
    (tmp / "nan" / "img0.png").write_bytes((seeds / "data" / "img0.png").read_bytes())
    (tmp / "nan" / "transforms.json").write_text(json.dumps(nan_json))
    (tmp / "noimg").mkdir()
    (tmp / "noimg" / "transforms.json").write_text((seeds / "data" / "transforms.json").read_text())
    feats = tmp / "featdata"
    (feats / "features").mkdir(parents=True)
    (feats / "img0.png").write_bytes((seeds / "data" / "img0.png").read_bytes())
    (feats / "transforms.json").write_text((seeds / "data" / "transforms.json").read_text())
    bad = np.ones((3, 4, 5), np.float32)
    bad[1, 2, 0] = np.nan
    np.save(feats / "features" / "img0.npy", bad)
    scene = tmp / "scene"
    import shutil

    shutil.copytree(seeds / "scene", scene)
    (scene / "field.npz").write_bytes(b"PK\x03\x04 truncated")
    out = str(tmp / "out")
    ply = str(seeds / "scene.ply")
    return [
        ("PLY that is not a PLY", ["render", str(tmp / "garbage.ply"), "--transforms", str(seeds / "data"), "--output", out],
         errors.PlyFormatError, ["garbage.ply"]),
        ("truncated PLY", ["render", str(tmp / "trunc.ply"), "--transforms", str(seeds / "data"), "--output", out],
         errors.PlyFormatError, ["trunc.ply"]),
        ("missing PLY", ["render", str(tmp / "nope.ply"), "--transforms", str(seeds / "data"), "--output", out],
         errors.PlyFormatError, ["nope.ply", "not found"]),
        ("NaN in transform_matrix", ["render", ply, "--transforms", str(tmp / "nan"), "--output", out],
         errors.CameraFormatError, ["transforms.json", "frames[0].transform_matrix[0][3]", "nan"]),
        ("images missing", ["extract", "--data", str(tmp / "noimg"), "--teacher", "tiny-clip"],
         errors.CameraFormatError, ["transforms.json", "frames[0].file_path", "img0.png"]),
        ("NaN in a feature map", ["lift", ply, "--data", str(feats), "--output", out],
         errors.FeatureFormatError, ["img0.npy", "values", "pixel (y=1, x=2)"]),
        ("corrupt field.npz", ["query", str(scene), "red mug", "--output", out],
         errors.InputFileError, ["field.npz"]),
        ("not a scene folder", ["query", str(tmp), "red mug", "--output", out],
         errors.InputFileError, [str(tmp), "rh3dgs.json"]),
        ("unknown teacher", ["extract", "--data", str(seeds / "data"), "--teacher", "dino"],
         errors.ConfigError, ["dino"]),
    ]


CASES = ["PLY that is not a PLY", "truncated PLY", "missing PLY", "NaN in transform_matrix", "images missing",
         "NaN in a feature map", "corrupt field.npz", "not a scene folder", "unknown teacher"]


@pytest.mark.parametrize("case", CASES)
def test_cli_prints_one_line_naming_the_file(case, tmp_path, capsys):
    _, argv, cls, needles = next(c for c in _bad_inputs(tmp_path) if c[0] == case)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rh3dgs: error: "), err
    assert "Traceback" not in err[0]
    for s in needles:
        assert s in err[0], (s, err[0])
    with pytest.raises(cls):  # --debug: the exception itself (traceback), same class
        main(["--debug"] + argv)


def test_every_error_class_is_an_rh3dgs_error():
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.Rh3dgsError)


def test_real_cli_process_no_traceback_and_debug_traceback(tmp_path):
    """The installed entry point: exit code 2, one line; --debug shows the traceback."""
    bad = tmp_path / "bad.ply"
    # three whole rows (not truncated) that lack the 3DGS properties
    bad.write_bytes(b"ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nend_header\n1\n2\n3\n")
    argv = [sys.executable, "-m", "rh3dgs.cli", "render", str(bad), "--transforms", str(tmp_path), "--output",
            str(tmp_path / "o")]
    env = dict(os.environ, RH3DGS_QUIET="1")
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0 and "bad.ply" in p.stderr and "missing required 3DGS properties" in p.stderr
    p = subprocess.run(argv[:3] + ["--debug"] + argv[3:], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0 and "Traceback" in p.stderr and "PlyFormatError" in p.stderr
