"""Progress bars for long work (rich, as nerfstudio does); silent when not at a terminal.

    from rh3dgs.progress import track
    for view in track(range(len(cams)), description="render"):
        ...

One live display at a time: a :func:`track` started while another one runs (an IRLS pass inside a
suite row, a distillation inside the suite) becomes a second line of the same display and disappears
when it ends. Bars are drawn on stderr and only when both stdout and stderr are terminals; piped,
redirected or captured output (CI logs, ``rh3dgs ... > log.txt``, pytest) gets no progress lines at
all, and ``RH3DGS_QUIET=1`` turns the bars off everywhere. Nothing is printed per step.

``RH3DGS_PROGRESS=lines`` asks for plain progress lines instead where there is no terminal
(``[rh3dgs] DESCRIPTION: i/total`` on stderr at every 10 %: for tools that watch a job's log, such
as the kill-and-resume tests).
"""
from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")

__all__ = ["track", "enabled", "silence_known_warnings"]

_live = None  # the running rich.progress.Progress, if any (nested tracks add a task to it)


def enabled() -> bool:
    """True when bars are drawn: stdout and stderr are terminals and ``RH3DGS_QUIET`` is not ``1``."""
    if os.environ.get("RH3DGS_QUIET") == "1":
        return False
    try:
        return sys.stdout.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


def _progress(console=None):
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                    console=console or Console(stderr=True), transient=True)


def track(iterable: Iterable[T], description: str = "working", total: Optional[int] = None,
          disable: bool = False, console=None) -> Iterator[T]:
    """Iterate over ``iterable`` with a progress bar (``total`` defaults to ``len(iterable)``).

    ``disable=True``, ``RH3DGS_QUIET=1`` or a non-terminal stdout / stderr: the items, nothing printed.
    ``console``: a ``rich.console.Console`` to draw on (default: stderr; given, it is drawn on even when
    not a terminal -- for tests).
    """
    global _live
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if disable or (console is None and _live is None and not enabled()):
        if not disable and os.environ.get("RH3DGS_PROGRESS") == "lines" and os.environ.get("RH3DGS_QUIET") != "1":
            yield from _lines(iterable, description, total)
        else:
            yield from iterable
        return
    if _live is not None:  # nested: one more line of the running display
        live = _live
        task = live.add_task(description, total=total)
        try:
            for item in iterable:
                yield item
                live.advance(task)
        finally:
            live.remove_task(task)
        return
    progress = _progress(console)
    task = progress.add_task(description, total=total)
    _live = progress
    try:
        with progress:
            for item in iterable:
                yield item
                progress.advance(task)
    finally:
        _live = None


def _lines(iterable: Iterable[T], description: str, total: Optional[int]) -> Iterator[T]:
    """``RH3DGS_PROGRESS=lines``: ``[rh3dgs] DESCRIPTION: i/total`` on stderr at every 10 %."""
    step = max(1, (total or 0) // 10)
    for i, item in enumerate(iterable):
        if total and i % step == 0:
            print(f"[rh3dgs] {description}: {i}/{total}", file=sys.stderr, flush=True)
        yield item
    if total:
        print(f"[rh3dgs] {description}: {total}/{total}", file=sys.stderr, flush=True)


#: FutureWarnings that torch 2.x raises on import of nerfstudio 1.1.5 / gsplat code (not ours, nothing a
#: user can act on): ``torch.jit.script`` and ``torch.cuda.amp.custom_fwd / custom_bwd / GradScaler``.
KNOWN_WARNINGS = (
    r"`torch\.jit\.script` is deprecated",
    r"`torch\.cuda\.amp\.(custom_fwd|custom_bwd|GradScaler|autocast)\(args\.\.\.\)` is deprecated",
)


def silence_known_warnings() -> None:
    """Filter :data:`KNOWN_WARNINGS` (FutureWarning only; any other warning still shows). Called by the
    ``rh3dgs`` entry point before it imports nerfstudio; a nerfstudio entry point may call it too."""
    import warnings

    for pattern in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=FutureWarning)
