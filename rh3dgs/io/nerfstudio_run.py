"""Read a trained ``ns-train rh3dgs`` run back: Gaussians with latents, decoder, cameras, teacher.

* :func:`load_nerfstudio_scene` ``(config.yml) -> (Gaussians, decoder [D, d], Cameras | None, teacher spec)``
* :func:`export_semantic_ply` ``(config.yml, out.ply)``: standard 3DGS PLY + ``sem_*`` latents.
* :func:`load_run_config` ``(config.yml)``: the run's TrainerConfig, read without running code (below).

This is a core reader: it names no module of the plugin (:mod:`rh3dgs.nerfstudio`). The
config classes it builds are the ones the run's ``config.yml`` names (nerfstudio's and the
plugin's dataclasses), so reading a run needs nerfstudio installed, as training it did.

config.yml without code execution. nerfstudio writes the config with ``yaml.dump`` and reads
it back with ``yaml.Loader``, which calls any Python callable a file names:
``!!python/object/apply:os.system ["..."]`` runs a shell command. :func:`load_run_config`
parses it with PyYAML's ``SafeLoader`` plus exactly the tags nerfstudio writes for its
configs, each one restricted:

* ``!!python/object:M.Cls`` (a mapping): ``Cls`` must be a dataclass of a ``nerfstudio.`` /
  ``rh3dgs.`` module (or of an installed nerfstudio plugin's package: :func:`config_modules`); built with ``Cls.__new__`` and its fields set (no ``__init__`` runs, as
  with ``yaml.Loader``);
* ``!!python/object/apply:pathlib.PosixPath [parts]``: ``Path(*parts)`` (also ``Path`` and
  ``WindowsPath``; ``PurePath``, ``PurePosixPath``, ``PureWindowsPath`` as themselves);
* ``!!python/object/apply:M.Enum [value]``: ``Enum(value)`` for an ``enum.Enum`` of those modules;
* ``!!python/name:M.Cls ''``: a class of ``nerfstudio.``, ``rh3dgs.`` or ``torch.optim.``;
* ``!!python/tuple``: a tuple.

Any other ``!!python/...`` tag (``object/apply`` of anything else, ``object/new``, ``module``,
names of other modules) is refused before anything is imported: :class:`NerfstudioRunError`
``"<config.yml>: line L: ..."``, one line naming the file.

Frames: nerfstudio trains in its *normalised* frame (the dataparser re-orients, centres and
scales the poses; ``dataparser_transforms.json`` in the run folder records it, with ns-process-data's
``applied_transform`` folded in: :mod:`rh3dgs.io.coordinate_frames`). ``frame="data"`` (default) maps the
Gaussians back to the frame of the dataset's own ``transforms.json`` (means, log-scales, rotations and
the view-dependent SH coefficients: :func:`rh3dgs.io.coordinate_frames.transform_gaussians`), so they line up with
the cameras that :func:`rh3dgs.load_transforms` reads; ``frame="nerfstudio"`` keeps the training frame
and transforms the cameras instead.

Paths: ``config.yml`` keeps the paths as typed on the ``ns-train`` command line (``--data data/synth``).
They are resolved once, here, against the folder ``ns-train`` ran in (:func:`training_dir`: found from
the run folder's place, ``<folder>/<output_dir>/<experiment>/<method>/<timestamp>``), and handed on
absolute: the dataset's cameras and the teacher spec (``features_dir``, ``checkpoint``, ``cache_dir``)
name the same files whatever the working directory.

Checkpoints are verified first (:func:`verify_checkpoint`: the CRC-32 of every record of torch's zip,
the records' sizes against the memory budget), then read with ``torch.load(weights_only=True)`` (what
torch >= 2.6 does by default; rh3dgs checkpoints hold only tensors and plain containers). A checkpoint that needs
full unpickling (e.g. written by another nerfstudio model) is retried with
``weights_only=False`` only when ``trust_checkpoint=True``.
"""
from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import importlib
import os
import pathlib
import pickle
import warnings
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

import torch
import yaml
from torch import Tensor

from ..cameras import Cameras, OPENGL_TO_OPENCV
from ..errors import Rh3dgsError
from ..ranges import RangeError, check_fields
from ..gaussians import SH_C0, Gaussians
from .coordinate_frames import (DATAPARSER_TRANSFORMS, Similarity, nerfstudio_to_data, rotate_sh, transform_c2w,
                     transform_gaussians)

