"""Servers bind 127.0.0.1 by default (the viewer, rh3dgs/viewer/, owned by another engineer)."""
import inspect

import pytest


def test_viewer_binds_localhost_by_default():
    server = pytest.importorskip("rh3dgs.viewer.server")
    from rh3dgs.cli import parse

    assert server.ViewerConfig().host == "127.0.0.1"
    assert parse(["view", "scene"]).command.viewer.host == "127.0.0.1"
    # nothing in the package binds every interface by default
    import rh3dgs.viewer.server as s

    assert '"0.0.0.0"' not in inspect.getsource(s).split("class ViewerConfig")[1].split("def ")[0]


def test_nerfstudio_methods_bind_the_viewer_to_localhost():
    pytest.importorskip("nerfstudio")
    from rh3dgs.nerfstudio.config import rh3dgs_lite_method, rh3dgs_method

    for spec in (rh3dgs_method, rh3dgs_lite_method):
        assert spec.config.viewer.websocket_host == "127.0.0.1"
