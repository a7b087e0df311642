"""What the plugin guards in a nerfstudio process: its reads of a run's ``config.yml``, and how our errors end.

nerfstudio 1.1.5 reads a run's ``config.yml`` with ``yaml.load(text, Loader=yaml.Loader)``, a loader that
calls whatever the file names: ``!!python/object/apply:os.system ["..."]`` in a shared run runs a shell
command. Two functions do it: ``nerfstudio.scripts.train.main`` (``ns-train --load-config``) and
``nerfstudio.utils.eval_utils.eval_setup`` (``ns-eval``, ``ns-viewer``, ``ns-export``, ``ns-render``,
``ns-texture``). Nothing in site-packages is patched; :func:`install` changes this process:

* **config.yml**: ``yaml.load`` is wrapped; a call *from a nerfstudio module* with a loader that can build
  Python objects (``yaml.Loader``, ``UnsafeLoader``, ``FullLoader`` and their C twins) is answered by
  :func:`rh3dgs.io.nerfstudio_run.parse_run_config` - the loader ``rh3dgs.load`` uses: SafeLoader plus the
  tags nerfstudio writes for its configs, each restricted to nerfstudio's, rh3dgs' and installed plugins'
  dataclasses, enums and classes (and paths, tuples). Anything else refuses the whole file before any
  object is built or module imported. Every other caller of ``yaml.load`` is passed through unchanged.
  When the caller is ``eval_setup``, the checkpoint it is about to load (``--load-step`` or the newest
  ``step-*.ckpt``) is verified too (:func:`rh3dgs.io.nerfstudio_run.verify_checkpoint`: CRC-32 of each
  record, sizes against the memory budget), since nerfstudio loads it with a plain ``torch.load``;
* **our errors**: ``sys.excepthook`` prints an uncaught :class:`rh3dgs.errors.Rh3dgsError` as one line
  ``<program>: error: <message>`` (exit status 1, as any uncaught error) instead of a traceback; any
  other exception keeps its traceback. ``RH3DGS_DEBUG=1`` shows tracebacks of ours too. A value out of
  its declared range (:mod:`rh3dgs.ranges`) names the ns-* option it came from.

When it runs: nerfstudio discovers its methods when ``nerfstudio.configs.method_configs`` is imported,
which every ns-* script does (``train.py`` directly, the others through ``eval_utils``) before it parses its
command line; discovery loads the ``nerfstudio.method_configs`` entry points, i.e. imports
:mod:`rh3dgs.nerfstudio.config`, which calls :func:`install`. ``nerfstudio`` reads the config only after
that, whichever method the run names. What it cannot cover: a process where the plugin is not
installed (no entry point and no ``NERFSTUDIO_METHOD_CONFIGS``); a ``yaml.load`` call that a nerfstudio
module makes through an alias (``from yaml import load``; 1.1.5 has none); and what the config's
``_target`` classes - nerfstudio's or a plugin's own classes - do when nerfstudio builds them.

Example::

    from rh3dgs.nerfstudio import run_guard
    run_guard.install()      # idempotent; what importing rh3dgs.nerfstudio.config does
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import yaml

__all__ = ["install", "installed", "config_path_from_argv"]

_lock = threading.Lock()
_installed = False
_yaml_load = yaml.load  # the original, for every caller we pass through


def installed() -> bool:
    return _installed


def _unsafe(loader: Any) -> bool:
    """A loader that builds arbitrary Python objects (FullConstructor and what derives from it)."""
    return isinstance(loader, type) and issubclass(loader, yaml.constructor.FullConstructor)


def _module_of(frame) -> str:
    """The dotted module name of the code running in ``frame`` (``-m`` runs keep theirs in ``__spec__``)."""
    g = frame.f_globals
    spec = g.get("__spec__")
    return getattr(spec, "name", None) or g.get("__name__", "") or ""


def config_path_from_argv(argv) -> Optional[str]:
    """The value of ``--load-config`` on a nerfstudio command line (``--load-config X`` / ``--load-config=X``)."""
    for i, a in enumerate(argv):
        if a == "--load-config" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--load-config="):
            return a.split("=", 1)[1]
    return None


def _source(frame) -> str:
    """The file nerfstudio read the text from, for the error line: ``eval_setup``'s ``config_path`` or
    ``train.main``'s ``config.load_config``, else ``--load-config`` of the command line."""
    for local in (frame.f_locals.get("config_path"), getattr(frame.f_locals.get("config"), "load_config", None)):
        if isinstance(local, (str, os.PathLike)):
            return os.fspath(local)
    return config_path_from_argv(sys.argv[1:]) or "config.yml"


def _verify_eval_checkpoint(config) -> None:
    """The checkpoint ``eval_setup`` loads next (``load_step``, or the newest), verified before torch reads it."""
    from ..io.nerfstudio_run import checkpoints_newest_first, verify_checkpoint

    try:
        folder = Path(config.get_checkpoint_dir())
        step = getattr(config, "load_step", None)
    except Exception:  # noqa: BLE001 - not a TrainerConfig: nerfstudio's own assert says so next
        return
    if step is not None:
        path = folder / f"step-{int(step):09d}.ckpt"
    else:
        found = checkpoints_newest_first(folder) if folder.is_dir() else []
        if not found:
            return  # nerfstudio says there is none
        path = found[0][1]
    if path.is_file():
        verify_checkpoint(path)


def _guarded_load(stream, Loader=None):
    frame = sys._getframe(1)
    if not (_unsafe(Loader) and _module_of(frame).startswith("nerfstudio.")):
        return _yaml_load(stream, Loader)
    from ..io.nerfstudio_run import parse_run_config

    text = stream if isinstance(stream, (str, bytes)) else stream.read()
    config = parse_run_config(text, _source(frame))
    if _module_of(frame) == "nerfstudio.utils.eval_utils":
        _verify_eval_checkpoint(config)
    return config


def _excepthook(previous):
    def hook(exc_type, exc, tb):
        from ..errors import Rh3dgsError

        if isinstance(exc, Rh3dgsError) and not os.environ.get("RH3DGS_DEBUG"):
            prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "nerfstudio"
            print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
            return
        previous(exc_type, exc, tb)

    return hook


def install() -> None:
    """Guard nerfstudio's config reads and print our errors in one line, in this process (module docstring)."""
    global _installed
    with _lock:
        if _installed:
            return
        yaml.load = _guarded_load
        sys.excepthook = _excepthook(sys.excepthook)
        if sys.argv and Path(sys.argv[0]).name.startswith("ns-"):
            from ..ranges import _ARGV

            _ARGV.set(sys.argv[1:])  # the command line tyro is about to parse: range errors name its options
        _installed = True