__all__ = ["load_nerfstudio_scene", "run_images", "export_semantic_ply", "load_run_config", "parse_run_config",
           "config_modules", "find_checkpoint", "checkpoints_newest_first", "load_checkpoint", "verify_checkpoint",
           "rotate_sh", "training_dir", "NerfstudioRunError"]

PathLike = Union[str, os.PathLike]


class NerfstudioRunError(Rh3dgsError):
    """A nerfstudio run folder / config / checkpoint that cannot be read."""


# ------------------------------------------------------------------------- config.yml
_CORE_MODULES = ("nerfstudio.", "rh3dgs.")
_PLUGIN_GROUPS = ("nerfstudio.method_configs", "nerfstudio.dataparser_configs")
_PLUGIN_ENV = ("NERFSTUDIO_METHOD_CONFIGS", "NERFSTUDIO_DATAPARSER_CONFIGS")


@functools.lru_cache(maxsize=None)
def config_modules() -> Tuple[str, ...]:
    """Module prefixes whose dataclasses, enums and classes a run config may name: nerfstudio's, rh3dgs', and
    the top-level package of every installed nerfstudio plugin (its ``nerfstudio.method_configs`` /
    ``nerfstudio.dataparser_configs`` entry points, ``NERFSTUDIO_METHOD_CONFIGS``): code nerfstudio imports
    anyway, so that another method's run (e.g. a LERF run) still opens where rh3dgs is installed."""
    from importlib.metadata import entry_points

    tops = set()
    try:
        for group in _PLUGIN_GROUPS:
            tops.update(ep.value.split(":")[0].split(".")[0] for ep in entry_points(group=group))
    except Exception:  # noqa: BLE001 - broken package metadata: only the core modules
        pass
    for var in _PLUGIN_ENV:
        for item in os.environ.get(var, "").split(","):
            target = item.partition("=")[2].strip()
            if target:
                tops.add(target.split(":")[0].split(".")[0])
    tops.discard("")
    return _CORE_MODULES + tuple(sorted(f"{t}." for t in tops if f"{t}." not in _CORE_MODULES))


# a path written on any OS is this OS's Path (yaml.Loader cannot build a WindowsPath on Linux)
_PATH_CLASSES = {**{f"pathlib.{n}": pathlib.Path for n in ("Path", "PosixPath", "WindowsPath")},
                 **{f"pathlib.{n}": getattr(pathlib, n) for n in ("PurePath", "PurePosixPath", "PureWindowsPath")}}
_YAML_PYTHON = "tag:yaml.org,2002:python/"


def _refuse(node, problem: str):
    """ConstructorError ``"<tag as written, e.g. !!python/name:x.Y> <problem>"`` at ``node``."""
    tag = node.tag.replace("tag:yaml.org,2002:", "!!", 1)
    return yaml.constructor.ConstructorError(None, None, f"{tag} {problem}", node.start_mark)


def _find(name: str, node, classes: bool = False) -> Any:
    """``module.attr`` for a module under :func:`config_modules` (``classes``: also ``torch.optim.``, for the
    optimizers a config names by class); nothing is imported for any other name."""
    modules = config_modules() + (("torch.optim.",) if classes else ())
    module, _, attr = name.rpartition(".")
    if not module or not attr or not (module + ".").startswith(modules):
        raise _refuse(node, "is not allowed: a nerfstudio run config names only classes of "
                            f"{', '.join(m.rstrip('.') for m in modules)}")
    try:
        with warnings.catch_warnings():  # a run written before a module moved names its old path (rh3dgs._moved)
            warnings.simplefilter("ignore", DeprecationWarning)
            return getattr(importlib.import_module(module), attr)
    except Exception as exc:  # noqa: BLE001 - ImportError, or what the module raises on import
        raise _refuse(node, f"names {name}, which cannot be imported ({type(exc).__name__}: {exc})") from None


