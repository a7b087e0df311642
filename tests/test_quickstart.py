"""The newcomer's path: the README's nerfstudio recipe verbatim, then docs/quickstart.md's steps on the run.

The README's three commands (``rh3dgs synth --output data/synth``, the simulated teacher,
``ns-train rh3dgs-lite --data data/synth --machine.device-type cpu``) are read from README.md and run
as written in a fresh working folder (the ``rh3dgs`` and ``python -c`` lines in this process, ``ns-train`` as
a command), with flags appended only to make them small (64 px, 8 views,
30 steps, tensorboard instead of the blocking viewer): ``--data`` stays relative. Then the
quickstart's steps 4-6 run on that run's ``config.yml``: ``rh3dgs.load`` + a query from the same and
from another working folder, ``rh3dgs query`` (result sheets), the viewer (127.0.0.1),
``rh3dgs export`` (the dataset's frame) and ``rh3dgs lift`` of the run's Gaussians in ``ns-export``'s
frame (mapped back with the run's ``dataparser_transforms.json``, refused with the frame message
without it). Not run: ``ns-process-data`` (needs COLMAP) and the ``clip`` teacher (no weights);
see docs/quickstart.md, section Tested.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("nerfstudio")

import rh3dgs  # noqa: E402
from rh3dgs.cli import main  # noqa: E402

from _http import listen_addresses  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
SMALL = {"rh3dgs synth": ["--size", "64", "--views", "8"],
         "ns-train": ["--max-num-iterations", "30", "--steps-per-save", "30", "--vis", "tensorboard",
                      "--experiment-name", "synth", "--timestamp", "run"]}


def readme_nerfstudio_recipe() -> list:
    """The commands of the README's first code block under '## nerfstudio', as argument lists."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## nerfstudio"):]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def _env() -> dict:
    from rh3dgs.nerfstudio import METHOD_CONFIGS_ENV

    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if not {"rh3dgs", "rh3dgs-lite"} <= set(entry_points(group="nerfstudio.method_configs").names):
        env["NERFSTUDIO_METHOD_CONFIGS"] = METHOD_CONFIGS_ENV
    return env


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(working folder, relative config.yml) of the README recipe run verbatim there."""
    root = tmp_path_factory.mktemp("newcomer")
    cmds = readme_nerfstudio_recipe()
    assert [c[0] for c in cmds] == ["rh3dgs", "python", "ns-train"], cmds
    assert "--data" in cmds[2] and not Path(cmds[2][cmds[2].index("--data") + 1]).is_absolute()
    env = _env()
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for cmd in cmds:
            extra = next((v for k, v in SMALL.items() if " ".join(cmd).startswith(k)), [])
            if cmd[0] == "rh3dgs":  # the same entry point, in this process (saves a Python start-up)
                assert main([*cmd[1:], *extra]) == 0, cmd
            elif cmd[:2] == ["python", "-c"]:
                exec(compile(cmd[2], "<README>", "exec"), {})
            else:
                exe = shutil.which(cmd[0], path=env["PATH"])
                r = subprocess.run([exe, *cmd[1:], *extra], cwd=root, env=env, capture_output=True, text=True,
                                   timeout=600)
                assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-3000:])
    finally:
        os.chdir(cwd)
    cfg = Path("outputs/synth/rh3dgs-lite/run/config.yml")
    assert (root / cfg).is_file()
    from rh3dgs.io.nerfstudio_run import load_run_config

    assert load_run_config(root / cfg).pipeline.datamanager.data == Path("data/synth")  # stored as typed
    return root, cfg


def _red_ball_mask(data: Path, view: str) -> np.ndarray:
    from PIL import Image

    classes = (data / "classes.txt").read_text().split("\n")
    return np.asarray(Image.open(data / "masks" / f"{view}.png")) == classes.index("red ball")


def test_load_and_query_the_run_from_any_working_folder(run, monkeypatch, tmp_path):
    root, cfg = run
    monkeypatch.chdir(root)
    scene = rh3dgs.load(cfg)  # the README's call, relative to the folder ns-train ran in
    assert scene.cameras is not None and len(scene.cameras) == 8
    rel = scene.render_relevancy(0, ["red ball"])
    assert rel.shape == (1, 64, 64)
    ball = torch.from_numpy(_red_ball_mask(root / "data/synth", scene.cameras.names[0]))
    assert ball.sum() > 20
    assert float(rel[0][ball].mean()) > float(rel[0][~ball].mean()) + 0.05  # it points at the ball
    # from another folder: the same cameras, teacher and answer (cameras were read against the working
    # directory and the teacher's features against the run folder)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    other = rh3dgs.load(root / cfg)
    assert other.cameras is not None and torch.equal(other.cameras.viewmats, scene.cameras.viewmats)
    torch.testing.assert_close(other.render_relevancy(0, ["red ball"]), rel)


def test_query_view_export_on_the_run(run, monkeypatch, capsys):
    from PIL import Image

    from rh3dgs.io.ply import load_ply
    from rh3dgs.viewer.server import Viewer, ViewerConfig

    root, cfg = run
    monkeypatch.chdir(root)
    # rh3dgs query: one result sheet per view
    assert main(["query", str(cfg), "red ball;blue box", "--views", "0", "--output", "queries"]) == 0
    sheet = np.asarray(Image.open(root / "queries" / "sheets" / "frame_00000.png"))
    assert sheet.shape[1] > 4 * 64 and sheet.std() > 20
    assert (root / "queries" / "red_ball.ply").is_file()
    # rh3dgs view: the page for the run, on this machine only
    scene = rh3dgs.load(cfg)
    viewer = Viewer(scene, ViewerConfig(port=0, output_dir=root / "viewer_out"))
    try:
        url = viewer.start()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
        assert listen_addresses(int(url.rsplit(":", 1)[1])) == ["127.0.0.1"]
    finally:
        viewer.stop()
    # rh3dgs export: the dataset's frame (the Gaussians rh3dgs.load gives, lined up with the cameras)
    assert main(["export", str(cfg), "--output", "mine.ply"]) == 0
    back = load_ply(root / "mine.ply")
    assert torch.equal(back.means, scene.gaussians.means)


def test_lift_of_an_ns_export_frame_ply_is_mapped_back_or_refused(run, monkeypatch, capsys):
    """The run's Gaussians in nerfstudio's normalised frame (what ns-export gaussian-splat writes)."""
    from dataclasses import replace

    from rh3dgs.io.nerfstudio_run import load_nerfstudio_scene
    from rh3dgs.io.ply import save_ply

    root, cfg = run
    monkeypatch.chdir(root)
    g_ns, _, _, _ = load_nerfstudio_scene(cfg, frame="nerfstudio")
    g_data = rh3dgs.load(cfg).gaussians
    Path("exports").mkdir()
    save_ply("exports/splat.ply", replace(g_ns, latents=None), plain=True)
    capsys.readouterr()
    # alone: refused before any work, one line naming the PLY, the frame and the way out
    assert main(["lift", "exports/splat.ply", "--data", "data/synth", "--output", "lifted"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exports/splat.ply" in err[0] and "nerfstudio's normalised frame" in err[0], err
    assert "rh3dgs export" in err[0] and not Path("lifted").exists()
    # with the run's dataparser_transforms.json next to it: mapped to the dataset's frame and lifted
    shutil.copy(cfg.parent / "dataparser_transforms.json", "exports/")
    assert main(["lift", "exports/splat.ply", "--data", "data/synth", "--output", "lifted"]) == 0
    assert "in the nerfstudio frame, mapped to the dataset's" in capsys.readouterr().out
    lifted = rh3dgs.load("lifted")
    assert (lifted.gaussians.means - g_data.means).abs().max() < 1e-4
    assert int(lifted.select("red ball").sum()) > 0
