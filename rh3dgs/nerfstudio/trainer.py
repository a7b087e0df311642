"""nerfstudio ``Trainer`` with crash-safe checkpoints (``ns-train rh3dgs`` can be killed at any moment).

nerfstudio writes ``step-XXXXXXXXX.ckpt`` with a plain ``torch.save`` to its final name, so a
run killed while saving leaves a truncated checkpoint that ``--load-dir`` then picks as the
latest and fails on. Here:

* :meth:`Rh3dgsTrainer.save_checkpoint` writes through :func:`rh3dgs.io.atomic.atomic_write`
  (temp file, fsync, rename): a ``.ckpt`` file is always complete. The older checkpoints are
  deleted (``save_only_latest_checkpoint``) only after the new one is in place.
* :meth:`Rh3dgsTrainer._load_checkpoint` with ``--load-dir`` and no ``--load-step`` resumes from
  the newest checkpoint that loads, skipping (and naming) unreadable ones instead of crashing
  (truncated, or damaged: the CRC-32 of every record is checked, :func:`rh3dgs.io.nerfstudio_run.verify_checkpoint`);
  temp files of an interrupted save are ignored. With no loadable checkpoint it stops with
  a clear error. ``--load-step`` / ``--load-checkpoint`` load exactly what they name.

A run that fails before its first step leaves nothing behind: nerfstudio's ``train.py`` writes ``config.yml``
(and so the run folder) before the trainer is set up; :meth:`Rh3dgsTrainerConfig.save_config` defers that
write to the end of :meth:`Rh3dgsTrainer.setup`, and a failure before the first step completes removes the
folders this run created. An input problem (an :class:`rh3dgs.errors.Rh3dgsError`: a missing image, a bad
``transforms.json`` or seed PLY, a teacher that cannot be built) ends ``ns-train`` with one line
``ns-train: error: <file> [field]: problem`` on stderr and a non-zero exit code, no traceback
(``RH3DGS_DEBUG=1`` shows it).

Checkpoints are read with ``weights_only=True`` (rh3dgs checkpoints hold only tensors and
plain values; see :mod:`rh3dgs.nerfstudio.config`).

The cost is said up front: after the first :data:`ETA_AFTER` timed iterations (the first one,
with its one-off set-up, is not counted) the trainer prints ``ETA for N iterations: ...`` from
the median wall time between iteration starts (callbacks, densification, evaluation, logging and
checkpoints included), and prints an updated line when the running estimate moves by more than
a quarter (densification adds Gaussians, LIC starts): :class:`TrainingClock`. nerfstudio's own
ETA column extrapolates the last 20 iteration times and is first printed from iteration 0 alone.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Deque, List, Optional, Type

import torch
from nerfstudio.engine.trainer import Trainer, TrainerConfig
from nerfstudio.utils.rich_utils import CONSOLE

from ..errors import Rh3dgsError
from ..io.atomic import atomic_write, stale_temp_files
from ..io.nerfstudio_run import checkpoints_newest_first, load_checkpoint

__all__ = ["Rh3dgsTrainer", "Rh3dgsTrainerConfig", "CheckpointError", "TrainingClock", "ETA_AFTER", "MULTI_DEVICE_REFUSAL"]

ETA_AFTER = 5
"""Timed iterations before the first ``ETA for N iterations`` line."""


class CheckpointError(Rh3dgsError):
    """No usable checkpoint where a resume was asked for."""


def format_duration(seconds: float) -> str:
    """Seconds -> "2 h 05 m", "4 m 10 s", "12.3 s", "850 ms"."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(round(seconds)), 60)
    if m < 60:
        return f"{m} m {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} m"


