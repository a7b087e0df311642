"""The ``rh3dgs`` command line.

    rh3dgs demo   [--output DIR]            synthetic scene -> renders (+ lift and queries)
    rh3dgs synth  --output DIR [--seed S]   write a labelled synthetic nerfstudio dataset
    rh3dgs render SCENE.ply [--transforms T] render a splat from a transforms.json's cameras, or an orbit
    rh3dgs extract --data DIR --teacher T   teacher features for the dataset's images (cached;
                                            data-parallel: torchrun --nproc_per_node=K -m rh3dgs.cli extract ...)
    rh3dgs lift SCENE.ply --data DIR        training-free lift -> semantic scene folder
    rh3dgs distill SCENE.ply --data DIR     the lift, then semantic distillation on the fixed Gaussians
                                            (lift and distill are data-parallel under torchrun --nproc_per_node=K)
    rh3dgs query SCENE "red mug;chair"      relevancy PNGs over the cameras, 3D selections
    rh3dgs select / export                  selections and whole scenes as 3DGS PLY
    rh3dgs eval SCENE --data DIR | --suite  protocols and the synthetic ablation suite
    rh3dgs view PATH                        interactive text-query viewer (127.0.0.1)

The command line is tyro's, over the config dataclasses the Python API takes: ``rh3dgs lift``'s
options are :class:`rh3dgs.lifting.LiftConfig`'s fields (``--delta``, ``--iters``, ``--no-vcd``,
``--no-guided``, ``--vcd.edge-radius``...), the teacher options :class:`rh3dgs.teachers.TeacherConfig`'s
(``--teacher`` is its ``name``, ``--cache`` its ``cache_dir``), the image options
:class:`rh3dgs.io.transforms.ImageOptions`' and ``synth`` / ``demo``'s
:class:`rh3dgs.data.synthetic.SceneConfig`'s (``--views`` = ``num_views``, ``--size`` = ``image_size``):
each default and its help text is written once, in that dataclass (one line per field; why a default is
what it is: docs/method.md). Booleans are one flag each, named for the change from the default (``--overwrite``,
``--no-vcd``), their default shown as on / off. ``rh3dgs COMMAND --help`` lists them (tests/test_cli_help.py
bounds its length).

User errors (rh3dgs.errors) are printed as one line without a traceback; ``--debug``
shows the traceback. Every job checks its memory estimate first (rh3dgs.memory) and stops
before allocating when it cannot fit in the machine's memory or ``rh3dgs --max-memory SIZE``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Dict, List, Literal, Optional, Tuple, Union

import tyro
from tyro.conf import FlagCreatePairsOff, Positional, Suppress, arg, subcommand

from .data.synthetic import SceneConfig
from .distill import DistillConfig
from .method.objective import ObjectiveConfig
from .errors import ConfigError, Rh3dgsError
from .eval.cli import Eval
from .io.atomic import atomic_folder
from .io.outputs import check_not_input, check_output_dir, check_output_file, prepare_output_dir, scene_inputs
from .io.transforms import ImageOptions
from .lifting import LiftConfig
from .presets import as_config, load_preset
from .progress import track
from . import query as query_types
from .query import CANONICAL_NEGATIVES, THRESHOLD, format_queries, parse_queries
from .ranges import Range, RangeError, check_fields, command_line
from .teachers import TeacherConfig
from .viewer.cli import View

__all__ = ["main", "parse", "Rh3dgs"]


class UsageError(ConfigError):
    """A command line that does not parse (unknown option, missing argument, a value of the wrong type)."""


# ---- the config dataclasses under their command-line names (fields, defaults and help: the base class's)

@dataclass
class TeacherOptions(TeacherConfig):
    """TeacherConfig as the commands name it: --teacher (name), --cache (cache_dir)."""

    name: Annotated[str, arg(name="teacher", help="auto (the teacher of DATA's feature cache, else precomputed), "
                                                  "precomputed (DATA/features maps), clip or tiny-clip")] = "auto"
    cache_dir: Annotated[Optional[str], arg(name="cache")] = TeacherConfig.cache_dir

    def config(self) -> TeacherConfig:
        return as_config(TeacherConfig, self)


@dataclass
class LiftOptions(LiftConfig):
    """LiftConfig with use_vcd as --no-vcd."""

    method: Literal["robust", "karcher", "euclidean"] = LiftConfig.method
    use_vcd: Annotated[bool, arg(name="vcd")] = LiftConfig.use_vcd

    def config(self) -> LiftConfig:
        return as_config(LiftConfig, self)


@dataclass
class SceneOptions(SceneConfig):
    """SceneConfig with num_views as --views and image_size as --size."""

    num_views: Annotated[int, arg(name="views")] = SceneConfig.num_views
    image_size: Annotated[int, arg(name="size")] = SceneConfig.image_size

    def config(self, **changes) -> SceneConfig:
        return dataclasses.replace(as_config(SceneConfig, self), **changes)


Output = Annotated[str, arg(metavar="PATH")]
ScenePath = Annotated[str, Positional, arg(metavar="SCENE")]
Teacher = Annotated[TeacherOptions, arg(name="")]  # its fields without a prefix: --teacher, --model...
Images = Annotated[ImageOptions, arg(name="")]  # --downscale, --skip-missing-images, --no-undistort
Overwrite = Annotated[bool, arg(help="replace existing outputs")]


@contextlib.contextmanager
def _writing(path):
    """Report an OS error while writing the output ``path`` (a folder where a file goes, no write
    permission, a name too long, a full disk...) as one line naming it."""
    try:
        yield
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc} "
                          f"({exc.filename if exc.filename else 'while writing'})") from exc


def _views_arg(views: Optional[Tuple[int, ...]], n: int) -> List[int]:
    """``--views 0 3 5`` -> [0, 3, 5] (None: every view), each checked against the ``n`` cameras."""
    if views is None:
        return list(range(n))
    if not views:
        raise ConfigError("--views: no camera index given; leave it out for every view")
    bad = [i for i in views if not 0 <= i < n]
    if bad:
        raise ConfigError(f"--views: index {bad[0]} is outside 0..{n - 1}")
    return list(views)


def _stem(query: str, limit: int = 80) -> str:
    """A file-name stem for a query ("red mug" -> "red_mug"); long ones keep ``limit`` characters and a hash."""
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in query.replace(" ", "_")).strip(".") or "query"
    if len(stem) > limit:
        stem = stem[:limit] + "_" + hashlib.sha1(query.encode()).hexdigest()[:8]
    return stem


def _distinct(names: List[str], what: str) -> List[str]:
    """Output names made distinct before any work (:func:`rh3dgs.io.outputs.distinct_names`), said on stderr."""
    from .io.outputs import distinct_names

    out, note = distinct_names(names, what)
    if note:
        print(f"rh3dgs: warning: {note}", file=sys.stderr)
    return out


def _transforms_file(path) -> Path:
    """The transforms.json that ``--transforms`` / ``--data`` names (the file, or the one in the folder)."""
    p = Path(path)
    return p / "transforms.json" if p.is_dir() else p


def _save_render_pngs(result, names: List[str], out_dir: Path, start: int = 0) -> List[Path]:
    """Write the RGB and alpha PNGs of a RenderResult, its depth as a PNG with a colour bar in scene units and as
    ``*_depth.npy`` (float32, 0 where alpha <= 0.5); returns the RGB paths."""
    import numpy as np
    import torch

    from .io.atomic import atomic_save_png, atomic_write
    from .viz import colorize, with_colorbar

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for b in range(result.alpha.shape[0]):
        name = names[start + b]
        rgb = (result.rgb[b].clamp(0, 1) * 255).round().to(torch.uint8).numpy()
        atomic_save_png(out_dir / f"{name}_rgb.png", rgb)
        seen = result.alpha[b] > 0.5
        d = torch.where(seen, result.depth[b], torch.zeros_like(result.depth[b]))
        lo, hi = (float(d[seen].min()), float(d[seen].max())) if seen.any() else (0.0, 1.0)
        atomic_save_png(out_dir / f"{name}_depth.png", with_colorbar(colorize(d, seen, lo, hi), lo, hi,
                                                                     "depth (scene units)"))
        with atomic_write(out_dir / f"{name}_depth.npy") as f:
            np.save(f, d.numpy().astype(np.float32), allow_pickle=False)
        atomic_save_png(out_dir / f"{name}_alpha.png", (result.alpha[b].clamp(0, 1) * 255).round().to(torch.uint8).numpy())
        written.append(out_dir / f"{name}_rgb.png")
    return written


#: bytes of one synthetic view on disk (RGB, mask and instance PNGs at most raw, float32 depth) per pixel, and
#: per view (headers, its transforms.json entry); in memory while the dataset is written (camera, name, JSON)
_SYNTH_DISK_PER_PIXEL, _SYNTH_DISK_PER_VIEW, _SYNTH_MEMORY_PER_VIEW = 9, 4096, 2048


def _synthetic_sizes(scene: SceneOptions, output) -> None:
    """``--views`` / ``--size`` of the synthetic scene: at least 1 view of 8 x 8 pixels, images and a list of views
    that fit in memory, and a dataset that fits on the output's disk (``synth --views 10000000`` stops here)."""
    from .io.outputs import check_disk_space
    from .memory import check_memory, image_memory_estimate

    views, size = scene.num_views, scene.image_size  # >= 1 and >= 8: SceneConfig's ranges
    total = views + max(0, scene.heldout_views)
    check_memory(image_memory_estimate(size, size) + total * _SYNTH_MEMORY_PER_VIEW,
                 f"{total} synthetic views of {size}x{size}", knobs=["--size N (smaller images)", "--views N (fewer)"])
    check_disk_space(output, total * (_SYNTH_DISK_PER_PIXEL * size * size + _SYNTH_DISK_PER_VIEW),
                     f"a synthetic dataset of {total} views of {size}x{size}")


