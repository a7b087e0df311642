"""YAML presets for config dataclasses (``configs/*.yaml``): ``rh3dgs lift --config FILE``.

A preset is a mapping of dataclass field names to values; nested dataclasses (e.g.
``LiftConfig.vcd``) are nested mappings. Unknown keys, wrong types and unreadable files
raise :class:`rh3dgs.errors.ConfigError` naming the file and the key.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Type, TypeVar, Union, get_type_hints

from .errors import ConfigError
from .memory import read_text_sized

__all__ = ["load_preset", "as_config"]

T = TypeVar("T")


def _build(cls: Type[T], data: Any, path: Path, prefix: str) -> T:
    if not isinstance(data, dict):
        raise ConfigError(f"{path} [{prefix or '<top>'}]: expected a mapping of {cls.__name__} fields, "
                          f"got {type(data).__name__}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        where = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ConfigError(f"{path} [{where}]: unknown field of {cls.__name__}; known: {', '.join(sorted(names))}")
        typ = hints.get(key)
        if dataclasses.is_dataclass(typ):
            kwargs[key] = _build(typ, value, path, where)
            continue
        if typ in (int, float, bool, str) and not (isinstance(value, typ) or (typ is float and isinstance(value, int)
                                                                               and not isinstance(value, bool))):
            raise ConfigError(f"{path} [{where}]: expected {typ.__name__}, got {value!r}")
        kwargs[key] = float(value) if typ is float else value
    try:
        return cls(**kwargs)
    except (ConfigError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


def load_preset(path: Union[str, Path], cls: Type[T]) -> T:
    """Read a YAML preset into ``cls`` (a config dataclass)."""
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(read_text_sized(p, "a preset"))
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the preset ({exc.strerror or exc})") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # ValueError: bad UTF-8, ints over 4300 digits
        raise ConfigError(f"{p}: not valid YAML ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    return _build(cls, data or {}, p, "")


def as_config(cls: Type[T], obj: Any) -> T:
    """``obj``, an instance of a subclass of the config dataclass ``cls`` (e.g. a command line's renamed view of
    it), as a plain ``cls`` with the same field values.

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class A:
    ...     x: int = 1
    >>> @dataclasses.dataclass
    ... class B(A):
    ...     x: int = 2
    >>> as_config(A, B())
    A(x=2)
    """
    return cls(**{f.name: getattr(obj, f.name) for f in dataclasses.fields(cls)})
