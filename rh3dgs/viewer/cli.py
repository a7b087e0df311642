"""``rh3dgs view PATH``: serve a scene in the browser with text queries.

Hook into ``rh3dgs/cli.py``'s ``build_parser`` with::

    from .viewer.cli import add_view_parser
    add_view_parser(sub)
"""
from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_view_parser", "cmd_view"]


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
    from .server import Viewer, ViewerConfig

    check_not_input(args.output, scene_inputs(args.path))  # the export button's folder
    scene = load(args.path, device=_device(args.device))
    cfg = ViewerConfig(host=args.host, port=args.port, max_res=args.max_res, moving_res=args.moving_res,
                       output_dir=Path(args.output))
    viewer = Viewer(scene, cfg)
    url = viewer.start()
    semantic = "semantic field: yes" if scene.field is not None else "no semantic field: RGB only, queries off"
    print(f"rh3dgs view: {args.path} ({len(scene):,} Gaussians, {semantic}) on {scene.gaussians.device.type}",
          flush=True)
    print(f"rh3dgs view: open {url}  (selections export to {cfg.output_dir}; Ctrl-C to stop)", flush=True)
    viewer.serve_forever()
    return 0


def add_view_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``view`` subcommand to ``rh3dgs``'s subparsers (sets ``func=cmd_view``)."""
    v = subparsers.add_parser("view", help="interactive text-query viewer in the browser (viser)",
                              description="Serve a scene (semantic scene folder, its rh3dgs.json, or a 3DGS .ply) "
                                          "in the browser: RGB, text-query heat maps, 3D selection and export.")
    v.add_argument("path", help="semantic scene folder / rh3dgs.json / 3DGS .ply")
    v.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only; "
                                                       "e.g. 0.0.0.0 exposes the viewer to the network, with a warning)")
    v.add_argument("--port", type=int, default=8080, help="TCP port (0: any free port)")
    v.add_argument("--output", default="outputs/view", help="folder the export button writes selections to")
    v.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    v.add_argument("--max-res", type=int, default=None, help="long side of still frames (default 512 CPU, 1024 CUDA)")
    v.add_argument("--moving-res", type=int, default=None, help="long side while the camera moves (default max/2)")
    v.set_defaults(func=cmd_view)
    return v