@dataclass
class Synth:
    """Write a labelled synthetic nerfstudio dataset."""

    output: Output
    """dataset folder to write"""
    scene: Annotated[SceneOptions, arg(name="")] = field(default_factory=SceneOptions)
    overwrite: Overwrite = False

    def main(self) -> int:
        from .data.synthetic import make_scene, write_dataset

        _synthetic_sizes(self.scene, self.output)
        scene = make_scene(self.scene.config())
        paths = write_dataset(scene, prepare_output_dir(self.output, self.overwrite))
        print(f"wrote a synthetic dataset with {len(scene.gaussians)} Gaussians, {len(scene.cameras)} views, "
              f"classes {scene.class_names} to {paths['root']}")
        return 0


@dataclass
class OrbitOptions:
    """The cameras rh3dgs render places around a scene that comes without a transforms.json."""

    orbit: Annotated[int, Range(ge=1)] = 36
    """number of cameras on the orbit (one turn)"""
    size: Annotated[int, Range(ge=8)] = 512
    """image width and height in pixels"""
    up: Literal["auto", "x", "-x", "y", "-y", "z", "-z"] = "auto"
    """the scene's up axis (auto: detected from the Gaussians' spread, rh3dgs.cameras.detect_up)"""
    fov: Annotated[float, Range(ge=1.0, le=170.0)] = 50.0
    """field of view in degrees"""
    elevation: Annotated[float, Range(ge=-90.0, le=90.0)] = 20.0
    """height of the orbit above the scene's centre, in degrees"""

    def __post_init__(self) -> None:
        check_fields(self)  # at least 1 view of 8 x 8 pixels, a field of view in [1, 170] degrees


