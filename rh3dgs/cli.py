"""The ``rh3dgs`` command line.

    rh3dgs demo   [--output DIR]            synthetic scene -> renders (+ lift and queries)
    rh3dgs synth  --output DIR [--seed S]   write a labelled synthetic nerfstudio dataset
    rh3dgs render SCENE.ply --transforms T  render a PLY from the cameras of a transforms.json
    rh3dgs extract --data DIR --teacher T   teacher features for the dataset's images (cached;
                                            data-parallel: torchrun --nproc_per_node=K -m rh3dgs.cli extract ...)
    rh3dgs lift SCENE.ply --data DIR        training-free lift -> semantic scene folder
    rh3dgs query SCENE "red mug;chair"      relevancy PNGs over the cameras, 3D selections
    rh3dgs select / export                  selections and whole scenes as 3DGS PLY
    rh3dgs eval SCENE --data DIR | --suite  protocols and the synthetic ablation suite
    rh3dgs view PATH                        interactive text-query viewer (127.0.0.1)

User errors (rh3dgs.errors) are printed as one line without a traceback; ``--debug``
shows the traceback. Every job checks its memory estimate first (rh3dgs.memory) and stops
before allocating when it cannot fit in the machine's memory or ``rh3dgs --max-memory SIZE``.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import sys
import time
from pathlib import Path
from typing import List, Optional

from .errors import ConfigError, Rh3dgsError
from .progress import track
from .io.outputs import check_not_input, check_output_dir, check_output_file, prepare_output_dir, scene_inputs
from .query import CANONICAL_NEGATIVES, THRESHOLD, format_queries, parse_queries

__all__ = ["main"]


class UsageError(ConfigError):
    """A command line that does not parse (unknown option, missing argument, a value of the wrong type)."""


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad command line reported as one line (``rh3dgs: error: ...``, exit code 2) by
    :func:`main` instead of the usage block."""

    def error(self, message: str):  # type: ignore[override]
        where = self.prog if self.prog != "rh3dgs" else "rh3dgs"
        raise UsageError(f"{where}: {message} (see {self.prog} --help)")


@contextlib.contextmanager
def _writing(path):
    """Report an OS error while writing the output ``path`` (a folder where a file goes, no write
    permission, a name too long, a full disk...) as one line naming it."""
    try:
        yield
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc} "
                          f"({exc.filename if exc.filename else 'while writing'})") from exc


def _views_arg(text: Optional[str], n: int) -> List[int]:
    """``--views "0,3,5"`` -> [0, 3, 5] (None: every view), each checked against the ``n`` cameras."""
    if text is None:
        return list(range(n))
    try:
        views = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--views: expected comma-separated camera indices (e.g. 0,3,5), got {text!r}") from None
    if not views:
        raise ConfigError(f"--views: no camera index given ({text!r}); leave it out for every view")
    bad = [i for i in views if not 0 <= i < n]
    if bad:
        raise ConfigError(f"--views: index {bad[0]} is outside 0..{n - 1}")
    return views


def _stem(query: str, limit: int = 80) -> str:
    """A file-name stem for a query ("red mug" -> "red_mug"); long ones keep ``limit`` characters and a hash."""
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in query.replace(" ", "_")).strip(".") or "query"
    if len(stem) > limit:
        stem = stem[:limit] + "_" + hashlib.sha1(query.encode()).hexdigest()[:8]
    return stem


def _transforms_file(path) -> Path:
    """The transforms.json that ``--transforms`` / ``--data`` names (the file, or the one in the folder)."""
    p = Path(path)
    return p / "transforms.json" if p.is_dir() else p


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


def _synthetic_sizes(args) -> None:
    """``--views`` / ``--size`` of the synthetic scene: at least 1 view of 8 x 8 pixels, and images that fit."""
    from .memory import check_memory, image_memory_estimate

    if args.views < 1:
        raise ConfigError(f"--views {args.views}: the synthetic scene needs at least 1 view")
    if args.size < 8:
        raise ConfigError(f"--size {args.size}: images of at least 8 x 8 pixels")
    check_memory(image_memory_estimate(args.size, args.size), f"{args.size}x{args.size} synthetic images",
                 knobs=["--size N (smaller images)"])


