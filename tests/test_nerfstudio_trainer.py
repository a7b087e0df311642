"""rh3dgs.nerfstudio.trainer.TrainingClock: the ``ETA for N iterations`` line of ``ns-train rh3dgs``.

Driven with given clock readings (no timing): the estimate is elapsed + remaining x median
interval, the first iteration's one-off set-up is not counted, and an update comes when the
per-iteration cost moves (densification, LIC) and not otherwise. The end-to-end test that
``ns-train`` prints it is in test_nerfstudio.py.
"""
from __future__ import annotations

import re

import pytest

pytest.importorskip("nerfstudio")

from rh3dgs.nerfstudio.trainer import TrainingClock, format_duration  # noqa: E402


def _drive(clock: TrainingClock, intervals, first_step: int = 0):
    now, lines = 100.0, []
    for i, dt in enumerate(intervals):
        msg = clock.tick(first_step + i, now=now, note="4000 Gaussians")
        if msg:
            lines.append((first_step + i, msg))
        now += dt
    return lines


def test_first_estimate_after_five_iterations_ignores_the_first():
    clock = TrainingClock(first_step=0, iterations=300)
    lines = _drive(clock, [30.0] + [2.0, 2.2, 1.8, 2.0, 2.1] + [2.0] * 10)
    step, msg = lines[0]
    assert step == 6  # iterations 1..5 timed
    # 32.1 s elapsed (the 30 s first iteration included once) + 294 iterations x 2.0 s (median)
    assert clock.reported == pytest.approx(30.0 + 10.1 + 294 * 2.0)
    assert msg.startswith("ETA for 300 iterations: 10 m 28 s (2.0 s per iteration, median of iterations 1-5, "
                          "4000 Gaussians; 294 to go)"), msg
    assert len(lines) == 1  # a steady cost: no update


def test_update_when_the_cost_moves_and_resumed_runs():
    clock = TrainingClock(first_step=1000, iterations=200, window=20)
    lines = _drive(clock, [5.0] + [1.0] * 40 + [3.0] * 60, first_step=1000)
    assert len(lines) == 2
    step, msg = lines[1]
    assert msg.startswith("ETA updated at iteration "), msg
    n = step - 1000
    assert 51 <= n <= 81  # once the median of the last 20 intervals moved (checked every 20)
    total = float(re.search(r"(\d+) m (\d+) s for 200", msg).group(1)) * 60
    assert total > 1.25 * 5 * 60  # well above the first estimate (~3.5 min)


def test_format_duration():
    assert [format_duration(s) for s in (0.0123, 1.25, 59.94, 61, 3600 * 30 + 125)] == \
        ["12 ms", "1.2 s", "59.9 s", "1 m 01 s", "30 h 02 m"]