@dataclass
class Render:
    """Render a 3DGS PLY (INRIA, SuperSplat compressed, SPZ) from the cameras of a transforms.json, or, without one,
    from an orbit around it (PNGs, a turntable GIF and the orbit's transforms.json)."""

    scene: ScenePath
    """3DGS PLY (INRIA layout or SuperSplat compressed) or SPZ"""
    output: Output
    """folder of the RGB, depth and alpha PNGs"""
    transforms: Annotated[Optional[str], arg(metavar="PATH")] = None
    """nerfstudio transforms.json (or its folder); without one, an orbit around the scene (--orbit, --up...)"""
    camera: Annotated[OrbitOptions, arg(name="")] = field(default_factory=OrbitOptions)
    images: Images = field(default_factory=ImageOptions)
    overwrite: Overwrite = False

    def main(self) -> int:
        import torch

        from .io.ply import load_ply
        from .rendering import render

        inputs = [self.scene] + ([_transforms_file(self.transforms)] if self.transforms else [])
        out = check_output_dir(self.output, self.overwrite, inputs)
        gaussians = load_ply(self.scene, latents=False)  # RGB only: sem_* columns are not read
        cams, names = self._cameras(gaussians)
        names = _distinct(names, "views")  # images of one name in different folders
        written, extra = [], ""
        with atomic_folder(out) as building:  # swapped in whole when every view is written
            for i in track(range(len(cams)), description="render"):
                with torch.no_grad():
                    r = render(gaussians, cams[i])
                with _writing(out):
                    written += _save_render_pngs(r, names, building, start=i)
            if self.transforms is None:
                with _writing(out):
                    extra = self._turntable(building, cams, written).replace(str(building), str(out))
        print(f"rendered {len(cams)} views of {len(gaussians)} Gaussians to {out}{extra}")
        return 0

    def _cameras(self, gaussians):
        """The transforms.json's cameras, or the orbit's; with the views' names."""
        from .cameras import detect_up, orbit_cameras, scene_bounds
        from .memory import check_memory, render_memory_estimate

        def preflight(views: int, w: int, h: int) -> None:  # one view at a time
            check_memory(render_memory_estimate(len(gaussians), h, w), f"rendering {len(gaussians)} Gaussians at "
                         f"{w}x{h}", knobs=["--downscale N or --size N (a smaller image)"])

        if self.transforms is not None:
            cams, images = _load_cameras(self.images, None, self.transforms, check_images=False, require_images=False,
                                         preflight=preflight)
            return cams, [p.stem[:80] for p in images]
        o = self.camera  # its numbers are in their declared ranges (OrbitOptions)
        preflight(o.orbit, o.size, o.size)
        centre, extent = scene_bounds(gaussians.means, gaussians.opacities)
        up, why = (o.up, "given") if o.up != "auto" else detect_up(gaussians.means, gaussians.opacities)
        distance = 1.1 / math.sin(math.radians(o.fov) / 2)  # the sphere of radius extent fills ~90 % of the view
        print(f"no transforms.json: {o.orbit} orbit cameras around the scene's centre "
              f"({', '.join(f'{float(x):.3g}' for x in centre)}), {distance * extent:.3g} away (its radius "
              f"{extent:.3g} fills the {o.fov:g} degree view), up {up} ({why}; --up to choose)")
        cams = orbit_cameras(centre, extent, up, o.orbit, o.size, o.size, o.fov, o.elevation, distance=distance)
        return cams, cams.names

    @staticmethod
    def _turntable(out: Path, cams, frames: List[Path]) -> str:
        """turntable.gif of the RGB frames (imageio) and the orbit's transforms.json (its images: the frames), so
        the renders are a dataset: ``rh3dgs lift SCENE --data OUT``."""
        import imageio.v3 as iio

        from .io.atomic import atomic_write
        from .io.transforms import save_transforms

        gif = out / "turntable.gif"
        with atomic_write(gif) as f:
            iio.imwrite(f, [iio.imread(p) for p in frames], extension=".gif", duration=80, loop=0)
        save_transforms(out / "transforms.json", cams, frames)
        return f"; turntable {gif}, the orbit's cameras {out / 'transforms.json'}"


@dataclass
class Demo:
    """The synthetic scene end to end: renders, the lift and text queries."""

    output: Output = "outputs/demo"
    """output folder"""
    scene: Annotated[SceneOptions, arg(name="")] = field(default_factory=SceneOptions)
    no_semantic: bool = False
    """only render, skip lift and queries"""
    overwrite: Overwrite = False

    def main(self) -> int:
        import torch

        from .data.synthetic import make_scene, write_dataset
        from .rendering import render

        t0 = time.time()
        _synthetic_sizes(self.scene, self.output)
        out = prepare_output_dir(self.output, self.overwrite)
        # held-out views score the semantic answers
        scene = make_scene(self.scene.config(heldout_views=0 if self.no_semantic else 4))
        data = write_dataset(scene, out / "data")
        steps = 2 if self.no_semantic else 5  # rh3dgs.demo prints [3/5]..[5/5]
        print(f"[1/{steps}] synthetic scene: {len(scene.gaussians)} Gaussians, {len(scene.cameras)} views -> "
              f"{data['root']}")
        renders = out / "renders"
        for i in track(range(len(scene.cameras)), description="render"):
            with torch.no_grad():
                r = render(scene.gaussians, scene.cameras[i])
            _save_render_pngs(r, scene.cameras.names, renders, start=i)
        print(f"[2/{steps}] renders (RGB, depth, alpha PNGs) -> {renders}")
        extra = None
        if not self.no_semantic:
            from . import demo

            extra = demo.run(scene, out, self.scene)
        print(f"done in {time.time() - t0:.1f} s. Results: {out.resolve()}")
        if extra:
            print(extra)
        return 0


def _teacher_config(teacher: TeacherOptions, data: Path) -> TeacherConfig:
    """The TeacherConfig of the teacher options: the same teacher, hence the same cache entries, as an
    ``ns-train rh3dgs`` data manager with that config. ``--teacher auto`` (the default): the teacher whose maps the
    data's feature cache already holds (the most recent, :func:`rh3dgs.teachers.cache.cached_teachers`), else
    ``precomputed``; said in one line."""
    if teacher.checkpoint and not Path(teacher.checkpoint).expanduser().is_file():  # before open_clip is imported
        from .errors import MissingWeightsError

        raise MissingWeightsError(f"--checkpoint {teacher.checkpoint}: checkpoint file not found")
    if teacher.name != "auto":
        return teacher.config()
    from .teachers import default_cache_dir
    from .teachers.cache import cached_teachers

    cache = Path(teacher.cache_dir) if teacher.cache_dir else default_cache_dir(data)
    found = cached_teachers(cache)
    if not found:
        return dataclasses.replace(teacher.config(), name="precomputed")
    spec, folder = found[0]
    others = f" (newest of {len(found)})" if len(found) > 1 else ""
    print(f"teacher: {spec['name']}, the teacher of {folder}{others}; --teacher to choose")
    return TeacherConfig.from_spec(spec, cache_dir=teacher.cache_dir)


