"""Text queries in nerfstudio's viewer (rh3dgs.nerfstudio.viewer.TextQueryPanel, ``model.text_query``).

Fast tests check the model side without a browser: the elements nerfstudio's viewer discovers, the
outputs ``relevancy_<i>`` / ``composited`` against :mod:`rh3dgs.viewer.controls`, the 3D selection and its
count, the teacher hook. The slow test trains ``rh3dgs-lite`` briefly, starts ``ns-viewer`` on 127.0.0.1
and drives it in headless Debian chromium (playwright-core, ``tests/browser/drive_ns_viewer.js``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from _browser import decode_turbo, require_browser, run_driver, stop_server
import torch

pytest.importorskip("nerfstudio")
pytest.importorskip("gsplat")

from rh3dgs.nerfstudio import METHOD_CONFIGS_ENV  # noqa: E402
from rh3dgs.viewer import controls as C  # noqa: E402
from _scenes import synthetic_dataset

VENV_BIN = Path(sys.executable).parent


def _make_dataset(root: Path, views: int, size: int, density: float) -> Path:
    return synthetic_dataset(root, views, size, density)


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    """A tiny rh3dgs-lite pipeline (eval mode), latents initialised by the lift (meaningful relevancy)."""
    from rh3dgs.nerfstudio.config import rh3dgs_lite_config

    root = tmp_path_factory.mktemp("nsv")
    data = _make_dataset(root / "scene", views=6, size=32, density=800.0)
    c = rh3dgs_lite_config()
    c.pipeline.datamanager.data = data
    c.pipeline.datamanager.teacher_cache_dir = root / "cache"
    c.pipeline.model.max_init_points = 1500
    c.pipeline.model.init = "lift"
    p = c.pipeline.setup(device="cpu", test_mode="val")
    p.model.eval()
    return p


@pytest.fixture
def panel(pipe):
    """The model's panel, set back to its defaults after each test."""
    tq = pipe.model.text_query
    tq.set_teacher_spec(pipe.datamanager.teacher_spec())
    yield tq
    tq.q1_positives.value = ""
    tq.q2_negatives.value = C.DEFAULT_NEGATIVES
    tq.q3_threshold.value = 0.5
    tq.q4_shown.set_options([C.SHOW_ALL])
    tq.q4_shown.value = C.SHOW_ALL
    tq.q5_show_selection.value = True
    pipe.model.eval()


def _camera(pipe, i=0):
    return pipe.datamanager.train_dataset.cameras[i: i + 1]


def _class_mask(pipe, i: int, cls: str) -> torch.Tensor:
    """bool [H, W]: ground-truth pixels of class ``cls`` in training view ``i`` (synthetic dataset masks)."""
    from PIL import Image

    data = Path(pipe.datamanager.config.data)
    classes = (data / "classes.txt").read_text().split("\n")
    name = Path(pipe.datamanager.train_dataset._dataparser_outputs.image_filenames[i]).stem
    return torch.from_numpy(np.asarray(Image.open(data / "masks" / f"{name}.png")) == classes.index(cls))


def _best_view(pipe, cls: str = "red ball") -> int:
    """The training view showing the most of ``cls``."""
    n = len(pipe.datamanager.train_dataset)
    return max(range(n), key=lambda i: int(_class_mask(pipe, i, cls).sum()))


def _encode(pipe, texts):
    from rh3dgs.teachers import teacher_from_spec

    return torch.nn.functional.normalize(teacher_from_spec(pipe.datamanager.teacher_spec()).encode_text(texts), dim=-1)


# ---------------------------------------------------------------------------- discovery
def test_elements_are_discovered_by_nerfstudio_in_display_order(pipe):
    from nerfstudio.viewer.utils import parse_object
    from nerfstudio.viewer.viewer_elements import ViewerControl, ViewerElement

    from rh3dgs.nerfstudio.viewer import TextQueryPanel

    elems = parse_object(pipe, ViewerElement, "Custom Elements")
    ours = [(path, e) for path, e in elems if "/text_query/" in path]
    assert [e.name for _, e in ours] == ["Positives", "Negatives", "Threshold", "Show", "Show selection",
                                         "Selection status"]
    assert all(path.startswith("Custom Elements/model/text_query/") for path, _ in ours)
    tq = pipe.model.text_query
    assert isinstance(tq, TextQueryPanel)
    assert tq.q2_negatives.value == "object;things;stuff;texture"
    assert tq.q1_positives.value == "" and tq.q3_threshold.value == 0.5
    ctrl = [e for _, e in parse_object(pipe, ViewerControl, "Custom Elements")]
    assert tq.q7_teacher in ctrl
    # no parameters / buffers: the checkpoint layout is unchanged
    assert not any("text_query" in k for k in pipe.model.state_dict())


