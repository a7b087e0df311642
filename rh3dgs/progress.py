"""Progress display for long work (rich, as nerfstudio does); silent when not a terminal or disabled."""
from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")

__all__ = ["track"]


def track(iterable: Iterable[T], description: str = "working", total: Optional[int] = None,
          disable: bool = False) -> Iterator[T]:
    """Iterate with a rich progress bar (plain line-per-10% progress when stderr is not a TTY)."""
    if disable or os.environ.get("RH3DGS_QUIET") == "1":
        yield from iterable
        return
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if sys.stderr.isatty():
        from rich.progress import track as rich_track

        yield from rich_track(iterable, description=description, total=total, transient=True)
        return
    step = max(1, (total or 0) // 10)
    for i, item in enumerate(iterable):
        if total and (i % step == 0):
            print(f"[rh3dgs] {description}: {i}/{total}", file=sys.stderr, flush=True)
        yield item
    if total:
        print(f"[rh3dgs] {description}: {total}/{total}", file=sys.stderr, flush=True)