def _cache_dir(cache_opt: Optional[str], data: Path, image_paths) -> Path:
    """The feature cache folder (written by extract and lift; default DATA/.rh3dgs_cache, the default of every
    entry point): never the dataset's transforms.json or images."""
    from .teachers import default_cache_dir

    cache = Path(cache_opt) if cache_opt else default_cache_dir(data)
    # undistorted / downscaled copies live in the cache's images/ folder (_load_cameras): the cache's own
    # products, not the user's inputs (their sources are outside it, or the check below names them)
    derived = (cache / "images").resolve()
    sources = [p for p in image_paths if not Path(p).resolve().is_relative_to(derived)]
    check_not_input(cache, [_transforms_file(data), *sources], what="feature cache")
    return cache


def _dataset_maps(cache_opt: Optional[str], teacher, data: Path, image_paths, distributed: bool = False):
    """The teacher maps of the dataset's images: :func:`rh3dgs.teachers.dataset_maps`, the provider the
    nerfstudio data manager uses too (computed into the cache first unless the teacher reads them in place)."""
    from .teachers import dataset_maps

    return dataset_maps(teacher, image_paths, _cache_dir(cache_opt, data, image_paths), distributed=distributed)


def _maps_summary(maps) -> str:
    """``tiny-clip teacher maps: 0 computed, 50 reused in DIR`` (or read in place)."""
    if not maps.cached:
        return f"{maps.teacher.name} teacher maps: {len(maps)} read in place"
    where = Path(maps.files[0]).parent if len(maps) else ""
    return (f"{maps.teacher.name} teacher maps: {maps.stats.get('computed', 0)} computed, "
            f"{maps.stats.get('reused', 0)} reused in {where}")


def _load_cameras(opts: ImageOptions, cache: Optional[str], transforms, check_images: bool,
                  require_images: bool = True, preflight=None):
    """load_transforms with the command's ImageOptions (--downscale, --skip-missing-images, --no-undistort);
    undistorted / downscaled copies go to the feature cache's images/ folder when one is named."""
    import warnings

    from .io.transforms import load_transforms

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        out = load_transforms(transforms, check_images=check_images, require_images=require_images,
                              image_cache=Path(cache) / "images" if cache else None, preflight=preflight,
                              **dataclasses.asdict(opts))
    for w in caught:
        print(f"rh3dgs: warning: {w.message}", file=sys.stderr)
    return out


@dataclass
class Extract:
    """Teacher features of a dataset, cached (K processes: torchrun --nproc_per_node=K -m rh3dgs.cli extract)."""

    data: Annotated[str, arg(metavar="PATH")]
    """dataset folder with transforms.json"""
    teacher: Teacher = field(default_factory=TeacherOptions)
    images: Images = field(default_factory=ImageOptions)

    def main(self) -> int:
        """Single process, or data-parallel under ``torchrun`` (each rank extracts a disjoint shard of the
        missing entries; rank 0 writes the manifest and prints)."""
        from .distributed import process_group_from_env
        from .memory import check_memory, image_memory_estimate

        data = Path(self.data)

        def preflight(views: int, w: int, h: int) -> None:  # one image at a time
            check_memory(image_memory_estimate(h, w), f"reading {w}x{h} images", knobs=["--downscale N"])

        cache = self.teacher.cache_dir
        cams, images = _load_cameras(self.images, cache, data, check_images=True, preflight=preflight)
        with process_group_from_env() as dist:
            tcfg = _teacher_config(self.teacher, data)
            if dist is not None and dist.device.type == "cuda":
                tcfg = dataclasses.replace(tcfg, device=str(dist.device))  # each rank on its LOCAL_RANK GPU
            teacher = tcfg.setup(data)
            maps = _dataset_maps(cache, teacher, data, images, distributed=dist is not None)
            stats = maps.stats
            if dist is None or dist.is_main:
                if not maps.cached:
                    print(f"the {teacher.name} teacher reads its {len(maps)} existing maps in place; "
                          "nothing to extract")
                    return 0
                where = Path(maps.files[0]).parent if len(maps) else cache
                by_rank = stats.get("computed_by_rank")
                over = (f" over {len(by_rank)} processes ({' + '.join(map(str, by_rank))} computed)"
                        if by_rank else "")
                print(f"{len(maps)} feature maps ({stats.get('computed', 0)} computed, {stats.get('reused', 0)} "
                      f"reused){over} in {where}")
        return 0


@dataclass
class _SceneJob:
    """What a job that writes a semantic scene folder from a 3DGS PLY and a dataset names first (lift, distill)."""

    scene: ScenePath
    """3DGS PLY (INRIA layout) in the dataset's frame (or see --frame)"""
    data: Annotated[str, arg(metavar="PATH")]
    """dataset folder with transforms.json (and features/)"""
    output: Output
    """semantic scene folder to write"""
    frame: Literal["auto", "data", "nerfstudio", "capture"] = "auto"
    """frame of the PLY (auto: detected; nerfstudio: ns-export's)"""