def test_viewer_setup_hands_the_datamanager_teacher_to_the_panel(pipe):
    from rh3dgs.nerfstudio.viewer import TextQueryPanel

    tq = TextQueryPanel(pipe.model)
    assert not tq.has_text_encoder
    with pytest.raises(Exception, match="no text encoder"):
        tq.encode(["red ball"])
    tq.q7_teacher._setup(SimpleNamespace(pipeline=pipe, viser_server=None))
    assert tq.has_text_encoder
    got = tq.encode(["red ball", "blue box"])
    assert torch.allclose(got, _encode(pipe, ["red ball", "blue box"]), atol=1e-6)
    assert tq.encode([]).shape == (0, pipe.model.decoder.shape[0])


# ---------------------------------------------------------------------------- outputs
def test_no_query_no_extra_outputs_and_never_while_training(pipe, panel):
    m = pipe.model
    out = m.get_outputs_for_camera(_camera(pipe))
    assert not any(k.startswith("relevancy_") for k in out) and "composited" not in out
    panel.q1_positives.value = "red ball"
    m.train()
    cam, _ = pipe.datamanager.next_train(0)
    with torch.no_grad():  # no optimizers here: keep the densification strategy out of it
        out = m(cam)
    assert not any(k.startswith("relevancy_") for k in out) and "composited" not in out
    m.eval()


def test_query_outputs_equal_controls_relevancy_and_overlay(pipe, panel):
    m = pipe.model
    panel.q1_positives.value = " red ball ; blue box;red ball"  # parsed like rh3dgs view: 2 queries
    panel.q5_show_selection.value = False
    out = m.get_outputs_for_camera(_camera(pipe))
    assert {"relevancy_0", "relevancy_1", "composited"} <= set(out) and "relevancy_2" not in out
    H, W = out["rgb"].shape[:2]
    assert out["relevancy_0"].shape == (H, W, 1) and out["composited"].shape == (H, W, 3)
    # the same numbers as controls.relevancy_maps (= Scene.render_relevancy) on this render
    pos = _encode(pipe, ["red ball", "blue box"])
    neg = _encode(pipe, list(C.parse_queries(C.DEFAULT_NEGATIVES)))
    alpha = out["accumulation"][..., 0]
    ref = C.relevancy_maps(m.semantic_field(), out["latents"], alpha, pos, neg)
    got = torch.cat([out["relevancy_0"], out["relevancy_1"]], -1).permute(2, 0, 1)
    assert torch.allclose(got, ref, atol=1e-5)
    assert float(got.min()) >= 0 and float(got.max()) <= 1
    assert float(got[:, alpha < C.MIN_ALPHA].abs().sum()) == 0
    # composited = controls' overlay (max over the queries, threshold 0.5), exactly
    img = C.compose_output(C.OUTPUT_OVERLAY, out["rgb"], C.heat_map(ref), alpha, 0.5)
    assert np.array_equal((out["composited"] * 255).round().to(torch.uint8).numpy(), img)
    # "Show" picks one query for the composite; its options follow the positives
    panel._on_queries()
    assert panel.q4_shown.options == [C.SHOW_ALL, "red ball", "blue box"]
    panel.q4_shown.value = "blue box"
    out = m.get_outputs_for_camera(_camera(pipe))
    img = C.compose_output(C.OUTPUT_OVERLAY, out["rgb"], ref[1], alpha, 0.5)
    assert np.array_equal((out["composited"] * 255).round().to(torch.uint8).numpy(), img)


def test_relevancy_points_at_the_red_ball(pipe, panel):
    """Direction: the red ball's pixels (ground-truth mask of the synthetic view) are the hot ones."""
    m = pipe.model
    panel.q1_positives.value = "red ball"
    i = _best_view(pipe)
    out = m.get_outputs_for_camera(_camera(pipe, i))
    ball = _class_mask(pipe, i, "red ball")
    rel = out["relevancy_0"][..., 0]
    fg = out["accumulation"][..., 0] > 0.5
    assert ball.sum() > 10
    assert float(rel[ball & fg].median()) > float(rel[~ball & fg].median()) + 0.03


