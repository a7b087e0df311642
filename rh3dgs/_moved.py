"""Old module paths, kept importable after the package was regrouped (``rh3dgs/lifting/``, ``rh3dgs/method/``).

A nerfstudio ``config.yml`` names the module of every config class it holds (``!!python/object:rh3dgs.vcd.VCDConfig``),
and user code imports modules by name, so a run trained before the regrouping, or a script written for it, names
modules that no longer exist as files. Importing one of the names below gives the module that now holds the same
code (the same module object, so classes compare equal), with a ``DeprecationWarning`` naming the new path.

>>> import rh3dgs.vcd, rh3dgs.method.vcd  # doctest: +SKIP
>>> rh3dgs.vcd is rh3dgs.method.vcd  # doctest: +SKIP
True
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["MOVED", "install"]

#: old module name -> the module that holds its code now
MOVED = {
    "rh3dgs.lift_views": "rh3dgs.lifting.views",
    "rh3dgs.lift_memory": "rh3dgs.lifting.preflight",
    "rh3dgs.fill": "rh3dgs.lifting.fill",
    "rh3dgs.sphere": "rh3dgs.method.sphere",
    "rh3dgs.vcd": "rh3dgs.method.vcd",
    "rh3dgs.vfm": "rh3dgs.method.vfm",
    "rh3dgs.lic": "rh3dgs.method.lic",
    "rh3dgs.objective": "rh3dgs.method.objective",
    "rh3dgs.demo_semantic": "rh3dgs.demo",
    "rh3dgs.eval.memory": "rh3dgs.eval.peak",
    "rh3dgs.io.frames": "rh3dgs.io.coordinate_frames",
    "rh3dgs.io.arrays": "rh3dgs.io.npy",
    "rh3dgs.nerfstudio.splatfacto_cpu": "rh3dgs.nerfstudio.splatfacto_native",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {self.new}; import it from there", DeprecationWarning, stacklevel=3)
        return importlib.import_module(self.new)

    def exec_module(self, module) -> None:  # the module is already executed under its new name
        pass


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        return importlib.util.spec_from_loader(fullname, _Alias(new)) if new else None


def install() -> None:
    """Make the old names importable (idempotent; rh3dgs/__init__.py calls it)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())  # ahead of stale files an upgrade may leave behind
