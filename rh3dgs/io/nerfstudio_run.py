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
  ``rh3dgs.`` module; built with ``Cls.__new__`` and its fields set (no ``__init__`` runs, as
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
scales the poses; ``dataparser_transforms.json`` in the run folder records it as
``x_ns = scale * (T @ [x; 1])``). ``frame="data"`` (default) maps the Gaussians back to the
frame of the dataset's own ``transforms.json`` (means, log-scales, rotations and the
view-dependent SH coefficients are transformed), so they line up with the cameras that
:func:`rh3dgs.load_transforms` reads; ``frame="nerfstudio"`` keeps the training frame and
transforms the cameras instead.

Checkpoints are read with ``torch.load(weights_only=True)`` (what torch >= 2.6 does by
default; rh3dgs checkpoints hold only tensors and plain containers). A checkpoint that needs
full unpickling (e.g. written by another nerfstudio model) is retried with
``weights_only=False`` only when ``trust_checkpoint=True``.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import math
import os
import pathlib
import pickle
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

import torch
import torch.nn.functional as F
import yaml
from torch import Tensor

from ..cameras import Cameras, OPENGL_TO_OPENCV
from ..errors import Rh3dgsError
from ..gaussians import Gaussians

__all__ = ["load_nerfstudio_scene", "export_semantic_ply", "load_run_config", "find_checkpoint",
           "checkpoints_newest_first", "load_checkpoint", "rotate_sh", "NerfstudioRunError"]

PathLike = Union[str, os.PathLike]
C0 = 0.28209479177387814


class NerfstudioRunError(Rh3dgsError):
    """A nerfstudio run folder / config / checkpoint that cannot be read."""


# ------------------------------------------------------------------------- config.yml
_CONFIG_MODULES = ("nerfstudio.", "rh3dgs.")  # dataclasses and enums of these
_CLASS_MODULES = _CONFIG_MODULES + ("torch.optim.",)  # classes named by !!python/name (e.g. _target)
# a path written on any OS is this OS's Path (yaml.Loader cannot build a WindowsPath on Linux)
_PATH_CLASSES = {**{f"pathlib.{n}": pathlib.Path for n in ("Path", "PosixPath", "WindowsPath")},
                 **{f"pathlib.{n}": getattr(pathlib, n) for n in ("PurePath", "PurePosixPath", "PureWindowsPath")}}
_YAML_PYTHON = "tag:yaml.org,2002:python/"


def _refuse(node, problem: str):
    """ConstructorError ``"<tag as written, e.g. !!python/name:x.Y> <problem>"`` at ``node``."""
    tag = node.tag.replace("tag:yaml.org,2002:", "!!", 1)
    return yaml.constructor.ConstructorError(None, None, f"{tag} {problem}", node.start_mark)


def _find(name: str, modules: Tuple[str, ...], node) -> Any:
    """``module.attr`` for a module under one of ``modules``; nothing is imported for any other name."""
    module, _, attr = name.rpartition(".")
    if not module or not attr or not (module + ".").startswith(modules):
        raise _refuse(node, "is not allowed: a nerfstudio run config names only classes of "
                            f"{', '.join(m.rstrip('.') for m in modules)}")
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception as exc:  # noqa: BLE001 - ImportError, or what the module raises on import
        raise _refuse(node, f"names {name}, which cannot be imported ({type(exc).__name__}: {exc})") from None


def _python_object(loader, suffix: str, node):
    cls = _find(suffix, _CONFIG_MODULES, node)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)) or not isinstance(node, yaml.MappingNode):
        raise _refuse(node, "is not a config dataclass with fields")
    obj = cls.__new__(cls)
    yield obj
    state = loader.construct_mapping(node, deep=True)
    if not all(isinstance(k, str) for k in state):
        raise _refuse(node, "has field names that are not strings")
    vars(obj).update(state)


def _python_apply(loader, suffix: str, node):
    if not isinstance(node, yaml.SequenceNode):
        raise _refuse(node, "must be followed by a list of arguments")
    cls = _PATH_CLASSES.get(suffix)
    if cls is None:
        cls = _find(suffix, _CONFIG_MODULES, node)
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
    obj = _find(suffix, _CLASS_MODULES, node)
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


