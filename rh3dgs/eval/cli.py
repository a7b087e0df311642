"""``rh3dgs eval``: score a semantic scene against ground truth, or run the synthetic ablation suite.

    rh3dgs eval SCENE --data DATASET [--output DIR]          one scene folder vs masks/ + classes.txt
    rh3dgs eval --suite synthetic [--quick] [--output DIR]    the ablation table (results.json/.md + PNGs)

Hook into the main parser with :func:`add_eval_parser` (``rh3dgs.cli.build_parser``).
"""
from __future__ import annotations

import argparse
import math

from ..errors import ConfigError
from ..io.outputs import check_output_dir, check_output_file, prepare_output_dir, scene_inputs

__all__ = ["add_eval_parser", "cmd_eval"]


def _ints(text: str):
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``eval`` sub-command to an argparse ``subparsers`` object; returns its parser."""
    e = subparsers.add_parser(
        "eval", help="score a semantic scene against ground truth, or run the synthetic ablation suite",
        description="rh3dgs eval SCENE --data DATASET | rh3dgs eval --suite synthetic [--quick]")
    e.add_argument("scene", nargs="?", default=None, help="semantic scene folder (rh3dgs.load) to score")
    e.add_argument("--data", default=None, help="labelled dataset folder (masks/*.png, classes.txt[, scene.ply])")
    e.add_argument("--suite", default=None, choices=["synthetic"], help="run the ablation suite instead")
    e.add_argument("--quick", action="store_true", help="suite: 1 scene x 2 teachers, small images (a few minutes)")
    e.add_argument("--output", default=None, help="output folder (suite default: outputs/eval_suite)")
    e.add_argument("--markdown", default=None, help="suite: also write the report here (e.g. docs/results.md)")
    e.add_argument("--work", default=None, help="suite: folder for datasets and scene folders (default OUTPUT/work)")
    e.add_argument("--layouts", type=_ints, default=None, help="suite: comma-separated scene layouts (0-4)")
    e.add_argument("--teachers", default=None,
                   help="suite: comma-separated teacher presets (clip-moderate, clip-strong, sam-moderate, sam-strong)")
    e.add_argument("--seed", type=int, default=None, help="suite: seed of the scenes and teacher draws (default 0)")
    e.add_argument("--steps", type=int, default=None, help="suite: training steps of the trained rows")
    e.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    e.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    e.set_defaults(func=cmd_eval)
    return e


def cmd_eval(args) -> int:
    import torch

    from .suite import SuiteConfig, evaluate_scene, run_suite, scene_report_markdown

    if getattr(args, "threads", 0):
        torch.set_num_threads(int(args.threads))
    if args.suite:
        if args.scene or args.data:
            raise ConfigError("rh3dgs eval: give either SCENE --data DATASET or --suite, not both")
        over = {}
        if args.layouts is not None:
            over["layouts"] = args.layouts
        if args.teachers is not None:
            over["teachers"] = tuple(t.strip() for t in args.teachers.split(",") if t.strip())
        if args.seed is not None:
            over["seed"] = int(args.seed)
        if args.steps is not None:
            over["distill_steps"] = int(args.steps)
        cfg = SuiteConfig.quick(**over) if args.quick else SuiteConfig(**over)
        if not cfg.layouts or not cfg.teachers:
            raise ConfigError("rh3dgs eval --suite: need at least one layout and one teacher")
        out = prepare_output_dir(args.output or "outputs/eval_suite", args.overwrite)
        if args.markdown:
            check_output_file(args.markdown, args.overwrite)
        summary = run_suite(out, cfg, work_dir=args.work, quick=args.quick, markdown_path=args.markdown)
        print((out / "results.md").read_text().split("## All rows")[0].rstrip())
        print(f"\nwrote {out / 'results.json'}, {out / 'results.md'}"
              f"{', ' + str(args.markdown) if args.markdown else ''} ({summary['seconds']:.0f} s)")
        return 0
    if not args.scene or not args.data:
        raise ConfigError("rh3dgs eval: give a semantic scene folder and --data DATASET, or --suite synthetic")
    inputs = [*scene_inputs(args.scene), args.data]
    if args.output:
        check_output_dir(args.output, args.overwrite, inputs)
    res = evaluate_scene(args.scene, args.data)
    md = scene_report_markdown(res, title=f"Evaluation of {args.scene} against {args.data}")
    print(md)
    if args.output:
        from ..io.atomic import atomic_save_bytes, atomic_save_json

        out = prepare_output_dir(args.output, args.overwrite, inputs)
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in res.items()}
        atomic_save_json(out / "eval.json", {"scene": str(args.scene), "data": str(args.data), **clean})
        atomic_save_bytes(out / "eval.md", md.encode())
        print(f"wrote {out / 'eval.json'} and {out / 'eval.md'}")
    return 0