def _python_object(loader, suffix: str, node):
    cls = _find(suffix, node)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)) or not isinstance(node, yaml.MappingNode):
        raise _refuse(node, "is not a config dataclass with fields")
    obj = cls.__new__(cls)
    yield obj
    state = loader.construct_mapping(node, deep=True)
    if not all(isinstance(k, str) for k in state):
        raise _refuse(node, "has field names that are not strings")
    try:
        if hasattr(obj, "__setstate__"):  # as yaml.Loader does (a config class may complete itself there)
            obj.__setstate__(state)
        else:
            vars(obj).update(state)
        check_fields(obj)  # the numbers a run stores are checked as the command line checks them
    except RangeError as e:
        raise _refuse(node, f"holds a value out of range: {e}") from None


def _python_apply(loader, suffix: str, node):
    if not isinstance(node, yaml.SequenceNode):
        raise _refuse(node, "must be followed by a list of arguments")
    cls = _PATH_CLASSES.get(suffix)
    if cls is None:
        cls = _find(suffix, node)
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
            raise _refuse(node, "is not allowed: only paths and enums are built from arguments")
    args = loader.construct_sequence(node, deep=True)
    if not all(isinstance(a, (str, int, float)) for a in args) or (issubclass(cls, enum.Enum) and len(args) != 1):
        raise _refuse(node, f"has unexpected arguments {args!r}"[:200])
    try:
        return cls(*args)
    except (TypeError, ValueError) as exc:
        raise _refuse(node, f"cannot be built ({exc})") from None


def _python_name(loader, suffix: str, node):
    obj = _find(suffix, node, classes=True)
    if not isinstance(obj, type):
        raise _refuse(node, "is not a class")
    return obj


def _python_other(loader, suffix: str, node):
    raise _refuse(node, "is not allowed in a nerfstudio run config (only config dataclasses, paths, "
                        "enums, classes and tuples are)")