def test_selection_count_and_tint(pipe, panel):
    m = pipe.model
    i = _best_view(pipe)
    panel.q1_positives.value = "red ball"
    panel.q3_threshold.value = 0.52  # not the default; this 32 px lift tops out near 0.55
    out = m.get_outputs_for_camera(_camera(pipe, i))
    pos = _encode(pipe, ["red ball"])
    neg = _encode(pipe, list(C.parse_queries(C.DEFAULT_NEGATIVES)))
    sel = C.select_gaussians(m.semantic_field().gaussian_relevancy(pos, neg), 0.52)
    n = int(sel.sum())
    assert 0 < n < m.num_points
    assert panel.q6_status.content == (f"**Selection**: {n:,} of {m.num_points:,} Gaussians above 0.52 "
                                       f"for 'red ball'")
    # the tint: composited = overlay blended with magenta by the selected fraction of each pixel
    from rh3dgs.nerfstudio.viewer import SELECTION_TINT_STRENGTH, tint

    panel.q5_show_selection.value = False
    plain = m.get_outputs_for_camera(_camera(pipe, i))["composited"]
    panel.q5_show_selection.value = True
    tinted = out["composited"]
    from rh3dgs.rendering import render

    g = m.gaussians_for_render(detach=True)
    from rh3dgs.nerfstudio.pipeline import train_cameras_as_rh3dgs

    cams = train_cameras_as_rh3dgs(_camera(pipe, i))
    frac = render(g, cams, sel.float()[:, None], rgb=False).features[0].clamp(0, 1)
    assert torch.allclose(tinted, tint(plain, frac), atol=2e-3)
    changed = (tinted - plain).abs().sum(-1) > 0.05
    assert changed.any() and bool((frac[..., 0][changed] > 0).all())
    mag = tinted[changed]
    assert float((mag[:, 0] + mag[:, 2] - 2 * mag[:, 1]).mean()) > float(
        (plain[changed][:, 0] + plain[changed][:, 2] - 2 * plain[changed][:, 1]).mean())  # more magenta
    assert SELECTION_TINT_STRENGTH > 0


def test_unknown_query_reports_instead_of_raising(pipe, panel):
    m = pipe.model
    panel.q1_positives.value = "no such thing"
    out = m.get_outputs_for_camera(_camera(pipe))
    assert "composited" not in out and "rgb" in out
    assert panel.q6_status.content.startswith("**Query error**") and "no such thing" in panel.q6_status.content


def test_threshold_outside_its_range_is_refused_and_reset(pipe, panel, capsys):
    """A slider value the GUI does not offer (a crafted message): one line, the last good state is kept."""
    panel.q3_threshold.value = 0.3
    assert panel.state().threshold == 0.3
    capsys.readouterr()
    panel.q3_threshold.value = 5.0
    st = panel.state()
    err = capsys.readouterr().err.strip().splitlines()
    assert st.threshold == 0.3 and panel.q3_threshold.value == 0.3
    assert len(err) == 1 and err[0].startswith("rh3dgs: viewer: ignored") and "threshold" in err[0], err
    panel.q3_threshold.value = 0.5


def test_live_viewer_follows_the_training_field(pipe, panel):
    """During training the field changes every step: the panel's controls (per-Gaussian relevancy and
    selection) are rebuilt, the text encodings are not re-run."""
    m = pipe.model
    panel.q1_positives.value = "red ball"
    m.get_outputs_for_camera(_camera(pipe))
    ctl = panel.controls()
    calls = []
    enc = panel.encode
    panel.encode = lambda texts: calls.append(tuple(texts)) or enc(texts)  # instance attribute shadows
    try:
        old = m.latents.data.clone()
        with torch.no_grad():
            m.latents.mul_(-1.0)  # in place, as the optimizer does
        m.step += 1
        ctl2 = panel.controls()
        assert ctl2 is not ctl
        out = m.get_outputs_for_camera(_camera(pipe))
        assert "relevancy_0" in out
        with torch.no_grad():
            m.latents.copy_(old)
        m.step -= 1
    finally:
        del panel.encode
    assert ctl2.field.latents.data_ptr() == m.latents.data_ptr()


# ---------------------------------------------------------------------------- browser (slow)
def _ns_env() -> dict:
    from importlib.metadata import entry_points

    env = dict(os.environ)
    if not {"rh3dgs", "rh3dgs-lite"} <= set(entry_points(group="nerfstudio.method_configs").names):
        env["NERFSTUDIO_METHOD_CONFIGS"] = METHOD_CONFIGS_ENV
    env.setdefault("OMP_NUM_THREADS", str(max(1, min(2, os.cpu_count() or 1))))
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _turbo_lut():
    import matplotlib

    x = np.linspace(0, 1, 256)
    return x, matplotlib.colormaps["turbo"](x)[:, :3] * 255  # nerfstudio's colormaps use matplotlib's turbo