def cmd_synth(args) -> int:
    from .data.synthetic import SceneConfig, make_scene, write_dataset

    _synthetic_sizes(args)
    cfg = SceneConfig(seed=args.seed, num_views=args.views, image_size=args.size)
    scene = make_scene(cfg)
    paths = write_dataset(scene, prepare_output_dir(args.output, args.overwrite))
    print(f"wrote a synthetic dataset with {len(scene.gaussians)} Gaussians, {len(scene.cameras)} views, "
          f"classes {scene.class_names} to {paths['root']}")
    return 0


def cmd_render(args) -> int:
    import torch

    from .io.ply import load_ply
    from .rendering import render

    from .memory import check_memory, render_memory_estimate

    out = check_output_dir(args.output, args.overwrite, [args.scene, _transforms_file(args.transforms)])
    gaussians = load_ply(args.scene, latents=False)  # RGB only: sem_* columns are not read

    def preflight(views: int, w: int, h: int) -> None:  # one view at a time
        check_memory(render_memory_estimate(len(gaussians), h, w), f"rendering {len(gaussians)} Gaussians at "
                     f"{w}x{h}", knobs=["--downscale N (a smaller image)"])

    cams, images = _load_cameras(args, args.transforms, check_images=False, require_images=False,
                                 preflight=preflight)
    names = [p.stem[:80] for p in images]
    for i in track(range(len(cams)), description="render"):
        with torch.no_grad():
            r = render(gaussians, cams[i])
        with _writing(out):
            _save_render_pngs(r, names, out, start=i)
    print(f"rendered {len(cams)} views of {len(gaussians)} Gaussians to {out}")
    return 0


def cmd_demo(args) -> int:
    import torch

    from .data.synthetic import SceneConfig, make_scene, write_dataset
    from .rendering import render

    t0 = time.time()
    _synthetic_sizes(args)
    out = prepare_output_dir(args.output, args.overwrite)
    cfg = SceneConfig(seed=args.seed, num_views=args.views, image_size=args.size,
                      heldout_views=0 if args.no_semantic else 4)  # held-out views: the semantic scores
    scene = make_scene(cfg)
    data = write_dataset(scene, out / "data")
    steps = 2 if args.no_semantic else 5  # demo_semantic prints [3/5]..[5/5]
    print(f"[1/{steps}] synthetic scene: {len(scene.gaussians)} Gaussians, {len(scene.cameras)} views -> {data['root']}")
    renders = out / "renders"
    for i in track(range(len(scene.cameras)), description="render"):
        with torch.no_grad():
            r = render(scene.gaussians, scene.cameras[i])
        _save_render_pngs(r, scene.cameras.names, renders, start=i)
    print(f"[2/{steps}] renders (RGB, depth, alpha PNGs) -> {renders}")
    extra = _demo_semantic(scene, out, args) if not args.no_semantic else None
    print(f"done in {time.time() - t0:.1f} s. Results: {out.resolve()}")
    if extra:
        print(extra)
    return 0


def _teacher_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--teacher", default="precomputed", help="clip | tiny-clip | precomputed (default)")
    p.add_argument("--model", default=None, help="open_clip model name (clip teacher; default ViT-B-16)")
    p.add_argument("--pretrained", default=None, help="open_clip pretrained tag (clip teacher)")
    p.add_argument("--checkpoint", default=None, help="local open_clip checkpoint file (clip teacher)")
    p.add_argument("--features-dir", default=None, help="precomputed teacher: folder of <stem>.npy maps "
                                                        "(default DATA/features)")
    p.add_argument("--cache", default=None, help="feature cache folder (default DATA/.rh3dgs_cache, as for "
                                                 "ns-train rh3dgs)")


def _teacher_config(args):
    """The TeacherConfig of the teacher options (unset options keep TeacherConfig's defaults): the same
    teacher, hence the same cache entries, as an ``ns-train rh3dgs`` data manager with that config."""
    from .teachers import TeacherConfig

    given = {k: getattr(args, k) for k in ("model", "pretrained", "checkpoint", "features_dir") if getattr(args, k)}
    if args.checkpoint and not Path(args.checkpoint).expanduser().is_file():  # before open_clip is imported
        from .errors import MissingWeightsError

        raise MissingWeightsError(f"--checkpoint {args.checkpoint}: checkpoint file not found")
    return TeacherConfig(name=args.teacher, cache_dir=args.cache, **given)