class TrainingClock:
    """Estimated duration of a run, from the wall time between iteration starts.

    :meth:`tick` is called as each iteration starts; the interval to the next start covers all the
    loop does for that step. The first interval (one-off set-up) is not counted. After
    ``report_after`` timed intervals, ``tick`` returns ``"ETA for N iterations: ..."`` (total =
    elapsed + remaining x median interval); afterwards, an ``"ETA updated ..."`` line whenever the
    estimate from the median of the last ``window`` intervals moves by more than ``drift`` (a
    fraction) from the last one given. Otherwise it returns None.

    >>> c = TrainingClock(first_step=0, iterations=100, report_after=2)
    >>> [c.tick(s, now=t) for s, t in enumerate([0.0, 5.0, 6.0, 7.0])][-1]
    'ETA for 100 iterations: 1 m 44 s (1.0 s per iteration, median of iterations 1-2; 97 to go)'
    """

    def __init__(self, first_step: int, iterations: int, report_after: int = ETA_AFTER, drift: float = 0.25,
                 window: int = 20) -> None:
        self.first_step, self.iterations = int(first_step), int(iterations)
        self.report_after, self.drift = int(report_after), float(drift)
        self.recent: Deque[float] = deque(maxlen=int(window))
        """The last ``window`` timed intervals (seconds)."""
        self.timed = 0
        self.t0: Optional[float] = None
        self._prev: Optional[float] = None
        self._ticks = 0
        self.reported: Optional[float] = None
        """The last total (seconds) given."""

    def tick(self, step: int, now: Optional[float] = None, note: str = "") -> Optional[str]:
        """Iteration ``step`` starts (at ``now``, default the clock); ``note`` goes into the message."""
        now = time.perf_counter() if now is None else float(now)
        if self._ticks >= 2:  # the interval of iteration 0 (one-off set-up) is not counted
            self.recent.append(now - self._prev)
            self.timed += 1
        if self.t0 is None:
            self.t0 = now
        self._prev, self._ticks = now, self._ticks + 1
        if self.timed < self.report_after:
            return None
        note = f", {note}" if note else ""
        remaining = self.first_step + self.iterations - step
        per_it = statistics.median(self.recent)
        total = now - self.t0 + remaining * per_it
        if self.reported is None:
            self.reported = total
            return (f"ETA for {self.iterations} iterations: {format_duration(total)} ({format_duration(per_it)} per "
                    f"iteration, median of iterations 1-{self.timed}{note}; {remaining} to go)")
        if self.timed % self.recent.maxlen or abs(total - self.reported) <= self.drift * self.reported:
            return None
        self.reported = total
        return (f"ETA updated at iteration {step - self.first_step}: {format_duration(total)} for {self.iterations} "
                f"iterations ({format_duration(per_it)} per iteration lately{note}; "
                f"{format_duration(remaining * per_it)} to go)")


def _one_line_errors(previous):
    """A ``sys.excepthook`` that prints an uncaught :class:`Rh3dgsError` as one line (others: ``previous``)."""

    def hook(kind, value, tb):
        if isinstance(value, Rh3dgsError) and os.environ.get("RH3DGS_DEBUG") != "1":
            print(f"ns-train: error: {' '.join(str(value).split())}", file=sys.stderr)
            return
        previous(kind, value, tb)

    hook.rh3dgs = True  # type: ignore[attr-defined]
    return hook


