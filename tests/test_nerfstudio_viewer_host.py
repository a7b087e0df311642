"""Every rh3dgs nerfstudio model binds nerfstudio's viewer to 127.0.0.1 (semantics off included).

nerfstudio's viewer asks viser for ``ViewerConfig.websocket_host``; ``ns-viewer --load-config`` replaces
the run's viewer config with its own defaults (0.0.0.0). Building any rh3dgs model installs
:mod:`rh3dgs.viewer.guard` (:func:`rh3dgs.nerfstudio.viewer.install_viewer_guard`), which binds 127.0.0.1
unless ``--viewer.websocket-host`` names another address (the guard's own rule: tests/test_viewer_guard.py).
The real ``ns-viewer --load-config`` on a trained run, without a host flag: the slow
tests/test_nerfstudio_viewer.py::test_ns_viewer_text_query_in_headless_chromium (its ``ss`` check).
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("nerfstudio")

from nerfstudio.data.scene_box import SceneBox  # noqa: E402

from rh3dgs.nerfstudio import viewer as ns_viewer  # noqa: E402
from rh3dgs.nerfstudio.model import Rh3dgsModelConfig  # noqa: E402


@pytest.mark.parametrize("semantics", [False, True])
def test_every_rh3dgs_model_installs_the_viewer_guard(semantics, monkeypatch):
    calls = []
    monkeypatch.setattr(ns_viewer, "install_viewer_guard", lambda argv=None: calls.append(argv))
    cfg = Rh3dgsModelConfig(semantics=semantics, background_color="black", latent_dim=4)
    g = torch.Generator().manual_seed(0)
    m = cfg.setup(scene_box=SceneBox(aabb=torch.tensor([[-1.0] * 3, [1.0] * 3])), num_train_data=2, metadata={},
                  seed_points=((torch.rand(50, 3, generator=g) - 0.5), (torch.rand(50, 3, generator=g) * 255).byte()))
    assert type(m).__name__ == ("Rh3dgsModel" if semantics else "SplatfactoNativeModel")
    assert calls, "building the model did not install the viewer guard"