def _cache_dir(args, data: Path, image_paths) -> Path:
    """The feature cache folder (written by extract and lift; default DATA/.rh3dgs_cache, the default of every
    entry point): never the dataset's transforms.json or images."""
    from .teachers import default_cache_dir

    cache = Path(args.cache) if args.cache else default_cache_dir(data)
    # undistorted / downscaled copies live in the cache's images/ folder (_load_cameras): the cache's own
    # products, not the user's inputs (their sources are outside it, or the check below names them)
    derived = (cache / "images").resolve()
    sources = [p for p in image_paths if not Path(p).resolve().is_relative_to(derived)]
    check_not_input(cache, [_transforms_file(data), *sources], what="feature cache")
    return cache


def _dataset_maps(args, teacher, data: Path, image_paths, distributed: bool = False):
    """The teacher maps of the dataset's images: :func:`rh3dgs.teachers.dataset_maps`, the provider the
    nerfstudio data manager uses too (computed into the cache first unless the teacher reads them in place)."""
    from .teachers import dataset_maps

    return dataset_maps(teacher, image_paths, _cache_dir(args, data, image_paths), distributed=distributed)


def _image_args(p: argparse.ArgumentParser) -> None:
    """How the dataset's photos are read (rh3dgs.io.transforms.ImageOptions)."""
    p.add_argument("--downscale", type=int, default=1, metavar="N",
                   help="divide the image size by N, as nerfstudio's downscale_factor (images_N folders if present)")
    p.add_argument("--skip-missing-images", action="store_true",
                   help="leave out the frames of transforms.json whose image file is missing")
    p.add_argument("--no-undistort", action="store_true",
                   help="refuse lens distortion instead of undistorting the images (as nerfstudio's splatfacto)")