@pytest.mark.slow
def test_ns_viewer_text_query_in_headless_chromium(tmp_path):
    from PIL import Image

    chromium = require_browser()
    env = _ns_env()
    data = _make_dataset(tmp_path / "scene", views=8, size=64, density=6000.0)
    out = tmp_path / "outputs"
    cmd = [str(VENV_BIN / "ns-train"), "rh3dgs-lite", "--machine.device-type", "cpu", "--vis", "tensorboard",
           "--output-dir", str(out), "--experiment-name", "synth", "--timestamp", "run",
           "--max-num-iterations", "60", "--pipeline.model.init", "lift",
           "--pipeline.datamanager.teacher-cache-dir", str(tmp_path / "cache"), "--data", str(data)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    cfg = out / "synth" / "rh3dgs-lite" / "run" / "config.yml"
    assert cfg.is_file()

    port = _free_port()
    log = open(tmp_path / "ns-viewer.log", "w")
    proc = subprocess.Popen([str(VENV_BIN / "ns-viewer"), "--load-config", str(cfg), "--viewer.websocket-port",
                             str(port)],  # no host flag: the default must be 127.0.0.1 (nerfstudio's is 0.0.0.0)
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        t0 = time.time()
        while True:
            assert proc.poll() is None, (tmp_path / "ns-viewer.log").read_text()[-4000:]
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert time.time() - t0 < 180, "ns-viewer did not listen:\n" + (tmp_path / "ns-viewer.log").read_text()
                time.sleep(1)
        # bound to this machine only
        listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout \
            if shutil.which("ss") else ""
        if listening:
            binds = [ln.split()[3] for ln in listening.splitlines() if ln.split()[3].endswith(f":{port}")]
            assert binds and all(b.startswith("127.0.0.1:") for b in binds), binds
        shots = tmp_path / "shots"
        res = run_driver("drive_ns_viewer.js", [f"http://127.0.0.1:{port}", shots, "red ball"], chromium, 600)
    finally:
        stop_server(proc, 15)
        log.close()
    print("drive_ns_viewer:", json.dumps(res))

    # the query's outputs are offered in nerfstudio's Output type dropdown
    assert "relevancy_0" in res["options"] and "composited" in res["options"], res["options"]
    assert not any(o.startswith("relevancy_") or o == "composited" for o in res["options_before"])
    assert re.search(r"Selection.*\d+ of [\d,]+ Gaussians above 0\.50 for 'red ball'", res["status"]), res["status"]

    rgb = np.asarray(Image.open(shots / "rgb.png").convert("RGB"))
    rel = np.asarray(Image.open(shots / "relevancy.png").convert("RGB"))
    comp = np.asarray(Image.open(shots / "composited.png").convert("RGB"))
    H, W = rgb.shape[:2]
    canvas = np.zeros((H, W), bool)
    b = res["canvas"]  # the part of the page left of the GUI panel
    canvas[int(b["y"]):int(b["y"] + b["height"]), int(b["x"]):int(b["x"] + b["width"])] = True
    canvas[H - 80:, :80] = False  # axes gizmo

    value, dist = decode_turbo(rel, _turbo_lut())
    turbo_px = canvas & (dist < 30)
    assert turbo_px.mean() > 0.3, "the relevancy output (turbo) did not appear"
    # direction: the red ball of the no-query view is hot, the rest of the scene is not
    r, g, bl = (rgb[..., i].astype(int) for i in range(3))
    ball = canvas & (r > 120) & (g < 90) & (bl < 90) & turbo_px
    scene_px = canvas & (rgb.astype(int).sum(-1) > 60) & turbo_px & ~ball
    assert ball.sum() > 200, f"red ball not in view ({ball.sum()} px)"
    assert np.median(value[ball]) > 0.5 and np.median(value[ball]) > np.median(value[scene_px]) + 0.15, (
        np.median(value[ball]), np.median(value[scene_px]))
    # composited: the ball changed (turbo overlay + selection tint), most of the rest did not
    changed = np.abs(comp.astype(int) - rgb.astype(int)).sum(-1) > 40
    assert changed[ball].mean() > 0.5 and changed[scene_px].mean() < 0.35, (changed[ball].mean(),
                                                                             changed[scene_px].mean())
