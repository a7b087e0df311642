"""The ``rh3dgs`` command line.

    rh3dgs demo   [--output DIR]            synthetic scene -> renders (+ lift and queries)
    rh3dgs synth  --output DIR [--seed S]   write a labelled synthetic nerfstudio dataset
    rh3dgs render SCENE.ply --transforms T  render a PLY from the cameras of a transforms.json

User errors (rh3dgs.errors) are printed as one line without a traceback; ``--debug``
shows the traceback.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List, Optional

from .errors import Rh3dgsError

__all__ = ["main"]


def _save_render_pngs(result, names: List[str], out_dir: Path, start: int = 0) -> List[Path]:
    """Write RGB, depth and alpha PNGs of a RenderResult; returns the RGB paths."""
    import torch

    from .io.atomic import atomic_save_png
    from .viz import colorize

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for b in range(result.alpha.shape[0]):
        name = names[start + b]
        rgb = (result.rgb[b].clamp(0, 1) * 255).round().to(torch.uint8).numpy()
        atomic_save_png(out_dir / f"{name}_rgb.png", rgb)
        d = torch.where(result.alpha[b] > 0.5, result.depth[b], torch.zeros_like(result.depth[b]))
        atomic_save_png(out_dir / f"{name}_depth.png", colorize(d, mask=result.alpha[b] > 0.5))
        atomic_save_png(out_dir / f"{name}_alpha.png", (result.alpha[b].clamp(0, 1) * 255).round().to(torch.uint8).numpy())
        written.append(out_dir / f"{name}_rgb.png")
    return written


def cmd_synth(args) -> int:
    from .data.synthetic import SceneConfig, make_scene, write_dataset

    cfg = SceneConfig(seed=args.seed, num_views=args.views, image_size=args.size)
    scene = make_scene(cfg)
    paths = write_dataset(scene, args.output)
    print(f"wrote a synthetic dataset with {len(scene.gaussians)} Gaussians, {len(scene.cameras)} views, "
          f"classes {scene.class_names} to {paths['root']}")
    return 0


def cmd_render(args) -> int:
    import torch

    from .io.ply import load_ply
    from .io.transforms import load_transforms
    from .render import render

    gaussians = load_ply(args.scene)
    cams, images = load_transforms(args.transforms, check_images=False)
    names = [p.stem for p in images]
    out = Path(args.output)
    for i in range(len(cams)):
        with torch.no_grad():
            r = render(gaussians, cams[i])
        _save_render_pngs(r, names, out, start=i)
    print(f"rendered {len(cams)} views of {len(gaussians)} Gaussians to {out}")
    return 0


def cmd_demo(args) -> int:
    import torch

    from .data.synthetic import SceneConfig, make_scene, write_dataset
    from .render import render

    t0 = time.time()
    out = Path(args.output)
    cfg = SceneConfig(seed=args.seed, num_views=args.views, image_size=args.size)
    scene = make_scene(cfg)
    data = write_dataset(scene, out / "data")
    print(f"[1/2] synthetic scene: {len(scene.gaussians)} Gaussians, {len(scene.cameras)} views -> {data['root']}")
    renders = out / "renders"
    for i in range(len(scene.cameras)):
        with torch.no_grad():
            r = render(scene.gaussians, scene.cameras[i])
        _save_render_pngs(r, scene.cameras.names, renders, start=i)
    print(f"[2/2] renders (RGB, depth, alpha PNGs) -> {renders}")
    extra = _demo_semantic(scene, out, args) if not args.no_semantic else None
    print(f"done in {time.time() - t0:.1f} s. Results: {out.resolve()}")
    if extra:
        print(extra)
    return 0


def _demo_semantic(scene, out: Path, args) -> Optional[str]:
    """Lift simulated teacher features and answer text queries (when the method modules exist)."""
    try:
        from . import demo_semantic
    except ImportError:
        return None
    return demo_semantic.run(scene, out, args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rh3dgs", description="Robust open-vocabulary semantic 3D Gaussian Splatting")
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="run the main job on the embedded synthetic scene")
    d.add_argument("--output", default="outputs/demo", help="output folder")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--views", type=int, default=12)
    d.add_argument("--size", type=int, default=128, help="image side in pixels")
    d.add_argument("--no-semantic", action="store_true", help="only render, skip lift and queries")
    d.set_defaults(func=cmd_demo)

    s = sub.add_parser("synth", help="write a labelled synthetic nerfstudio dataset")
    s.add_argument("--output", required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--views", type=int, default=12)
    s.add_argument("--size", type=int, default=128)
    s.set_defaults(func=cmd_synth)

    r = sub.add_parser("render", help="render a 3DGS PLY from the cameras of a transforms.json")
    r.add_argument("scene", help="INRIA-format 3DGS PLY")
    r.add_argument("--transforms", required=True, help="nerfstudio transforms.json (or its folder)")
    r.add_argument("--output", required=True)
    r.set_defaults(func=cmd_render)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except Rh3dgsError as exc:
        if args.debug:
            raise
        print(f"rh3dgs: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
