"""Interactive text-query viewer (``rh3dgs view``) on viser.

- :mod:`rh3dgs.viewer.controls`: query parsing, relevancy / heat-map / overlay output, 3D
  selection and export, independent of viser, plus a thin viser binding (shared with the
  nerfstudio viewer plugin).
- :mod:`rh3dgs.viewer.camera`: viser camera state <-> :class:`rh3dgs.Cameras`.
- :mod:`rh3dgs.viewer.server`: the viser server with its per-client render loop.
- :mod:`rh3dgs.viewer.cli`: the ``rh3dgs view`` command (:class:`~rh3dgs.viewer.cli.View`, over :class:`ViewerConfig`).

Importing this package does not import viser; :class:`~rh3dgs.viewer.server.Viewer` does on start.
"""
from __future__ import annotations

__all__ = ["Viewer", "ViewerConfig"]


def __getattr__(name: str):
    if name in __all__:
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module 'rh3dgs.viewer' has no attribute {name!r}")
