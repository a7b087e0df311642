"""Every rh3dgs nerfstudio method binds nerfstudio's viewer to 127.0.0.1 (the plain splatfacto twin included).

nerfstudio's viewer asks viser for ``ViewerConfig.websocket_host``; ``ns-viewer --load-config`` replaces
the run's viewer config with its own defaults (0.0.0.0). The rh3dgs pipeline installs :mod:`rh3dgs.viewer.guard`
(:func:`rh3dgs.nerfstudio.viewer.install_viewer_guard`) before anything else: ``ns-train``'s trainer and
``ns-viewer`` both build the pipeline before the viewer's server. The guard binds 127.0.0.1 unless
``--viewer.websocket-host`` names another address (its own rule: tests/test_viewer_guard.py). The real
``ns-viewer --load-config`` on a trained run, without a host flag: the slow
tests/test_nerfstudio_viewer.py::test_ns_viewer_text_query_in_headless_chromium (its ``ss`` check).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("nerfstudio")
pytest.importorskip("gsplat")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_nerfstudio import _make_dataset  # noqa: E402  (the nerfstudio tests' helpers)

from rh3dgs.nerfstudio import pipeline as ns_pipeline  # noqa: E402
from rh3dgs.nerfstudio.config import rh3dgs_lite_config, splatfacto_native_lite_config  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return _make_dataset(tmp_path_factory.mktemp("guard") / "scene", views=4, size=16, density=300.0)


@pytest.mark.parametrize("make", [rh3dgs_lite_config, splatfacto_native_lite_config], ids=lambda f: f.__name__)
def test_every_rh3dgs_pipeline_installs_the_viewer_guard_first(make, data, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(ns_pipeline, "install_viewer_guard", lambda argv=None: calls.append(argv))
    c = make()
    c.pipeline.datamanager.data = data
    c.pipeline.datamanager.teacher_cache_dir = tmp_path / "cache"
    pipe = c.pipeline.setup(device="cpu", test_mode="test")  # as ns-viewer / ns-eval build it (no training init)
    assert type(pipe.model).__name__ == ("Rh3dgsModel" if make is rh3dgs_lite_config else "SplatfactoNativeModel")
    assert calls == [None], "building the pipeline did not install the viewer guard"