class Rh3dgsTrainer(Trainer):
    """nerfstudio's Trainer with atomic checkpoint writes, a resume that skips broken files, an early ETA, and a run
    folder that exists only once the run can start (module doc)."""

    config: "Rh3dgsTrainerConfig"
    clock: Optional[TrainingClock] = None
    """Set by :meth:`train` (a loop driving :meth:`train_iteration` itself gets no ETA lines)."""
    _created: List[Path] = []
    """The run folder and those of its parents that did not exist before :meth:`setup` (removed on an early failure)."""

    def setup(self, test_mode="val") -> None:
        """nerfstudio's set-up; then the deferred ``config.yml``. Any failure removes what the run created."""
        run = Path(self.base_dir)
        self._created = [p for p in (run, *run.parents) if not p.exists()]
        try:
            super().setup(test_mode)
            TrainerConfig.save_config(self.config)
        except BaseException as exc:
            self._remove_run_folder()
            if isinstance(exc, Rh3dgsError) and not getattr(sys.excepthook, "rh3dgs", False):
                sys.excepthook = _one_line_errors(sys.excepthook)
            raise

    def _remove_run_folder(self) -> None:
        """Delete the run folder and the parents this run created (a run that never took a step)."""
        for p in self._created:  # the run folder first, then its new parents, innermost first
            if p.is_dir() and (p == Path(self.base_dir) or not any(p.iterdir())):
                shutil.rmtree(p, ignore_errors=True)

    def train(self) -> None:
        self.clock = TrainingClock(self._start_step, self.config.max_num_iterations)
        try:
            super().train()
        except BaseException:
            if self.step <= self._start_step and not any(self.checkpoint_dir.glob("step-*.ckpt")):
                self._remove_run_folder()  # failed before its first step: nothing to keep
            raise

    def train_iteration(self, step: int):
        if self.clock is not None:
            first = self.clock.reported is None
            msg = self.clock.tick(step, note=f"{self.pipeline.model.num_points} Gaussians")
            if msg:
                CONSOLE.log(msg)
            if msg and first and str(self.device).startswith("cpu") and self.clock.reported > 3600 \
                    and self.config.method_name != "rh3dgs-lite":
                CONSOLE.log("On a CPU, `ns-train rh3dgs-lite` is the preset sized to finish in minutes.")
        return super().train_iteration(step)

    def save_checkpoint(self, step: int) -> None:
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        ckpt_path = self.checkpoint_dir / f"step-{step:09d}.ckpt"
        pipeline = self.pipeline.module if hasattr(self.pipeline, "module") else self.pipeline
        state = {
            "step": step,
            "pipeline": pipeline.state_dict(),
            "optimizers": {k: v.state_dict() for (k, v) in self.optimizers.optimizers.items()},
            "schedulers": {k: v.state_dict() for (k, v) in self.optimizers.schedulers.items()},
            "scalers": self.grad_scaler.state_dict(),
        }
        with atomic_write(ckpt_path) as f:
            torch.save(state, f)
        if self.config.save_only_latest_checkpoint:
            for _, old in checkpoints_newest_first(self.checkpoint_dir):
                if old != ckpt_path:
                    old.unlink(missing_ok=True)
        for stale in stale_temp_files(self.checkpoint_dir, "step-*.ckpt"):  # saves a kill interrupted
            stale.unlink(missing_ok=True)

    def _load_checkpoint(self) -> None:
        load_dir: Optional[Path] = self.config.load_dir
        if load_dir is None or self.config.load_step is not None:
            return super()._load_checkpoint()
        load_dir = Path(load_dir)
        found = checkpoints_newest_first(load_dir) if load_dir.is_dir() else []
        skipped = []
        for step, path in found:
            try:
                state = load_checkpoint(path)  # CRC-32 of every record verified, weights_only
                if not isinstance(state, dict) or "pipeline" not in state:
                    raise ValueError("not a nerfstudio checkpoint (no 'pipeline' entry)")
            except Exception as e:  # a truncated, damaged or foreign file: say so and try the previous one
                skipped.append(f"{path.name} ({type(e).__name__}: {str(e)[:120]})")
                CONSOLE.print(f"[yellow]Skipping unreadable checkpoint {path}: {type(e).__name__}: {e}")
                continue
            self._start_step = state["step"] + 1
            self.pipeline.load_pipeline(state["pipeline"], state["step"])
            self.optimizers.load_optimizers(state["optimizers"])
            if "schedulers" in state and self.config.load_scheduler:
                self.optimizers.load_schedulers(state["schedulers"])
            self.grad_scaler.load_state_dict(state["scalers"])
            CONSOLE.print(f"Resumed from {path} (step {step})")
            return
        why = f"; unreadable: {', '.join(skipped)}" if skipped else ""
        raise CheckpointError(f"{load_dir}: no loadable step-*.ckpt checkpoint to resume from{why}. "
                              "Drop --load-dir to train from scratch.")


MULTI_DEVICE_REFUSAL = (
    "ns-train: error: {method} --machine.num-devices {devices} --machine.num-machines {machines}: rh3dgs trains on one "
    "device (splatfacto has no multi-GPU training, nerfstudio#3560). Train the geometry on one GPU (ns-train {method}, "
    "or splatfacto and ns-export gaussian-splat), then run the semantic parts data-parallel over K GPUs: torchrun "
    "--nproc_per_node=K -m rh3dgs.cli distill SCENE.ply --data DATA --output OUT (or lift; README, \"Past one "
    "machine\")")
"""The one line ``ns-train rh3dgs`` stops with when asked for more than one device."""


@dataclass
class Rh3dgsTrainerConfig(TrainerConfig):
    """:class:`TrainerConfig` that builds a :class:`Rh3dgsTrainer`; its ``config.yml`` is written once the trainer
    is set up (module doc)."""

    _target: Type = field(default_factory=lambda: Rh3dgsTrainer)

    def set_timestamp(self) -> None:
        """ns-train's first call on its config, before it saves it or starts processes: a run of more than one device
        stops here with one line (:data:`MULTI_DEVICE_REFUSAL`) instead of spawning workers that would fail."""
        devices, machines = int(self.machine.num_devices), int(self.machine.num_machines)
        if devices * machines > 1:
            raise SystemExit(MULTI_DEVICE_REFUSAL.format(method=self.method_name, devices=devices, machines=machines))
        super().set_timestamp()

    def save_config(self) -> None:
        """Deferred: nerfstudio's ``train.py`` calls this before the data, the teacher and the model are set up;
        :meth:`Rh3dgsTrainer.setup` writes ``config.yml`` (nerfstudio's :meth:`TrainerConfig.save_config`) when
        they are, so a run that cannot start leaves no run folder."""