@dataclass
class Lift(_SceneJob):
    """Training-free lift of teacher features into a 3DGS PLY -> a semantic scene folder."""

    config: Annotated[Optional[str], arg(metavar="YAML")] = None
    """YAML preset of the lift's settings; options given here win"""
    lift: Annotated[LiftOptions, arg(name="")] = field(default_factory=LiftOptions)
    streaming: bool = False
    """keep nothing across the IRLS passes (least memory)"""
    teacher: Teacher = field(default_factory=TeacherOptions)
    images: Images = field(default_factory=ImageOptions)
    overwrite: Overwrite = False

    def main(self) -> int:
        """Single process, or data-parallel under ``torchrun`` (each rank lifts its share of the views and
        Gaussians, :mod:`rh3dgs.lifting.shard`; rank 0 writes and prints)."""
        from .lifting import lift

        cfg = self.lift.config()
        if self.streaming:
            cfg.cache_projections, cfg.compact_cache = False, False

        def fit(gaussians, cams, maps, checkpoint: Path):
            res = lift(gaussians, cams, maps, cfg, checkpoint=checkpoint)
            return res.field(), res.info, (f"lifted {len(gaussians)} Gaussians ({res.info['observed']} observed, "
                                           f"{res.info['filled']} filled from 3D neighbours) over {len(cams)} views")

        return self.run(cfg, fit, "lift")

    def run(self, cfg: LiftConfig, fit, what: str) -> int:
        """Load the scene, cameras and teacher maps, ``fit(gaussians, cameras, maps, checkpoint) -> (field, info,
        line)``, write the scene folder (rank 0). Under torchrun the process group spans the job; the checkpoint
        folder (in the feature cache, named after the output) lets a rerun of the same command resume."""
        from .distributed import process_group_from_env
        from .io.coordinate_frames import to_data_frame
        from .io.ply import load_ply
        from .io.scene import save_scene
        from .lifting.preflight import preflight_lift
        from .teachers import default_cache_dir, spec_paths

        data = Path(self.data)
        tcfg = _teacher_config(self.teacher, data)
        spec = tcfg.spec(data)
        cache = self.teacher.cache_dir
        inputs = [self.scene, _transforms_file(data), cache or default_cache_dir(data), self.config,
                  *spec_paths(spec)]  # the teacher's own files: features_dir, checkpoint...
        out = check_output_dir(self.output, self.overwrite, inputs)
        gaussians = load_ply(self.scene, latents=False)  # the lift computes the latents
        if len(gaussians) == 0:
            from .errors import PlyFormatError

            raise PlyFormatError(self.scene, "the PLY has 0 vertices: no Gaussians to lift")
        if cfg.latent_dim < 1:  # the API's lift may skip the decoder; a scene folder stores latents and decoder
            raise RangeError("LiftConfig", "latent_dim", cfg.latent_dim, ">= 1 for a scene folder (0 skips the "
                             "decoder: rh3dgs.lift in Python)", flag="--latent-dim")
        with process_group_from_env() as group:
            world, main = (1, True) if group is None else (group.world_size, group.is_main)
            if group is not None and group.device.type == "cuda":
                tcfg = dataclasses.replace(tcfg, device=str(group.device))  # each rank on its LOCAL_RANK GPU
            teacher = tcfg.setup(data)
            d_teacher = int(teacher.dim)

            def preflight(views: int, w: int, h: int) -> None:  # before any per-frame work or image
                preflight_lift(len(gaussians), views, h, w, d_teacher, cfg, device=str(gaussians.device),
                               world_size=world)

            cams, images = _load_cameras(self.images, cache, data, check_images=False, preflight=preflight)
            gaussians, frame = to_data_frame(gaussians, self.scene, cams, data, frame=self.frame, images=images)
            if main and frame != "data":
                print(f"{self.scene}: Gaussians in the {frame} frame, mapped to the dataset's "
                      "(rh3dgs.io.coordinate_frames)")
            estimate = preflight_lift(len(gaussians), len(cams), cams.height, cams.width, d_teacher, cfg,
                                      device=str(gaussians.device), world_size=world)
            if main:
                print(estimate.summary())
            maps = _dataset_maps(cache, teacher, data, images, distributed=group is not None)
            if main:
                print(_maps_summary(maps))
            if group is not None:
                gaussians = gaussians.to(group.device)
            resume = _resume_folder(Path(cache) if cache else default_cache_dir(data), what, out, main)
            field, info, line = fit(gaussians, cams, maps, resume)
            if not main:
                return 0
            table = {}
            if hasattr(teacher, "text_queries"):
                names = teacher.text_queries()
                table = dict(zip(names, teacher.encode_text(names)))
            out = save_scene(prepare_output_dir(out, self.overwrite, inputs), gaussians.to("cpu"), field.to("cpu"),
                             cams, images, teacher=spec, text_embeddings=table, info=info)
            if resume is not None:  # done: nothing to resume (and no folder left that was not there)
                shutil.rmtree(resume, ignore_errors=True)
                for empty in (resume.parent, resume.parent.parent):
                    with contextlib.suppress(OSError):
                        empty.rmdir()
            over = f" {_shares(info)}" if group is not None else ""
            resumed = (f" (resumed after pass {info['resumed_after_pass']})" if "resumed_after_pass" in info else
                       f" (resumed at step {info['resumed_at_step']})" if "resumed_at_step" in info else "")
            print(f"{line}{over} in {info['seconds']:.1f} s{resumed} -> {out}")
        return 0


def _resume_folder(cache: Path, what: str, out: Path, main: bool) -> Optional[Path]:
    """The checkpoint folder of the job writing ``out`` (in the feature cache's ``resume/``), or None where it cannot
    be written (a read-only dataset: the job runs without checkpoints, a rerun starts over)."""
    folder = cache / "resume" / f"{what}-{hashlib.sha1(str(out.resolve()).encode()).hexdigest()[:12]}"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        probe = folder.parent / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        if main:
            print(f"rh3dgs: warning: no checkpoints ({folder.parent}: {exc.strerror or exc}); a rerun starts over",
                  file=sys.stderr)
        return None
    return folder


def _shares(info: dict) -> str:
    """"over 2 processes (views 4 + 4, Gaussians owned 500 + 500, seen 800 + 790)" of a distributed job's info
    (each rank's views; the Gaussians whose sums it finished and those its views see in the lift)."""
    join = lambda xs: " + ".join(map(str, xs))  # noqa: E731
    gaussians = (f", Gaussians owned {join(info['owned_by_rank'])}, seen {join(info['seen_by_rank'])}"
                 if "owned_by_rank" in info else "")
    return f"over {info['world_size']} processes (views {join(info['views_by_rank'])}{gaussians})"