def load_run_config(config_yml: PathLike):
    """The TrainerConfig stored in a run's ``config.yml``, parsed without running code (module docstring)."""
    path = Path(config_yml)
    if not path.is_file():
        raise NerfstudioRunError(f"{path}: nerfstudio config file not found")
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_RunConfigLoader)
    except yaml.MarkedYAMLError as e:
        line = f"line {e.problem_mark.line + 1}: " if e.problem_mark is not None else ""
        raise NerfstudioRunError(f"{path}: {line}cannot read the nerfstudio config ({e.problem})") from None
    except (yaml.YAMLError, OSError, ValueError, RecursionError) as e:
        msg = " ".join(str(e).split())
        raise NerfstudioRunError(f"{path}: cannot read the nerfstudio config ({type(e).__name__}: {msg})") from None


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


def load_checkpoint(path: PathLike, trust_checkpoint: bool = False) -> Dict[str, Any]:
    """``torch.load`` with ``weights_only=True``; with ``trust_checkpoint`` falls back to full unpickling."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if not trust_checkpoint:
            raise NerfstudioRunError(f"{path}: checkpoint needs full unpickling (weights_only=False); pass "
                                     f"trust_checkpoint=True if you trust it ({str(e).splitlines()[0]})") from None
        return torch.load(path, map_location="cpu", weights_only=False)


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


def _quat_from_rotmat(R: Tensor) -> Tensor:
    """[3, 3] rotation -> (w, x, y, z) unit quaternion."""
    R = R.double()
    m = R
    t = m.trace()
    if t > 0:
        s = math.sqrt(float(t) + 1.0) * 2
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = math.sqrt(1.0 + float(m[0, 0] - m[1, 1] - m[2, 2])) * 2
        q = [(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
    elif m[1, 1] > m[2, 2]:
        s = math.sqrt(1.0 + float(m[1, 1] - m[0, 0] - m[2, 2])) * 2
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s]
    else:
        s = math.sqrt(1.0 + float(m[2, 2] - m[0, 0] - m[1, 1])) * 2
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s]
    q = torch.tensor([float(x) for x in q], dtype=torch.float64)
    return q / q.norm()


def _quat_mul(a: Tensor, b: Tensor) -> Tensor:
    """Hamilton product a * b, (w, x, y, z); a [4] or [N, 4], b [N, 4]."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack([aw * bw - ax * bx - ay * by - az * bz,
                        aw * bx + ax * bw + ay * bz - az * by,
                        aw * by - ax * bz + ay * bw + az * bx,
                        aw * bz + ax * by - ay * bx + az * bw], -1)


def rotate_sh(shN: Tensor, R: Tensor, n_dirs: int = 256) -> Tensor:
    """Rotate higher SH coefficients [N, K, 3] (gsplat's basis) for a world rotation R [3, 3].

    The new coefficients c' satisfy ``color'(R d) = color(d)`` for every direction d; found per
    band by least squares on ``n_dirs`` directions (exact: rotations do not mix bands).
    """
    K = shN.shape[1]
    if K == 0:
        return shN
    from ..ops._gsplat import eval_sh_bases

    gen = torch.Generator().manual_seed(0)
    X = F.normalize(torch.randn(n_dirs, 3, generator=gen, dtype=torch.float64), dim=-1)
    R = R.double()
    Y = eval_sh_bases(K + 1, X.float()).double()[:, 1:]  # Y(d)      [M, K]
    Yr = eval_sh_bases(K + 1, (X @ R.T).float()).double()[:, 1:]  # Y(R d) [M, K]
    # color'(R d) = Yr c' = Y c  ->  c' = pinv(Yr) Y c
    M = torch.linalg.lstsq(Yr, Y).solution  # [K, K]
    return torch.einsum("kj,njc->nkc", M.to(shN.dtype), shN)


