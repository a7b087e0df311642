"""Checkpoints of the long jobs (the lift's passes, the distillation's steps): a rerun resumes from the last one.

A checkpoint folder belongs to one job: ``key.txt`` holds the :func:`fingerprint` of its inputs and settings,
and a folder found with another key is cleared, never resumed from. Files are written atomically
(:func:`rh3dgs.io.atomic.atomic_write`); a state counts once its marker (a JSON file written last) exists.

The lift (:class:`PassCheckpoint`), after each completed pass::

    FOLDER/key.txt
    FOLDER/pass-001.rows-0-40000.pt      the per-Gaussian state of rows 0..40000 (Z-order): mu, weight,
    FOLDER/pass-001.rows-40000-79651.pt  visibility, observed, active, previous step lengths (one file per block)
    FOLDER/pass-001.json                 the marker: {"pass", "steps", "done", "blocks"}, written when every block is

A rerun reads the newest marker and each rank its rows from whichever blocks hold them (any number of processes
may resume any other number's passes); older passes are deleted once a newer marker is in place.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from torch import Tensor

from .. import distributed as D
from ..io.atomic import atomic_save_json, atomic_save_text, atomic_write

__all__ = ["fingerprint", "ResumeFolder", "PassCheckpoint"]


def fingerprint(*parts: Any) -> str:
    """A hex digest of ``parts``: tensors by their dtype, shape and bytes, anything else by its ``repr``.

    >>> fingerprint(torch.ones(2), "robust") == fingerprint(torch.ones(2), "robust") != fingerprint(torch.zeros(2))
    True
    """
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, Tensor):
            t = p.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


class ResumeFolder:
    """The checkpoint folder of one job (module docstring). Collective in a process group: rank 0 checks the key
    and clears a folder of another job, the others wait for it."""

    def __init__(self, folder: Path, key: str, group: Optional[D.DistInfo] = None):
        self.folder, self.key, self.group = Path(folder), str(key), group
        main = group is None or group.is_main
        if main:
            keyfile = self.folder / "key.txt"
            if not (keyfile.is_file() and keyfile.read_text().strip() == self.key):
                if self.folder.exists():
                    shutil.rmtree(self.folder)
                atomic_save_text(keyfile, self.key + "\n")
        if group is not None:
            D.barrier()

    def agree(self, ok: bool) -> bool:
        """Whether every rank could read its part of a state (all or none resume)."""
        if self.group is None:
            return ok
        return bool(D.all_reduce(torch.tensor([0 if ok else 1], dtype=torch.int64)).item() == 0)

    def remove(self) -> None:
        """The job is done: its checkpoints go (rank 0)."""
        if self.group is None or self.group.is_main:
            shutil.rmtree(self.folder, ignore_errors=True)


_MARKER = re.compile(r"pass-(\d+)\.json$")


class PassCheckpoint:
    """The lift's per-pass state of this rank's block of rows ``[start, end)`` (module docstring)."""

    FIELDS = ("mu", "weight", "visibility", "observed", "active", "prev")

    def __init__(self, folder: Path, key: str, start: int, end: int, group: Optional[D.DistInfo] = None):
        self.store = ResumeFolder(folder, key, group)
        self.start, self.end = int(start), int(end)

    @property
    def folder(self) -> Path:
        return self.store.folder

    def _markers(self) -> List[int]:
        return sorted(int(m.group(1)) for p in self.folder.glob("pass-*.json") if (m := _MARKER.search(p.name)))

    def load(self, device: torch.device) -> Optional[Dict[str, Any]]:
        """The newest complete pass: ``{"pass", "steps", "done", **FIELDS}`` with this rank's rows, or None."""
        passes = self._markers()
        state: Optional[Dict[str, Any]] = None
        if passes:
            try:
                state = self._read(passes[-1], device)
            except (OSError, ValueError, KeyError, RuntimeError, json.JSONDecodeError):
                state = None
        return state if self.store.agree(state is not None) else None

    def _read(self, p: int, device: torch.device) -> Dict[str, Any]:
        meta = json.loads((self.folder / f"pass-{p:03d}.json").read_text())
        parts: Dict[str, List[Tensor]] = {k: [] for k in self.FIELDS}
        covered = self.start
        for a, b, name in sorted(meta["blocks"]):
            lo, hi = max(a, self.start), min(b, self.end)
            if lo >= hi:
                continue
            if lo != covered:
                raise ValueError(f"pass {p}: rows {covered}..{lo} are in no block")
            block = torch.load(self.folder / name, map_location="cpu", weights_only=True)
            for k in self.FIELDS:
                t = block.get(k)
                parts[k].append(None if t is None else t[lo - a:hi - a])
            covered = hi
        if covered != self.end:
            raise ValueError(f"pass {p}: rows {covered}..{self.end} are in no block")
        out: Dict[str, Any] = {"pass": int(meta["pass"]), "steps": list(meta["steps"]), "done": bool(meta["done"])}
        for k, ts in parts.items():
            if not ts or any(t is None for t in ts):
                out[k] = None if k == "prev" else torch.zeros(0)
                if k != "prev" and self.end > self.start:
                    raise KeyError(k)
                continue
            out[k] = torch.cat(ts).to(device)
        return out

    def save(self, p: int, steps: List[float], done: bool, **block: Optional[Tensor]) -> None:
        """Write pass ``p``'s state of this rank's rows (``FIELDS``); the marker once every rank's block is written."""
        name = f"pass-{p:03d}.rows-{self.start}-{self.end}.pt"
        with atomic_write(self.folder / name) as f:
            torch.save({k: (None if block.get(k) is None else block[k].detach().cpu()) for k in self.FIELDS}, f)
        group = self.store.group
        blocks = [(self.start, self.end, name)]
        if group is not None:
            blocks = [tuple(b) for b in D.all_gather_object(blocks[0])]  # every block is on disk now
        if group is None or group.is_main:
            atomic_save_json(self.folder / f"pass-{p:03d}.json",
                             {"pass": p, "steps": [float(s) for s in steps], "done": bool(done),
                              "blocks": [list(b) for b in blocks]})
            for old in self.folder.glob("pass-*"):  # the passes before this one
                m = re.match(r"pass-(\d+)\.", old.name)
                if m and int(m.group(1)) < p:
                    old.unlink(missing_ok=True)