@dataclass
class DistillOptions(DistillConfig):
    """:class:`DistillConfig` on the command line: its own fields (``--steps``, ``--view-order 3 0 5 ...``); its
    objective and lift settings come from ``--config YAML`` (their defaults otherwise)."""

    init: Literal["lift", "pca"] = DistillConfig.init
    seed: Annotated[int, arg(name="distill-seed", help="seed of the views' order (and of init=pca's latents); "
                                                         "--seed is the teacher's")] = DistillConfig.seed
    objective: Annotated[ObjectiveConfig, Suppress] = field(default_factory=ObjectiveConfig)
    lift: Annotated[LiftConfig, Suppress] = field(default_factory=LiftConfig)

    def config(self) -> DistillConfig:
        return as_config(DistillConfig, self)


@dataclass
class Distill(_SceneJob):
    """The lift, then semantic distillation (the VCD + VFM + LIC objective) on the PLY's fixed Gaussians -> a semantic
    scene folder. Data-parallel over K processes: torchrun --nproc_per_node=K -m rh3dgs.cli distill ...; a rerun of
    the same command resumes from the last checkpoint (--checkpoint-every steps)."""

    config: Annotated[Optional[str], arg(metavar="YAML")] = None
    """YAML preset of the distillation's settings (objective: and lift: as mappings); options given here win"""
    distill: Annotated[DistillOptions, arg(name="")] = field(default_factory=DistillOptions)
    teacher: Teacher = field(default_factory=TeacherOptions)
    images: Images = field(default_factory=ImageOptions)
    overwrite: Overwrite = False

    def main(self) -> int:
        from .distill import distill

        cfg = self.distill.config()
        job = Lift(scene=self.scene, data=self.data, output=self.output, frame=self.frame, teacher=self.teacher,
                   images=self.images, overwrite=self.overwrite)

        def fit(gaussians, cams, maps, checkpoint: Path):
            res = distill(gaussians, cams, maps, cfg, progress=True, checkpoint=checkpoint)
            return res.field(), res.info, (f"distilled {len(gaussians)} Gaussians ({res.info['valid']} with a feature) "
                                           f"over {len(cams)} views, {cfg.steps} steps (final loss "
                                           f"{res.info['final_loss']:.4g})")

        return job.run(dataclasses.replace(cfg.lift, latent_dim=cfg.latent_dim), fit, "distill")


Negatives = Annotated[Optional[str], arg(help="semicolon-separated negative phrases", metavar="TEXT",
                                         help_behavior_hint=f"(default: {format_queries(CANONICAL_NEGATIVES)})")]
Threshold = Annotated[query_types.Threshold, arg(help="selection threshold on the relevancy, in [0, 1]")]


@dataclass
class Query:
    """Relevancy PNGs over the cameras and 3D selections for text queries."""

    scene: ScenePath
    """semantic scene folder (from rh3dgs lift or rh3dgs demo)"""
    queries: Annotated[str, Positional, arg(metavar="QUERIES")]
    """semicolon-separated phrases, e.g. 'red mug;chair'"""
    output: Output
    """folder of the PNGs and selections"""
    negatives: Negatives = None
    threshold: Threshold = THRESHOLD
    views: Annotated[Optional[Tuple[int, ...]], arg(metavar="INT ...", help_behavior_hint="(default: all)")] = None
    """camera indices"""
    overwrite: Overwrite = False

    def __post_init__(self) -> None:
        check_fields(self)  # --threshold in [0, 1]

    def main(self) -> int:
        from .api import load
        from .io.atomic import atomic_save_png
        from .viz import colorize, highlight, result_sheet, with_colorbar

        out = check_output_dir(self.output, self.overwrite, scene_inputs(self.scene))
        scene = load(self.scene)
        queries = list(parse_queries(self.queries))
        if not queries:
            raise ConfigError("no query given (semicolon-separated phrases, e.g. \"red mug;chair\")")
        negatives = None if self.negatives is None else list(parse_queries(self.negatives))
        if scene.cameras is None:
            raise ConfigError(f"{self.scene}: the scene has no cameras (transforms.json) to render queries from")
        views = _views_arg(self.views, len(scene.cameras))
        names = _distinct([n[:80] for n in scene.cameras.names] or
                          [f"view_{i:05d}" for i in range(len(scene.cameras))], "views")
        stems = dict(zip(queries, _distinct([_stem(q) for q in queries], "queries")))  # "red mug" / "red_mug"
        scene.encode(queries)  # an unknown query stops here, before any file is written
        if negatives:
            scene.encode(negatives)
        with atomic_folder(out) as building:  # swapped in whole when every file is written
            for i in track(views, description="query: relevancy"):
                rel = scene.render_relevancy(i, queries, negatives)
                rgb = scene.render(i)
                for q, r in zip(queries, rel):
                    with _writing(out):
                        atomic_save_png(building / f"{names[i]}_{stems[q]}_relevancy.png", with_colorbar(
                            colorize(r, vmin=0.0, vmax=1.0), 0.0, 1.0, "relevancy (LERF, 0-1)", self.threshold))
                        atomic_save_png(building / f"{names[i]}_{stems[q]}_overlay.png", with_colorbar(
                            highlight(rgb, r, threshold=self.threshold), 0.0, 1.0,
                            f"relevancy above {self.threshold:g} (0-1)", self.threshold))
                with _writing(out):
                    atomic_save_png(building / "sheets" / f"{names[i]}.png",
                                    result_sheet(rgb, rel, queries, self.threshold, title=names[i]))
            for q in track(queries, description="query: selections"):
                sel = scene.select(q, threshold=self.threshold, negatives=negatives)
                stem = stems[q]
                with _writing(out / f"{stem}.ply"):
                    scene.export_ply(building / f"{stem}.ply", mask=sel)
                print(f"'{q}': {int(sel.sum())} of {len(scene)} Gaussians above {self.threshold} -> "
                      f"{out / (stem + '.ply')}")
        print(f"result sheets (render, relevancy, selection per query; start here): {out / 'sheets'}/<view>.png, "
              f"{len(views)} views; single relevancy / overlay PNGs ({len(queries)} queries) -> {out}")
        return 0


Latents = Annotated[bool, arg(help="add the field's latents as sem_* columns (read by rh3dgs; other tools "
                                  "ignore them)")]
Extra = Annotated[bool, arg(help="also the scene's other per-Gaussian columns (class_id...), as floats; without: "
                                "exactly the INRIA 3DGS properties")]
