"""``rh3dgs view PATH``: serve a scene in the browser with text queries.

The command is the dataclass :class:`View` (a subcommand of ``rh3dgs.cli.Rh3dgs``); its server options are
:class:`rh3dgs.viewer.server.ViewerConfig`'s fields (``--output`` is its ``output_dir``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from tyro.conf import Positional, arg

from ..presets import as_config
from .server import ViewerConfig

__all__ = ["View", "ViewerOptions", "cmd_view"]


@dataclass
class ViewerOptions(ViewerConfig):
    """ViewerConfig with output_dir as --output."""

    output_dir: Annotated[Path, arg(name="output", help="folder the export button writes selections to")] = \
        ViewerConfig.output_dir


@dataclass
class View:
    """Text-query viewer in the browser (viser): heat maps, 3D selection and export of a scene."""

    path: Annotated[str, Positional, arg(metavar="PATH")]
    """semantic scene folder / rh3dgs.json / 3DGS .ply"""
    viewer: Annotated[ViewerOptions, arg(name="")] = field(default_factory=ViewerOptions)
    device: str = "auto"
    """auto (cuda if available), cpu, cuda, cuda:N"""

    def main(self) -> int:
        return cmd_view(self)


def _device(name: str):
    import torch

    from ..errors import ConfigError

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this machine (use --device cpu)")
    return name


def cmd_view(args) -> int:
    from ..api import load
    from ..io.outputs import check_not_input, scene_inputs
    from .server import Viewer

    cfg = as_config(ViewerConfig, args.viewer)
    check_not_input(cfg.output_dir, scene_inputs(args.path))  # the export button's folder
    scene = load(args.path, device=_device(args.device))
    viewer = Viewer(scene, cfg)
    url = viewer.start()
    semantic = "semantic field: yes" if scene.field is not None else "no semantic field: RGB only, queries off"
    print(f"rh3dgs view: {args.path} ({len(scene):,} Gaussians, {semantic}) on {scene.gaussians.device.type}",
          flush=True)
    print(f"rh3dgs view: open {url}  (selections export to {cfg.output_dir}; Ctrl-C to stop)", flush=True)
    viewer.serve_forever()
    return 0
