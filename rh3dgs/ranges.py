"""Ranges of numeric settings: declared once, on the config dataclass field, checked wherever a value enters.

A field's range is part of its type, ``Annotated[float, Range(gt=0)]``; tyro (the command line) reads the
same type and ignores the marker. One function checks it, :func:`check_fields`, which every config
dataclass calls in ``__post_init__``: so a value is checked whether it comes from the command line (tyro
builds the dataclass), a YAML preset (:func:`rh3dgs.presets.load_preset`), a stored file or a viewer's GUI
(``dataclasses.replace``), or Python code. A function argument that is one of those settings is checked
against the same declaration with :func:`check_value` (e.g. ``Scene.select(threshold=...)`` against
:data:`rh3dgs.query.Threshold`).

Every number must be finite (unless ``finite=False``), and within the bounds given; for a tuple or list,
every element, and ``min_len`` elements at least. ``None`` passes (an ``Optional`` setting left unset).
A value outside its range raises :class:`RangeError` (a :class:`~rh3dgs.errors.ConfigError`), one line
naming the setting - as the command line spells it when it was given there - and the value.

Example::

    @dataclass
    class Settings:
        delta: Annotated[float, Range(gt=0)] = 0.2
        def __post_init__(self):
            check_fields(self)

    Settings(delta=float("nan"))   # RangeError: Settings.delta: must be a finite number > 0, got nan
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from .errors import ConfigError

__all__ = ["Range", "RangeError", "check_fields", "check_value", "check_setting", "field_ranges", "option_name",
           "command_line"]

_ARGV: contextvars.ContextVar = contextvars.ContextVar("rh3dgs_command_line", default=None)


@contextlib.contextmanager
def command_line(argv: Sequence[str]):
    """Within the block, range errors name the options of the command line ``argv`` (what ``rh3dgs`` and the
    nerfstudio plugin set while their command line is parsed)."""
    token = _ARGV.set(list(argv))
    try:
        yield
    finally:
        _ARGV.reset(token)


class RangeError(ConfigError):
    """A numeric setting outside its declared :class:`Range`: ``owner`` (the dataclass name or None), ``field``,
    ``value``, ``rule`` (e.g. "> 0")."""

    def __init__(self, owner: Optional[str], field: str, value: Any, rule: str, flag: Optional[str] = None):
        self.owner, self.field, self.value, self.rule = owner, field, value, rule
        name = f"{owner}.{field}" if owner else field
        name = f"{flag} ({name})" if flag else name
        shown = repr(value) if not isinstance(value, float) else f"{value:g}"
        super().__init__(f"{name}: must be {rule}, got {shown}"[:400])


@dataclass(frozen=True)
class Range:
    """Bounds of a numeric setting (``Annotated[float, Range(...)]``): ``gt`` / ``ge`` / ``lt`` / ``le``, finite
    unless ``finite=False``; for tuples and lists each element, and at least ``min_len`` of them."""

    gt: Optional[float] = None
    ge: Optional[float] = None
    lt: Optional[float] = None
    le: Optional[float] = None
    finite: bool = True
    min_len: Optional[int] = None

    def rule(self, value: Any = None) -> str:
        """What a value must be, e.g. "a finite number > 0" ("an integer >= 1" said of an int)."""
        parts = [f"{op} {v:g}" for op, v in ((">", self.gt), (">=", self.ge), ("<", self.lt), ("<=", self.le))
                 if v is not None]
        what = ("an integer" if type(value) is int else "a finite number" if self.finite else "a number")
        return f"{what} {' and '.join(parts)}" if parts else what

    def ok(self, v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if isinstance(v, float) and (math.isnan(v) or (self.finite and math.isinf(v))):
            return False
        return not ((self.gt is not None and not v > self.gt) or (self.ge is not None and not v >= self.ge)
                    or (self.lt is not None and not v < self.lt) or (self.le is not None and not v <= self.le))

    def problem(self, value: Any) -> Optional[Tuple[Any, str]]:
        """None when ``value`` is inside; else (the offending value, the rule it breaks)."""
        if value is None:
            return None
        if isinstance(value, (tuple, list)):
            if self.min_len is not None and len(value) < self.min_len:
                return value, f"{self.min_len} or more values"
            for v in value:
                if not self.ok(v):
                    return v, f"{self.rule(v)} (each value)"
            return None
        return None if self.ok(value) else (value, self.rule(value))


def _ranges_of(tp: Any) -> Tuple[Range, ...]:
    """The Range markers of a type: in ``Annotated`` metadata, also under ``Optional`` / unions."""
    found = tuple(m for m in getattr(tp, "__metadata__", ()) if isinstance(m, Range))
    if found:
        return found
    if typing.get_origin(tp) is typing.Union:
        return tuple(r for arg in typing.get_args(tp) for r in _ranges_of(arg))
    return ()


def field_ranges(cls: type) -> Dict[str, Tuple[Range, ...]]:
    """{field name: its Range markers} of a dataclass, from its (and its bases') annotations."""
    return {name: ranges for name, (ranges, _) in _declared(cls).items()}


@functools.lru_cache(maxsize=None)
def _declared(cls: type) -> Dict[str, Tuple[Tuple[Range, ...], str]]:
    """{field name: (its Range markers, the name of the class that declares them)}."""
    out: Dict[str, Tuple[Tuple[Range, ...], str]] = {}
    for klass in reversed(cls.__mro__):  # a subclass re-declaring a field without a Range keeps the base's
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            hints = typing.get_type_hints(klass, include_extras=True)
        except Exception:  # noqa: BLE001 - an annotation that cannot be evaluated: no ranges from this class
            continue
        own = klass.__dict__.get("__annotations__", {})  # the fields this class itself declares
        for f in dataclasses.fields(klass):
            r = _ranges_of(hints.get(f.name)) if f.name in own else ()
            if r:
                out[f.name] = (r, klass.__name__)
    return out


def option_name(cls: type, field: str, argv: Optional[Sequence[str]] = None) -> Optional[str]:
    """How the command line spells ``field`` of ``cls``, when the command line being parsed (``argv``, default
    the one :func:`command_line` set) gave it: ``--delta``, ``--vcd.edge-radius``, ``--views`` (a field renamed
    with tyro's ``arg(name=...)``). None when the value did not come from a command line."""
    argv = _ARGV.get() if argv is None else argv
    if not argv:
        return None
    names = {field.replace("_", "-")}
    try:
        tp = typing.get_type_hints(cls, include_extras=True).get(field)
    except Exception:  # noqa: BLE001
        tp = None
    for meta in getattr(tp, "__metadata__", ()):
        alias = getattr(meta, "name", None)
        if type(meta).__name__ == "_ArgConfig" and isinstance(alias, str) and alias:
            names.add(alias.replace("_", "-"))
    for tok in argv:
        flag = tok.split("=", 1)[0]
        if flag.startswith("--") and (flag[2:] in names or flag[2:].rsplit(".", 1)[-1] in names):
            return flag
    return None


def check_value(name: str, value: Any, annotated: Any, owner: Optional[str] = None) -> Any:
    """``value`` if it is inside the ranges of the type ``annotated`` (``Annotated[float, Range(...)]``), else
    :class:`RangeError` naming ``name``; returns ``value``. For function arguments that are config settings."""
    for r in _ranges_of(annotated):
        bad = r.problem(value)
        if bad is not None:
            raise RangeError(owner, name, bad[0], bad[1])
    return value


def check_setting(cls: type, name: str, value: Any) -> Any:
    """``value`` if it is inside the range the dataclass ``cls`` declares for its field ``name`` (a function
    argument that is that setting, e.g. ``check_port(host, port)`` against ``ViewerConfig.port``)."""
    ranges, owner = _declared(cls).get(name, ((), cls.__name__))
    for r in ranges:
        bad = r.problem(value)
        if bad is not None:
            raise RangeError(owner, name, bad[0], bad[1], flag=option_name(cls, name))
    return value


def check_fields(obj: Any) -> None:
    """Check every field of the dataclass instance ``obj`` that declares a :class:`Range` (the one check every
    config dataclass runs in ``__post_init__``); raises :class:`RangeError` for the first one outside."""
    cls = type(obj)
    for name in _declared(cls):
        check_setting(cls, name, getattr(obj, name, None))