LatentDtype = Annotated[Literal["float32", "float16"],
                        arg(help="with --latents: float32 (a standard PLY float) or float16 (compact, rh3dgs-only)")]


@dataclass
class Select:
    """Write the Gaussians relevant to a query as a plain 3DGS PLY."""

    scene: ScenePath
    """semantic scene folder"""
    query: Annotated[str, Positional, arg(metavar="QUERY")]
    """a phrase, e.g. 'red mug'"""
    output: Output
    """PLY file to write"""
    threshold: Threshold = THRESHOLD
    negatives: Negatives = None
    latents: Latents = False
    latent_dtype: LatentDtype = "float32"
    extra: Extra = False
    overwrite: Overwrite = False

    def __post_init__(self) -> None:
        check_fields(self)  # --threshold in [0, 1]

    def main(self) -> int:
        from .api import load

        out = check_output_file(self.output, self.overwrite, scene_inputs(self.scene))
        scene = load(self.scene)
        negatives = None if self.negatives is None else list(parse_queries(self.negatives))
        sel = scene.select(self.query, threshold=self.threshold, negatives=negatives)
        with _writing(out):
            out = scene.export_ply(out, mask=sel, latents=self.latents, latent_dtype=self.latent_dtype,
                                   extra=self.extra)
        print(f"'{self.query}': {int(sel.sum())} of {len(scene)} Gaussians above {self.threshold} -> {out}")
        return 0


@dataclass
class Export:
    """Write a scene as one plain 3DGS PLY (--latents: with sem_* latents)."""

    scene: ScenePath
    """semantic scene folder, ns-train config.yml or PLY"""
    output: Output
    """PLY file to write"""
    latents: Latents = False
    latent_dtype: LatentDtype = "float32"
    extra: Extra = False
    overwrite: Overwrite = False

    def main(self) -> int:
        from .api import load

        out = check_output_file(self.output, self.overwrite, scene_inputs(self.scene))
        scene = load(self.scene)
        with _writing(out):
            out = scene.export_ply(out, latents=self.latents, latent_dtype=self.latent_dtype, extra=self.extra)
        with_latents = self.latents and scene.field is not None
        what = (" with sem_* latents" if with_latents else
                " (INRIA 3DGS PLY" + (" + extra columns)" if self.extra and scene.gaussians.extra else ")"))
        print(f"{len(scene)} Gaussians{what} -> {out}")
        return 0


#: the commands, by name (``rh3dgs NAME --help``)
COMMANDS = {"demo": Demo, "synth": Synth, "render": Render, "extract": Extract, "lift": Lift, "distill": Distill,
            "query": Query,
            "select": Select, "export": Export, "eval": Eval, "view": View}
Command = Union[tuple(Annotated[cls, subcommand(name)] for name, cls in COMMANDS.items())]  # type: ignore[misc]


@dataclass
class Rh3dgs:
    """Robust open-vocabulary semantic 3D Gaussian Splatting."""

    command: Annotated[Command, arg(name="")]
    debug: bool = False
    """show tracebacks of user errors"""
    max_memory: Annotated[Optional[str], arg(metavar="SIZE", help_behavior_hint="(default: the memory available)")] \
        = None
    """refuse jobs whose memory estimate exceeds SIZE, e.g. 8G or 512M"""


_CONVERSIONS = (("invalid literal for int() with base 10: ", "invalid int value: "),
                ("could not convert string to float: ", "invalid float value: "))


def _usage_message(event, prog: str) -> str:
    """One line for tyro's parse-error ``event`` (tyro 1.0's ``_errors`` events) of the command line of ``prog``
    ("rh3dgs" or "rh3dgs COMMAND")."""
    from tyro import _errors as E

    def name(a) -> str:
        return a.lowered.metavar if a.is_positional() and a.lowered.metavar else a.display_name()

    if isinstance(event, E.MissingSubcommand):
        names = [n for n in event.subcommand_spec.parser_from_name]
        return f"{prog}: no command given; one of {', '.join(names)}"
    if isinstance(event, E.UnrecognizedArgs):
        tok = event.tokens
        if prog == "rh3dgs" and tok and not tok[0].startswith("-"):
            return f"rh3dgs: unknown command {tok[0]!r}"
        return f"{prog}: unrecognized arguments: {' '.join(tok)}"
    if isinstance(event, E.MissingArgs):
        return "; ".join(f"{p}: the following arguments are required: {', '.join(name(a) for a in args)}"
                         for p, args in event._args_from_prog().items())
    if isinstance(event, E.InvalidChoice):
        return (f"{prog}: argument {name(event.argument)}: invalid choice {event.value!r} "
                f"(choose from {', '.join(event.choices)})")
    if isinstance(event, E.BadValue):
        return f"{prog}: argument {name(event.argument)}: expected a value"
    if isinstance(event, E.InstantiationFailure):
        message = _one_line(event.message).split(". Got errors")[0]
        for theirs, ours in _CONVERSIONS:
            message = message.replace(theirs, ours)
        where = f"argument {name(event.argument)}: " if event.argument is not None else ""
        return f"{prog}: {where}{message}"
    return f"{prog}: {type(event).__name__}"


def _global_options(argv: List[str]) -> Tuple[List[str], int]:
    """The global options before the command (without their values) and the index of the first word after
    them: ``rh3dgs --max-memory 8G --debug lift ...`` -> (["--max-memory", "--debug"], 3)."""
    opts, i = [], 0
    while i < len(argv) and argv[i].startswith("-"):
        opts.append(argv[i])
        i += 2 if argv[i] == "--max-memory" else 1
    return opts, i


def _command_of(argv: List[str]) -> Optional[str]:
    """The command ``argv`` names (the first word after the global options), if it is one of ours."""
    i = _global_options(argv)[1]
    return argv[i] if i < len(argv) and argv[i] in COMMANDS else None


def _on_off(default: str) -> str:
    """The help's hint of a boolean flag: ``--no-vcd`` says "(default: on)", not tyro's "(default: True)"."""
    return f"(default: {'on' if default == 'True' else 'off'})"