class _RunConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` plus the restricted nerfstudio config tags (module docstring)."""


_RunConfigLoader.add_constructor(_YAML_PYTHON + "tuple", lambda loader, node: tuple(loader.construct_sequence(node)))
_RunConfigLoader.add_multi_constructor(_YAML_PYTHON + "object:", _python_object)
_RunConfigLoader.add_multi_constructor(_YAML_PYTHON + "object/apply:", _python_apply)
_RunConfigLoader.add_multi_constructor(_YAML_PYTHON + "name:", _python_name)
_RunConfigLoader.add_multi_constructor(_YAML_PYTHON, _python_other)  # last: every other python/ tag


def parse_run_config(text: Union[str, bytes], source: PathLike):
    """A run config's YAML ``text`` (read from ``source``, which the errors name) -> its TrainerConfig, parsed
    without running code (module docstring). What :func:`load_run_config` and the plugin's guard of
    nerfstudio's own ``yaml.load`` calls (:mod:`rh3dgs.nerfstudio.run_guard`) use."""
    try:
        return yaml.load(text, Loader=_RunConfigLoader)
    except yaml.MarkedYAMLError as e:
        line = f"line {e.problem_mark.line + 1}: " if e.problem_mark is not None else ""
        raise NerfstudioRunError(f"{source}: {line}cannot read the nerfstudio config ({e.problem})") from None
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        msg = " ".join(str(e).split())
        raise NerfstudioRunError(f"{source}: cannot read the nerfstudio config ({type(e).__name__}: {msg})") from None


def load_run_config(config_yml: PathLike):
    """The TrainerConfig stored in a run's ``config.yml``, parsed without running code (module docstring)."""
    from ..memory import read_text_sized

    path = Path(config_yml)
    if not path.is_file():
        raise NerfstudioRunError(f"{path}: nerfstudio config file not found")
    try:
        text = read_text_sized(path, "a nerfstudio config")
    except (OSError, ValueError) as e:
        raise NerfstudioRunError(f"{path}: cannot read the nerfstudio config ({type(e).__name__}: {e})") from None
    return parse_run_config(text, path)


def checkpoints_newest_first(folder: Path) -> List[Tuple[int, Path]]:
    """``(step, path)`` of the ``step-<int>.ckpt`` files in ``folder``, newest step first (other names ignored)."""
    out = []
    for p in Path(folder).glob("step-*.ckpt"):
        try:
            out.append((int(p.stem.split("-", 1)[1]), p))
        except ValueError:
            continue
    return sorted(out, reverse=True)


def find_checkpoint(config_yml: PathLike, config=None, step: Optional[int] = None) -> Path:
    """``<run>/<relative_model_dir>/step-XXXXXXXXX.ckpt`` (latest, or ``step``); the run folder is
    the config's folder, so runs can be moved and loaded from any working directory."""
    config = config if config is not None else load_run_config(config_yml)
    rel = Path(getattr(config, "relative_model_dir", "nerfstudio_models"))
    folder = Path(config_yml).parent / rel
    ckpts = checkpoints_newest_first(folder) if folder.is_dir() else []
    if not ckpts:
        raise NerfstudioRunError(f"{folder}: no step-*.ckpt checkpoint in the run folder")
    if step is None:
        return ckpts[0][1]
    p = folder / f"step-{int(step):09d}.ckpt"
    if not p.is_file():
        raise NerfstudioRunError(f"{p}: checkpoint for step {step} not found")
    return p


def verify_checkpoint(path: PathLike) -> int:
    """Check a checkpoint before anything is unpickled (:func:`rh3dgs.io.npy.check_torch_zip`: the CRC-32 of
    every record of torch's zip, the records' sizes against the memory budget); returns the bytes they hold.
    Empty, truncated, damaged or foreign files are one :class:`NerfstudioRunError` line naming the file."""
    from .npy import check_torch_zip

    return check_torch_zip(path, lambda p, msg: NerfstudioRunError(f"{p}: {msg}"), "checkpoint")


def load_checkpoint(path: PathLike, trust_checkpoint: bool = False) -> Dict[str, Any]:
    """:func:`verify_checkpoint`, then ``torch.load`` with ``weights_only=True`` (memory-mapped); with
    ``trust_checkpoint`` falls back to full unpickling. Every failure is one :class:`NerfstudioRunError` line."""
    verify_checkpoint(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        if not trust_checkpoint:
            raise NerfstudioRunError(f"{path}: checkpoint needs full unpickling (weights_only=False); pass "
                                     f"trust_checkpoint=True if you trust it ({str(e).splitlines()[0]})") from None
        return torch.load(path, map_location="cpu", weights_only=False)
    except (RuntimeError, OSError, EOFError, ValueError, KeyError, TypeError) as e:
        msg = " ".join(str(e).split())[:200]
        raise NerfstudioRunError(f"{path}: cannot load the checkpoint ({type(e).__name__}: {msg})") from None


def _model_state(ckpt: Dict[str, Any], path: Path) -> Dict[str, Tensor]:
    state = ckpt.get("pipeline", ckpt)
    out = {}
    for k, v in state.items():
        for prefix in ("_model.module.", "_model."):
            if k.startswith(prefix):
                out[k[len(prefix):]] = v
                break
    if "gauss_params.means" not in out:
        raise NerfstudioRunError(f"{path}: no Gaussian parameters (_model.gauss_params.*) in the checkpoint")
    return out


def training_dir(config_yml: PathLike, config) -> Path:
    """The folder ``ns-train`` ran in, against which the relative paths of ``config.yml`` are read.

    nerfstudio writes the paths as given on its command line (``--data data/synth``), relative to
    the working directory of ``ns-train``, and lays the run out as
    ``<that folder>/<output_dir>/<experiment_name>/<method_name>/<timestamp>/config.yml``. With a
    relative ``output_dir`` that folder is found from where the run folder is now, so a run and its
    data moved together, or opened from any working directory, still read; with an absolute
    ``output_dir`` (or a renamed run folder) it cannot be told, and the working directory is used,
    as nerfstudio's own ``ns-viewer`` / ``ns-eval`` do.
    """
    run = Path(os.path.abspath(config_yml)).parent
    try:
        out = Path(getattr(config, "output_dir", "outputs"))
        rel = out / str(config.experiment_name) / str(config.method_name) / str(config.timestamp)
    except (AttributeError, TypeError):
        return Path.cwd()
    n = len(rel.parts)
    if not out.is_absolute() and ".." not in rel.parts and run.parts[-n:] == rel.parts and len(run.parts) > n:
        return Path(*run.parts[:-n])
    return Path.cwd()


def _resolve(path, root: Path) -> Optional[Path]:
    """``path`` (str / Path / None) made absolute against ``root`` (``~`` expanded)."""
    if path is None or str(path) == "":
        return None
    p = Path(path).expanduser()
    return p if p.is_absolute() else root / p


def _data_dir(config, root: Path) -> Optional[Path]:
    """The dataset folder the run trained on, absolute (relative paths against ``root``: :func:`training_dir`)."""
    dm = config.pipeline.datamanager
    data = getattr(dm, "data", None) or getattr(dm.dataparser, "data", None)
    if data is None:
        return None
    data = _resolve(data, root)
    return data.parent if data.suffix == ".json" else data


def _teacher_config(config, root: Path):
    """The datamanager's teacher config with its relative paths (features_dir, checkpoint, cache_dir) made
    absolute against ``root``, so that the spec built from it names the files the run read."""
    tcfg = getattr(config.pipeline.datamanager, "teacher", None)
    if tcfg is None:
        return None
    changes = {}
    for k in ("features_dir", "checkpoint", "cache_dir"):
        v = getattr(tcfg, k, None)
        if isinstance(v, (str, os.PathLike)) and str(v) and not Path(v).expanduser().is_absolute():
            changes[k] = str(_resolve(v, root))
    if not changes:
        return tcfg
    out = copy.copy(tcfg)  # not dataclasses.replace: a config of an older rh3dgs may lack newer fields
    vars(out).update(changes)
    return out


def run_images(config_yml: PathLike, config=None):
    """The run's cameras and images as it trained on them: :func:`rh3dgs.io.transforms.load_posed_images` of its
    dataset with its data parser's ``downscale_factor`` (nerfstudio's automatic factor when unset),
    ``skip_missing_images`` and image cache, ``lazy``: no image is read, undistorted or resized until one is
    asked for (``images[i]``, once). None when the dataset or its transforms.json is not there."""
    config = config if config is not None else load_run_config(config_yml)
    root = training_dir(config_yml, config)
    return _run_posed_images(config, root, _data_dir(config, root))


def _run_posed_images(config, root: Path, data_dir: Optional[Path]):
    from .transforms import load_posed_images, nerfstudio_downscale

    if data_dir is None or not (data_dir / "transforms.json").is_file():
        return None
    dp = getattr(config.pipeline.datamanager, "dataparser", None)
    cache = _resolve(getattr(dp, "image_cache_dir", None), root)
    options = dict(skip_missing_images=bool(getattr(dp, "skip_missing_images", False)), image_cache=cache)
    try:
        factor = nerfstudio_downscale(data_dir, getattr(dp, "downscale_factor", None))
    except Rh3dgsError:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # frames the run left out: said when it trained
        try:
            return load_posed_images(data_dir, check_images=False, downscale=factor, lazy=True, progress=False,
                                     **options)
        except Rh3dgsError:  # images moved or gone: the cameras alone, at the run's resolution
            try:
                return load_posed_images(data_dir, check_images=False, require_images=False, downscale=factor)
            except Rh3dgsError:
                return None


def load_nerfstudio_scene(
    config_yml: PathLike,
    device: Union[str, torch.device] = "cpu",
    frame: Literal["data", "nerfstudio"] = "data",
    step: Optional[int] = None,
    trust_checkpoint: bool = False,
) -> Tuple[Gaussians, Tensor, Optional[Cameras], Dict[str, Any]]:
    """Load a trained rh3dgs nerfstudio run.

    Args:
        config_yml: the run's ``config.yml``.
        device: where the returned tensors live.
        frame: ``"data"`` (the dataset's transforms.json frame) or ``"nerfstudio"`` (training frame).
        step: checkpoint step (default: the latest).
        trust_checkpoint: allow ``weights_only=False`` for checkpoints that need it.

    Returns:
        ``(gaussians, decoder, cameras, teacher_spec)``: :class:`rh3dgs.Gaussians` with
        ``latents`` [N, d]; the decoder [D, d]; the dataset's cameras in ``frame``, at the resolution the run
        trained at (its ``downscale_factor``, undistorted intrinsics, the frames it used: :func:`run_images`;
        no image is read) or None when the data folder or its transforms.json is not there; the teacher as a spec dict
        (:func:`rh3dgs.teachers.teacher_from_spec`), with ``features_dir`` resolved.
    """
    config_yml = Path(config_yml)
    config = load_run_config(config_yml)
    if not all(hasattr(getattr(config, "pipeline", None), k) for k in ("model", "datamanager")):
        raise NerfstudioRunError(f"{config_yml}: not a nerfstudio run config (no pipeline.model / pipeline.datamanager)")
    ckpt_path = find_checkpoint(config_yml, config, step)
    state = _model_state(load_checkpoint(ckpt_path, trust_checkpoint), ckpt_path)
    if "gauss_params.latents" not in state or "decoder" not in state:
        raise NerfstudioRunError(f"{ckpt_path}: not an rh3dgs run (no latents / decoder in the checkpoint)")
    g = {k[len("gauss_params."):]: v.float() for k, v in state.items() if k.startswith("gauss_params.")}
    model_cfg = config.pipeline.model
    sh_degree = int(getattr(model_cfg, "sh_degree", 3))
    if sh_degree > 0:
        sh0, shN = g["features_dc"][:, None, :], g["features_rest"]
    else:
        sh0 = ((torch.sigmoid(g["features_dc"]) - 0.5) / SH_C0)[:, None, :]
        shN = g["features_dc"].new_zeros(g["features_dc"].shape[0], 0, 3)
    means, scales, quats = g["means"], g["scales"], g["quats"]

    root = training_dir(config_yml, config)
    data_dir = _data_dir(config, root)
    dp = config_yml.parent / DATAPARSER_TRANSFORMS
    ns_to_data = nerfstudio_to_data(dp, data_dir) if dp.is_file() else Similarity.identity()
    g_ns = Gaussians(means=means.contiguous(), scales=scales.contiguous(), quats=quats.contiguous(),
                     opacities=g["opacities"].reshape(-1), sh0=sh0.contiguous(), shN=shN.contiguous(),
                     latents=g["latents"].contiguous())
    if frame == "data":
        gaussians = transform_gaussians(g_ns, ns_to_data)
    elif frame == "nerfstudio":
        gaussians = g_ns
    else:
        raise NerfstudioRunError(f"frame must be 'data' or 'nerfstudio', got {frame!r}")
    gaussians = gaussians.to(device)
    decoder = state["decoder"].float().to(device)

    posed = _run_posed_images(config, root, data_dir)
    cameras = None if posed is None else posed.cameras
    if cameras is not None and frame == "nerfstudio":
        c2w = transform_c2w(cameras.c2w_opengl.double(), ns_to_data.inverse())
        viewmats = torch.linalg.inv(c2w @ OPENGL_TO_OPENCV.double()).float()
        cameras = Cameras(viewmats=viewmats, Ks=cameras.Ks, width=cameras.width, height=cameras.height,
                          names=cameras.names)
    if cameras is not None:
        cameras = cameras.to(device)

    teacher_spec: Dict[str, Any] = {}
    tcfg = _teacher_config(config, root)
    if tcfg is not None:
        try:
            teacher_spec = tcfg.spec(data_dir)
        except Rh3dgsError:
            teacher_spec = {"name": tcfg.name}
    return gaussians, decoder, cameras, teacher_spec


def export_semantic_ply(config_yml: PathLike, out_path: PathLike, frame: Literal["data", "nerfstudio"] = "data",
                        step: Optional[int] = None, trust_checkpoint: bool = False,
                        latent_dtype: str = "float32") -> Path:
    """Write the run's Gaussians as a standard 3DGS PLY with ``sem_*`` latent fields; returns the path.

    The latents are stored as float32 by default (``latent_dtype``: "float32" or the compact,
    rh3dgs-only "float16", see :mod:`rh3dgs.io.ply`; float16 refuses latents with |x| > 65504).

    The decoder is not a per-Gaussian field: it is written beside the PLY as
    ``<out>.decoder.npy`` ([D, d] float32).
    """
    import numpy as np

    from .ply import save_ply

    gaussians, decoder, _, _ = load_nerfstudio_scene(config_yml, "cpu", frame, step, trust_checkpoint)
    out = save_ply(out_path, gaussians, latent_dtype=latent_dtype)
    np.save(str(Path(out).with_suffix(".decoder.npy")), decoder.numpy().astype(np.float32))
    return Path(out)
