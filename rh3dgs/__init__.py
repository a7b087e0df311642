"""rh3dgs: robust open-vocabulary semantic 3D Gaussian Splatting (Rh-3DGS, ICML 2026).

Importing rh3dgs is cheap and silent: heavy modules (rendering, the native extension,
gsplat, open_clip, nerfstudio) load on first use.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

from . import _moved
from .cameras import Cameras
from .errors import Rh3dgsError
from .gaussians import Gaussians

_moved.install()  # module paths from before the regrouping (config.yml files of older runs name them)

# name -> module that defines it; resolved lazily (PEP 562)
_LAZY = {
    "render": "rh3dgs.rendering",
    "RenderResult": "rh3dgs.rendering",
    "load_ply": "rh3dgs.io.ply",
    "save_ply": "rh3dgs.io.ply",
    "load_transforms": "rh3dgs.io.transforms",
    "lift": "rh3dgs.lifting",
    "load": "rh3dgs.api",
    "Scene": "rh3dgs.api",
    "save_scene": "rh3dgs.io.scene",
}

__all__ = ["Cameras", "Gaussians", "Rh3dgsError", "__version__", *_LAZY]


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rh3dgs' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # pragma: no cover
    from .io.ply import load_ply, save_ply  # noqa: F401
    from .io.transforms import load_transforms  # noqa: F401
    from .api import Scene, load  # noqa: F401
    from .io.scene import save_scene  # noqa: F401
    from .lifting import lift  # noqa: F401
    from .rendering import RenderResult, render  # noqa: F401