def _switch_registry(hide: Optional[Dict[type, Tuple[str, ...]]] = None):
    """A tyro registry under which every boolean field of a dataclass shows its default as on / off (its help text,
    the field's docstring, describes the setting, so that it reads for ``--flag`` and ``--no-flag`` alike).
    ``hide`` ({dataclass: field names}) leaves those fields out of the help (only a help is printed with it)."""
    import dataclasses as dc

    from tyro.constructors import ConstructorRegistry
    from tyro.constructors._struct_spec_dataclass import dataclass_rule  # tyro>=1.0.17,<1.1 (as _errors below)

    registry = ConstructorRegistry()
    hide = hide or {}

    def shown(f, typ):
        if f.name in hide.get(typ, ()):
            return dc.replace(f, type=Annotated[f.type, Suppress])
        if _unannotated(f.type) is bool:
            return dc.replace(f, type=Annotated[f.type, arg(help_behavior_hint=_on_off)])
        return f

    @registry.struct_rule
    def switches(info):
        spec = dataclass_rule(info)
        if spec is None:
            return None
        return dc.replace(spec, fields=tuple(shown(f, _unannotated(info.type)) for f in spec.fields))

    return registry


#: What ``rh3dgs COMMAND --help`` leaves to ``--help-all`` (the settings a first run does not change), by command:
#: {dataclass: its fields left out}, and the help's last line saying what they are. Both parse every option.
BRIEF_HELP = {
    "lift": ({LiftOptions: ("vcd", "extrapolate", "max_rate", "tol", "tol_quantile", "min_coverage",
                            "guide_sigma_color", "min_weight", "min_visibility", "fill_neighbors", "fill_color_sigma",
                            "fill_visibility_power", "fill_radius", "tile_size", "cache_projections", "compact_cache",
                            "record_contributions", "teacher_footprint", "max_batch_gaussians"),
              TeacherOptions: ("image_size", "scales", "crop_overlap", "dense_path", "seed", "batch_size")},
             "More options (the tuning of the IRLS, the fill and the rasterizer, VCD's terms, the CLIP\n"
             "teacher's crops): rh3dgs lift --help-all"),
}


def _unannotated(typ):
    """``Annotated[T, ...]`` -> T (nested too); other types as they are."""
    from typing import get_args, get_origin

    while get_origin(typ) is Annotated:
        typ = get_args(typ)[0]
    return typ


def _tyro(argv: List[str], default=None) -> Rh3dgs:
    """tyro over :class:`Rh3dgs`; a command line that does not parse raises :class:`UsageError` (one line).
    ``--help`` of a command in :data:`BRIEF_HELP` lists its common options, ``--help-all`` every option."""
    from tyro._errors import on_parse_error  # tyro 1.0's parse-error events (pinned: tyro>=1.0.17,<1.1)

    command = _command_of(argv)
    prog = f"rh3dgs {command}" if command else "rh3dgs"
    brief = BRIEF_HELP.get(command) if {"-h", "--help"} & set(argv) else None
    argv = ["--help" if a == "--help-all" else a for a in argv]

    def hook(event):
        raise UsageError(f"{_usage_message(event, prog)} (see {prog} --help)")

    # booleans as one flag each, named for the change from the default: --overwrite, --no-vcd, --no-guided
    kwargs = dict(args=argv, prog="rh3dgs", config=(FlagCreatePairsOff,),
                  registry=_switch_registry(brief[0] if brief else None))
    if default is not None:
        kwargs["default"] = default
    try:
        with on_parse_error(hook):
            return tyro.cli(Rh3dgs, **kwargs)
    except SystemExit as exc:
        if brief and not exc.code:  # the brief help was printed
            print(brief[1])
        raise


def parse(argv: List[str]) -> Rh3dgs:
    """The command line ``argv`` (without the program name) as an :class:`Rh3dgs`; ``rh3dgs lift --config
    YAML``'s preset becomes the lift's defaults (options given on the command line still win).

    >>> parse(["lift", "scene.ply", "--data", "data", "--output", "out", "--no-vcd"]).command.lift.use_vcd
    False
    """
    root = _tyro(argv)
    cmd = root.command
    if isinstance(cmd, Lift) and cmd.config:
        preset = as_config(LiftOptions, load_preset(cmd.config, LiftConfig))
        default = Rh3dgs(command=Lift(scene=tyro.MISSING, data=tyro.MISSING, output=tyro.MISSING, lift=preset))
        root = _tyro(argv, default=default)
    elif isinstance(cmd, Distill) and cmd.config:
        preset = as_config(DistillOptions, load_preset(cmd.config, DistillConfig))
        default = Rh3dgs(command=Distill(scene=tyro.MISSING, data=tyro.MISSING, output=tyro.MISSING,
                                         distill=preset))
        root = _tyro(argv, default=default)
    return root


def main(argv: Optional[List[str]] = None) -> int:
    """``rh3dgs ARGV``; returns the exit code: 0, or 2 after one line ``rh3dgs: error: ...`` on stderr for
    bad input (a command line that does not parse, a file or value rh3dgs refuses: rh3dgs.errors, or an
    operating-system error on a named path). ``--debug`` re-raises the error (traceback)."""
    from .progress import silence_known_warnings

    silence_known_warnings()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _global_flag(argv, "--debug")
    try:
        with command_line(argv):  # range errors name the option as typed (rh3dgs.ranges)
            root = parse(argv)
        from .memory import memory_limit

        with memory_limit(root.max_memory), _one_line_warnings():
            return int(root.command.main() or 0)
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


@contextlib.contextmanager
def _one_line_warnings():
    """Warnings of rh3dgs's own types printed as ``rh3dgs: warning: ...`` (one line each) while a command runs."""
    import warnings

    from .teachers.tiny import RandomTeacherWarning

    show = warnings.showwarning

    def one_line(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, RandomTeacherWarning):
            print(f"rh3dgs: warning: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    warnings.showwarning = one_line
    try:
        yield
    finally:
        warnings.showwarning = show


def _global_flag(argv: List[str], flag: str) -> bool:
    """Whether ``flag`` is among the options before the command (``rh3dgs --debug lift ...``)."""
    return flag in _global_options(argv)[0]


def _one_line(text: str) -> str:
    return " ".join(text.split()) if "\n" in text else text


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
