"""``rh3dgs eval``: score a semantic scene against ground truth, or run the synthetic ablation suite.

    rh3dgs eval SCENE --data DATASET [--output DIR]          one scene folder vs masks/ + classes.txt
    rh3dgs eval --suite synthetic [--quick] [--output DIR]   the ablation table (results.json/.md + PNGs)
    rh3dgs eval --suite synthetic --part dev|test [--output DIR]   a part of the widened suite (docs/suite.md)
    rh3dgs eval --suite synthetic --combine DEV_DIR TEST_DIR [DEV_RECON TEST_RECON] --markdown docs/results.md

The command is the dataclass :class:`Eval` (a subcommand of ``rh3dgs.cli.Rh3dgs``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal, Optional, Tuple

from tyro.conf import Positional, arg

from ..errors import ConfigError
from ..io.outputs import check_output_dir, check_output_file, prepare_output_dir, scene_inputs

__all__ = ["Eval", "cmd_eval"]


def _suite_default(name: str):
    """The help's default of a suite option: SuiteConfig's value of ``name`` (and --quick's where it differs)."""

    def hint(_label: str) -> str:
        from .suite import SuiteConfig

        def show(v) -> str:
            return " ".join(map(str, v)) if isinstance(v, tuple) else str(v)

        full, quick = getattr(SuiteConfig(), name), getattr(SuiteConfig.quick(), name)
        return f"(default: {show(full)}{'' if quick == full else '; --quick: ' + show(quick)})"

    return hint


@dataclass
class Eval:
    """Score a semantic scene against ground truth (SCENE --data DATASET), or run the synthetic suite (--suite)."""

    scene: Annotated[Optional[str], Positional, arg(metavar="SCENE")] = None
    """semantic scene folder (rh3dgs.load) to score"""
    data: Annotated[Optional[str], arg(metavar="PATH")] = None
    """labelled dataset folder (masks/*.png, classes.txt[, scene.ply])"""
    suite: Optional[Literal["synthetic"]] = None
    """run the ablation suite instead"""
    quick: bool = False
    """suite: 1 scene x 2 teachers, small images (a few minutes)"""
    output: Annotated[Optional[str], arg(metavar="PATH", help_behavior_hint="(default: outputs/eval_suite with "
                                                                             "--suite; none for a scene)")] = None
    """output folder"""
    markdown: Annotated[Optional[str], arg(metavar="PATH")] = None
    """suite: also write the report here (e.g. docs/results.md)"""
    work: Annotated[Optional[str], arg(metavar="PATH", help_behavior_hint="(default: OUTPUT/work)")] = None
    """suite: folder of the datasets and scene folders"""
    layouts: Annotated[Optional[Tuple[int, ...]], arg(help_behavior_hint=_suite_default("layouts"))] = None
    """suite: scene layouts, 0-4"""
    teachers: Annotated[Optional[Tuple[str, ...]], arg(help_behavior_hint=_suite_default("teachers"))] = None
    """suite: teacher presets (clip-moderate, clip-strong, sam-moderate or sam-strong)"""
    seed: Annotated[Optional[int], arg(help_behavior_hint=_suite_default("seed"))] = None
    """suite: seed of the scenes and teacher draws"""
    part: Annotated[Optional[Literal["dev", "test"]], arg(help_behavior_hint="(default: layouts x teachers)")] = None
    """suite: a part of the widened suite (rh3dgs/eval/families.py)"""
    pairs: Annotated[Optional[Tuple[int, ...]], arg(help_behavior_hint="(default: all)")] = None
    """suite: indices of the pairs to run"""
    rows: Annotated[Optional[Tuple[str, ...]], arg(help_behavior_hint="(default: every row of the design)")] = None
    """suite: names of the rows to run"""
    combine: Annotated[Optional[Tuple[str, ...]], arg(metavar="DIR ...")] = None
    """suite: output folders of the dev and test parts, then optionally both again run with --geometry-noise:
    write --markdown from their runs"""
    resume: bool = False
    """suite: keep the records of an earlier run in --output and compute only what is missing"""
    heldout_radius: Annotated[Optional[float], arg(help_behavior_hint="(default: the training orbit's)")] = None
    """suite study knob: orbit radius of the held-out cameras"""
    gaussian_style: Annotated[Optional[Literal["surfel", "blob"]], arg(help_behavior_hint="(default: surfel)")] = None
    """suite study knob: flat surfels or overlapping isotropic blobs"""
    geometry_noise: Annotated[Optional[float], arg(help_behavior_hint="(default: 0, the true Gaussians)")] = None
    """suite study knob: the methods get a jittered reconstruction of the scene (std in disk widths)"""
    steps: Annotated[Optional[int], arg(help_behavior_hint=_suite_default("distill_steps"))] = None
    """suite: training steps of the trained rows"""
    threads: int = 0
    """torch threads (0: as torch chooses)"""
    overwrite: bool = False
    """replace existing outputs"""

    def main(self) -> int:
        return cmd_eval(self)


def cmd_eval(args) -> int:
    import torch

    from .suite import SuiteConfig, run_suite

    if getattr(args, "threads", 0):
        torch.set_num_threads(int(args.threads))
    if args.suite:
        if args.scene or args.data:
            raise ConfigError("rh3dgs eval: give either SCENE --data DATASET or --suite, not both")
        if getattr(args, "combine", None):
            return _combine(args)
        over = {}
        if args.layouts is not None:
            over["layouts"] = args.layouts
        if args.teachers is not None:
            over["teachers"] = args.teachers
        if args.seed is not None:
            over["seed"] = int(args.seed)
        if args.steps is not None:
            over["distill_steps"] = int(args.steps)
        for key in ("part", "pairs", "rows", "heldout_radius", "gaussian_style", "geometry_noise"):
            if getattr(args, key, None) is not None:
                over[key] = getattr(args, key)
        if over.get("part") is not None:
            over.setdefault("qualitative", None)
            over.setdefault("save_scenes", "none")
        cfg = SuiteConfig.quick(**over) if args.quick else SuiteConfig(**over)
        if not cfg.layouts or not cfg.teachers:
            raise ConfigError("rh3dgs eval --suite: need at least one layout and one teacher")
        cfg.row_list()  # unknown row names: one line before any work
        default_out = f"outputs/eval_suite{'_' + cfg.part if cfg.part else ''}"
        if getattr(args, "resume", False):
            from pathlib import Path

            out = Path(args.output or default_out)
            out.mkdir(parents=True, exist_ok=True)
        else:
            out = prepare_output_dir(args.output or default_out, args.overwrite)
        if args.markdown:
            check_output_file(args.markdown, args.overwrite)
        summary = run_suite(out, cfg, work_dir=args.work, quick=args.quick, markdown_path=args.markdown)
        print((out / "results.md").read_text().split("## All rows")[0].rstrip())
        print(f"\nwrote {out / 'results.json'}, {out / 'results.md'}"
              f"{', ' + str(args.markdown) if args.markdown else ''} ({summary['seconds']:.0f} s)")
        return 0
    if not args.scene or not args.data:
        raise ConfigError("rh3dgs eval: give a semantic scene folder and --data DATASET, or --suite synthetic")
    return _score_scene(args)


def _combine(args) -> int:
    """``--combine DEV TEST [DEV_RECON TEST_RECON] --markdown PATH``: the parts' report from their runs (the last two:
    the same parts with ``--geometry-noise``, a reconstruction's Gaussians)."""
    import json
    from pathlib import Path

    from .report import PART_NAMES, write_parts_markdown

    usage = "rh3dgs eval --suite synthetic --combine DEV_DIR TEST_DIR [DEV_RECON_DIR TEST_RECON_DIR] --markdown PATH"
    if not args.markdown or len(args.combine) not in (2, 4):
        raise ConfigError(f"{usage}: give 2 or 4 folders and --markdown")
    for name, d in zip(PART_NAMES, args.combine):
        f = Path(d) / "results.json"
        if not f.is_file():
            raise ConfigError(f"rh3dgs eval --combine: {f} does not exist (run that part first)")
        cfg = json.loads(f.read_text()).get("config", {})
        part, noise = name.split("-")[0], float(cfg.get("geometry_noise") or 0)
        if cfg.get("part") != part or (noise > 0) != name.endswith("-recon"):
            raise ConfigError(f"rh3dgs eval --combine: {f} is the {cfg.get('part')} part with --geometry-noise "
                              f"{noise:g}; expected the {part} part {'with' if name.endswith('-recon') else 'without'} "
                              f"it ({usage})")
    check_output_file(args.markdown, args.overwrite)
    path = write_parts_markdown(dict(zip(PART_NAMES, args.combine)), args.markdown)
    print(f"wrote {path}")
    return 0


def _score_scene(args) -> int:
    from .suite import evaluate_scene, scene_report_markdown

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
