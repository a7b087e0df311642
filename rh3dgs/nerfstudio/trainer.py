"""nerfstudio ``Trainer`` with crash-safe checkpoints (``ns-train rh3dgs`` can be killed at any moment).

nerfstudio writes ``step-XXXXXXXXX.ckpt`` with a plain ``torch.save`` to its final name, so a
run killed while saving leaves a truncated checkpoint that ``--load-dir`` then picks as the
latest and fails on. Here:

* :meth:`Rh3dgsTrainer.save_checkpoint` writes through :func:`rh3dgs.io.atomic.atomic_write`
  (temp file, fsync, rename): a ``.ckpt`` file is always complete. The older checkpoints are
  deleted (``save_only_latest_checkpoint``) only after the new one is in place.
* :meth:`Rh3dgsTrainer._load_checkpoint` with ``--load-dir`` and no ``--load-step`` resumes from
  the newest checkpoint that loads, skipping (and naming) unreadable ones instead of crashing;
  temp files of an interrupted save are ignored. With no loadable checkpoint it stops with
  a clear error. ``--load-step`` / ``--load-checkpoint`` load exactly what they name.

Checkpoints are read with ``weights_only=True`` (rh3dgs checkpoints hold only tensors and
plain values; see :mod:`rh3dgs.nerfstudio.config`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Type

import torch
from nerfstudio.engine.trainer import Trainer, TrainerConfig
from nerfstudio.utils.rich_utils import CONSOLE

from ..errors import Rh3dgsError
from ..io.atomic import atomic_write, stale_temp_files
from ..io.nerfstudio_run import checkpoints_newest_first

__all__ = ["Rh3dgsTrainer", "Rh3dgsTrainerConfig", "CheckpointError"]


class CheckpointError(Rh3dgsError):
    """No usable checkpoint where a resume was asked for."""


class Rh3dgsTrainer(Trainer):
    """nerfstudio's Trainer with atomic checkpoint writes and a resume that skips broken files."""

    config: "Rh3dgsTrainerConfig"

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
                state = torch.load(path, map_location="cpu", weights_only=True)
                if not isinstance(state, dict) or "pipeline" not in state:
                    raise ValueError("not a nerfstudio checkpoint (no 'pipeline' entry)")
            except Exception as e:  # a truncated or foreign file: say so and try the previous one
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


@dataclass
class Rh3dgsTrainerConfig(TrainerConfig):
    """:class:`TrainerConfig` that builds a :class:`Rh3dgsTrainer`."""

    _target: Type = field(default_factory=lambda: Rh3dgsTrainer)