def _load_cameras(args, transforms, check_images: bool, require_images: bool = True, preflight=None):
    """load_transforms with the command's ImageOptions (--downscale, --skip-missing-images, --no-undistort)."""
    import warnings

    from .io.transforms import ImageOptions, load_transforms

    opts = ImageOptions(downscale=args.downscale, skip_missing_images=args.skip_missing_images,
                        undistort=not args.no_undistort)
    cache = getattr(args, "cache", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        out = load_transforms(transforms, check_images=check_images, require_images=require_images,
                              image_cache=Path(cache) / "images" if cache else None, preflight=preflight,
                              **vars(opts))
    for w in caught:
        print(f"rh3dgs: warning: {w.message}", file=sys.stderr)
    return out


def cmd_extract(args) -> int:
    """Single process, or data-parallel under ``torchrun --nproc_per_node=K -m rh3dgs.cli extract ...``
    (each rank extracts a disjoint shard of the missing entries; rank 0 writes the manifest and prints)."""
    import dataclasses

    from .distributed import process_group_from_env
    from .memory import check_memory, image_memory_estimate

    data = Path(args.data)
    def preflight(views: int, w: int, h: int) -> None:  # one image at a time
        check_memory(image_memory_estimate(h, w), f"reading {w}x{h} images", knobs=["--downscale N"])

    cams, images = _load_cameras(args, data, check_images=True, preflight=preflight)
    with process_group_from_env() as dist:
        tcfg = _teacher_config(args)
        if dist is not None and dist.device.type == "cuda":
            tcfg = dataclasses.replace(tcfg, device=str(dist.device))  # each rank on its LOCAL_RANK GPU
        teacher = tcfg.setup(data)
        maps = _dataset_maps(args, teacher, data, images, distributed=dist is not None)
        stats = maps.stats
        if dist is None or dist.is_main:
            if not maps.cached:
                print(f"the {teacher.name} teacher reads its {len(maps)} existing maps in place; nothing to extract")
                return 0
            where = Path(maps.files[0]).parent if len(maps) else args.cache
            by_rank = stats.get("computed_by_rank")
            over = (f" over {len(by_rank)} processes ({' + '.join(map(str, by_rank))} computed)"
                    if by_rank else "")
            print(f"{len(maps)} feature maps ({stats.get('computed', 0)} computed, {stats.get('reused', 0)} reused)"
                  f"{over} in {where}")
    return 0


def cmd_lift(args) -> int:
    from .io.frames import to_data_frame
    from .io.ply import load_ply
    from .io.scene import save_scene
    from .lifting import LiftConfig, lift
    from .lift_memory import preflight_lift
    from .teachers import default_cache_dir, spec_paths

    data = Path(args.data)
    tcfg = _teacher_config(args)
    spec = tcfg.spec(data)
    inputs = [args.scene, _transforms_file(data), args.cache or default_cache_dir(data), args.config,
              *spec_paths(spec)]  # the teacher's own files: features_dir, checkpoint...
    out = check_output_dir(args.output, args.overwrite, inputs)
    gaussians = load_ply(args.scene, latents=False)  # the lift computes the latents
    if len(gaussians) == 0:
        from .errors import PlyFormatError

        raise PlyFormatError(args.scene, "the PLY has 0 vertices: no Gaussians to lift")
    teacher = tcfg.setup(data)
    d_teacher = int(teacher.dim)
    if args.config:
        from .presets import load_preset

        cfg = load_preset(args.config, LiftConfig)
    else:
        given = {k: getattr(args, k) for k in ("delta", "iters", "latent_dim", "views_per_batch")
                 if getattr(args, k) is not None}  # the rest: LiftConfig's defaults, written once there
        cfg = LiftConfig(method=args.method, use_vcd=not args.no_vcd, **given)
        cfg.guided = cfg.guided and not args.no_guided
    if args.streaming:
        cfg.cache_projections, cfg.compact_cache = False, False

    def preflight(views: int, w: int, h: int) -> None:  # before any per-frame work or image
        preflight_lift(len(gaussians), views, h, w, d_teacher, cfg, device=str(gaussians.device))

    cams, images = _load_cameras(args, data, check_images=False, preflight=preflight)
    gaussians, frame = to_data_frame(gaussians, args.scene, cams, data, frame=args.frame, images=images)
    if frame != "data":
        print(f"{args.scene}: Gaussians in the {frame} frame, mapped to the dataset's (rh3dgs.io.frames)")
    print(preflight_lift(len(gaussians), len(cams), cams.height, cams.width, d_teacher, cfg,
                         device=str(gaussians.device)).summary())
    maps = _dataset_maps(args, teacher, data, images)
    res = lift(gaussians, cams, maps, cfg)
    table = {}
    if hasattr(teacher, "text_queries"):
        names = teacher.text_queries()
        table = dict(zip(names, teacher.encode_text(names)))
    out = save_scene(prepare_output_dir(out, args.overwrite, inputs), gaussians, res.field(), cams, images,
                     teacher=spec, text_embeddings=table, info=res.info)
    print(f"lifted {len(gaussians)} Gaussians ({res.info['observed']} observed, {res.info['filled']} filled from "
          f"3D neighbours) over {len(cams)} views in "
          f"{res.info['seconds']:.1f} s -> {out}")
    return 0


def cmd_query(args) -> int:
    from .api import load
    from .io.atomic import atomic_save_png
    from .viz import colorize, highlight, result_sheet

    out = check_output_dir(args.output, args.overwrite, scene_inputs(args.scene))
    scene = load(args.scene)
    queries = list(parse_queries(args.queries))
    if not queries:
        raise ConfigError("no query given (semicolon-separated phrases, e.g. \"red mug;chair\")")
    negatives = None if args.negatives is None else list(parse_queries(args.negatives))
    if scene.cameras is None:
        raise ConfigError(f"{args.scene}: the scene has no cameras (transforms.json) to render queries from")
    views = _views_arg(args.views, len(scene.cameras))
    names = [n[:80] for n in scene.cameras.names] or [f"view_{i:05d}" for i in range(len(scene.cameras))]
    scene.encode(queries)  # an unknown query stops here, before any file is written
    if negatives:
        scene.encode(negatives)
    for i in track(views, description="query: relevancy"):
        rel = scene.render_relevancy(i, queries, negatives)
        rgb = scene.render(i)
        for q, r in zip(queries, rel):
            with _writing(out):
                atomic_save_png(out / f"{names[i]}_{_stem(q)}_relevancy.png", colorize(r, vmin=0.0, vmax=1.0))
                atomic_save_png(out / f"{names[i]}_{_stem(q)}_overlay.png", highlight(rgb, r, threshold=args.threshold))
        with _writing(out):
            atomic_save_png(out / "sheets" / f"{names[i]}.png", result_sheet(rgb, rel, queries, args.threshold,
                                                                             title=names[i]))
    for q in track(queries, description="query: selections"):
        sel = scene.select(q, threshold=args.threshold, negatives=negatives)
        stem = _stem(q)
        with _writing(out / f"{stem}.ply"):
            scene.export_ply(out / f"{stem}.ply", mask=sel)
        print(f"'{q}': {int(sel.sum())} of {len(scene)} Gaussians above {args.threshold} -> {out / (stem + '.ply')}")
    print(f"relevancy PNGs for {len(queries)} queries x {len(views)} views, one sheet per view "
          f"(sheets/<view>.png) -> {out}")
    return 0


def cmd_select(args) -> int:
    from .api import load

    out = check_output_file(args.output, args.overwrite, scene_inputs(args.scene))
    scene = load(args.scene)
    negatives = None if args.negatives is None else list(parse_queries(args.negatives))
    sel = scene.select(args.query, threshold=args.threshold, negatives=negatives)
    with _writing(out):
        out = scene.export_ply(out, mask=sel, latents=args.latents, latent_dtype=args.latent_dtype)
    print(f"'{args.query}': {int(sel.sum())} of {len(scene)} Gaussians above {args.threshold} -> {out}")
    return 0


def cmd_export(args) -> int:
    from .api import load

    out = check_output_file(args.output, args.overwrite, scene_inputs(args.scene))
    scene = load(args.scene)
    with _writing(out):
        out = scene.export_ply(out, latents=args.latents, latent_dtype=args.latent_dtype)
    with_latents = args.latents and scene.field is not None
    print(f"{len(scene)} Gaussians{' with sem_* latents' if with_latents else ' (plain 3DGS PLY)'} -> {out}")
    return 0


def _demo_semantic(scene, out: Path, args) -> Optional[str]:
    """Lift simulated teacher features and answer text queries (when the method modules exist)."""
    try:
        from . import demo_semantic
    except ImportError:
        return None
    return demo_semantic.run(scene, out, args)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rh3dgs", description="Robust open-vocabulary semantic 3D Gaussian Splatting")
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    p.add_argument("--max-memory", default=None, metavar="SIZE",
                   help="refuse jobs whose memory estimate exceeds SIZE (e.g. 8G, 512M; default: the memory "
                        "available on this machine)")
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
    _image_args(r)
    r.set_defaults(func=cmd_render)

    e = sub.add_parser("extract", help="teacher features for a dataset's images (cached, incremental)",
                       description="Teacher features for a dataset's images (cached, incremental). Data-parallel "
                                   "over K processes (GPUs, or CPU with gloo): torchrun --nproc_per_node=K "
                                   "-m rh3dgs.cli extract --data DIR --teacher T ...")
    e.add_argument("--data", required=True, help="dataset folder with transforms.json")
    _teacher_args(e)
    _image_args(e)
    e.set_defaults(func=cmd_extract)

    li = sub.add_parser("lift", help="training-free lift of teacher features into a 3DGS PLY")
    li.add_argument("scene", help="3DGS PLY (INRIA layout), in the frame of the dataset's cameras")
    li.add_argument("--frame", default="auto", choices=["auto", "data", "nerfstudio", "capture"],
                    help="frame of the PLY (default auto: detected, rh3dgs.io.frames); nerfstudio = ns-export's")
    li.add_argument("--data", required=True, help="dataset folder with transforms.json (and features/)")
    li.add_argument("--output", required=True, help="semantic scene folder to write")
    li.add_argument("--method", default="robust", choices=["robust", "karcher", "euclidean"])
    li.add_argument("--no-vcd", action="store_true", help="uniform pixel weights (ablation)")
    li.add_argument("--no-guided", action="store_true", help="bilinear upsampling of coarse teacher maps instead of "
                                                             "guided by the render's colours (LiftConfig.guided)")
    li.add_argument("--delta", type=float, default=None, help="Huber threshold (radians; default LiftConfig.delta)")
    li.add_argument("--iters", type=int, default=None, help="IRLS passes (default LiftConfig.iters)")
    li.add_argument("--latent-dim", type=int, default=None, help="default LiftConfig.latent_dim")
    li.add_argument("--views-per-batch", type=int, default=None, help="default LiftConfig.views_per_batch")
    li.add_argument("--streaming", action="store_true",
                    help="keep nothing across the IRLS passes (least memory; LiftConfig cache_projections=False, "
                         "compact_cache=False)")
    li.add_argument("--config", default=None, help="YAML preset of LiftConfig (e.g. configs/lift-robust.yaml); "
                                                   "replaces --method/--no-vcd/--no-guided/--delta/...")
    _teacher_args(li)
    _image_args(li)
    li.set_defaults(func=cmd_lift)

    q = sub.add_parser("query", help="relevancy PNGs over the cameras and 3D selections for text queries")
    q.add_argument("scene", help="semantic scene folder (from `rh3dgs lift` / `rh3dgs demo`)")
    q.add_argument("queries", help="semicolon-separated phrases, e.g. 'red mug;chair'")
    q.add_argument("--negatives", default=None,
                   help=f"semicolon-separated negatives (default: {format_queries(CANONICAL_NEGATIVES)})")
    q.add_argument("--threshold", type=float, default=THRESHOLD, help=f"selection threshold (default {THRESHOLD})")
    q.add_argument("--views", default=None, help="comma-separated camera indices (default: all)")
    q.add_argument("--output", required=True)
    q.set_defaults(func=cmd_query)

    se = sub.add_parser("select", help="write the Gaussians relevant to a query as a plain 3DGS PLY")
    se.add_argument("scene", help="semantic scene folder")
    se.add_argument("query", help="a phrase, e.g. 'red mug'")
    se.add_argument("--threshold", type=float, default=THRESHOLD, help=f"selection threshold (default {THRESHOLD})")
    se.add_argument("--negatives", default=None,
                    help=f"semicolon-separated negatives (default: {format_queries(CANONICAL_NEGATIVES)})")
    se.add_argument("--output", required=True, help="PLY file to write")
    se.set_defaults(func=cmd_select)

    ex = sub.add_parser("export", help="write a scene as one plain 3DGS PLY (--latents: with sem_* latents)")
    ex.add_argument("scene", help="semantic scene folder or PLY")
    ex.add_argument("--output", required=True, help="PLY file to write")
    ex.set_defaults(func=cmd_export)

    for sp in (d, s, r, li, q, se, ex):
        sp.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    for sp in (se, ex):
        sp.add_argument("--latents", action="store_true",
                        help="add the field's latents as sem_* columns (read by rh3dgs; other tools ignore them)")
        sp.add_argument("--latent-dtype", default="float32", choices=["float32", "float16"],
                        help="with --latents: float32 (a standard PLY float) or float16 (compact, rh3dgs-only)")

    from .eval.cli import add_eval_parser
    from .viewer.cli import add_view_parser

    add_eval_parser(sub)
    add_view_parser(sub)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """``rh3dgs ARGV``; returns the exit code: 0, or 2 after one line ``rh3dgs: error: ...`` on stderr for
    bad input (a command line that does not parse, a file or value rh3dgs refuses: rh3dgs.errors, or an
    operating-system error on a named path). ``--debug`` re-raises the error (traceback)."""
    from .progress import silence_known_warnings

    silence_known_warnings()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _global_flag(argv, "--debug")
    try:
        args = build_parser().parse_args(argv)
        from .memory import memory_limit

        with memory_limit(args.max_memory):
            return int(args.func(args) or 0)
    except Rh3dgsError as exc:
        if debug:
            raise
        print(f"rh3dgs: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path the user named that the system refuses (too long, no permission...)
        if debug or exc.filename is None:
            raise
        print(f"rh3dgs: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2


def _global_flag(argv: List[str], flag: str) -> bool:
    """Whether ``flag`` is among the options before the command (``rh3dgs --debug lift ...``)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == flag:
            return True
        i += 2 if argv[i] == "--max-memory" else 1
    return False


def _one_line(text: str) -> str:
    return " ".join(text.split()) if "\n" in text else text


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