def _without_applied_transform(T: Tensor, data_dir: Optional[Path]) -> Tensor:
    """The map from the dataset's ``transforms.json`` frame to nerfstudio's: ``T`` [3, 4] of
    ``dataparser_transforms.json`` composed with the inverse of the dataset's ``applied_transform``.

    nerfstudio saves ``transform @ applied_transform`` (it maps COLMAP's original frame, not the
    transforms.json frame, to its own) when ``transforms.json`` has an ``applied_transform`` (written by
    ``ns-process-data``) or, without one, when ``colmap/sparse/0`` exists (its legacy value); the poses in
    ``transforms.json`` already include it.
    """
    if data_dir is None or not (data_dir / "transforms.json").is_file():
        return T
    try:
        meta = json.loads((data_dir / "transforms.json").read_text())
    except (OSError, ValueError):
        return T
    A = meta.get("applied_transform") if isinstance(meta, dict) else None
    if A is None and (data_dir / "colmap" / "sparse" / "0").exists():
        A = [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, -1, 0]]
    if A is None:
        return T
    A4 = torch.eye(4, dtype=torch.float64)
    A4[:3] = torch.tensor(A, dtype=torch.float64).reshape(3, 4)
    T4 = torch.eye(4, dtype=torch.float64)
    T4[:3] = T.double()
    return (T4 @ torch.linalg.inv(A4))[:3].to(T.dtype)


def _dataparser_transform(run_dir: Path) -> Tuple[Tensor, float]:
    path = run_dir / "dataparser_transforms.json"
    if not path.is_file():
        return torch.eye(4, dtype=torch.float64)[:3], 1.0
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        return torch.tensor(meta["transform"], dtype=torch.float64).reshape(3, 4), float(meta["scale"])
    except (OSError, ValueError, RecursionError, KeyError, TypeError, RuntimeError) as exc:
        raise NerfstudioRunError(f"{path}: not a nerfstudio dataparser transform "
                                 f"({{'transform': 3x4, 'scale': float}}): {type(exc).__name__}: {exc}") from None


def _data_dir(config) -> Optional[Path]:
    dm = config.pipeline.datamanager
    data = getattr(dm, "data", None) or getattr(dm.dataparser, "data", None)
    if data is None:
        return None
    data = Path(data)
    return data.parent if data.suffix == ".json" else data


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
        ``latents`` [N, d]; the decoder [D, d]; the dataset's cameras in ``frame`` (None when the
        data folder or its transforms.json is not there); the teacher as a spec dict
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
        sh0 = ((torch.sigmoid(g["features_dc"]) - 0.5) / C0)[:, None, :]
        shN = g["features_dc"].new_zeros(g["features_dc"].shape[0], 0, 3)
    means, scales, quats = g["means"], g["scales"], g["quats"]

    T, scale = _dataparser_transform(config_yml.parent)
    T = _without_applied_transform(T, _data_dir(config))
    R, t = T[:, :3], T[:, 3]
    if frame == "data":
        means = ((means.double() / scale - t) @ R).float()  # R^T (x / s - t)
        scales = scales - math.log(scale)
        qRt = _quat_from_rotmat(R.T)
        quats = _quat_mul(qRt[None].float(), F.normalize(quats, dim=-1))
        shN = rotate_sh(shN, R.T)
    elif frame != "nerfstudio":
        raise NerfstudioRunError(f"frame must be 'data' or 'nerfstudio', got {frame!r}")
    gaussians = Gaussians(means=means.contiguous(), scales=scales.contiguous(), quats=quats.contiguous(),
                          opacities=g["opacities"].reshape(-1), sh0=sh0.contiguous(), shN=shN.contiguous(),
                          latents=g["latents"].contiguous()).to(device)
    decoder = state["decoder"].float().to(device)

    cameras = None
    data_dir = _data_dir(config)
    if data_dir is not None and (data_dir / "transforms.json").is_file():
        from .transforms import load_transforms

        try:
            cameras, _ = load_transforms(data_dir, check_images=False)
        except Rh3dgsError:
            cameras = None
        if cameras is not None and frame == "nerfstudio":
            c2w = cameras.c2w_opengl.double()
            Tm = torch.eye(4, dtype=torch.float64)
            Tm[:3] = T
            c2w = Tm @ c2w
            c2w[:, :3, 3] *= scale
            viewmats = torch.linalg.inv(c2w @ OPENGL_TO_OPENCV.double()).float()
            cameras = Cameras(viewmats=viewmats, Ks=cameras.Ks, width=cameras.width, height=cameras.height,
                              names=cameras.names)
        if cameras is not None:
            cameras = cameras.to(device)

    teacher_spec: Dict[str, Any] = {}
    tcfg = getattr(config.pipeline.datamanager, "teacher", None)
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
