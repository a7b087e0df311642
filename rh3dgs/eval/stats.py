"""Paired comparisons of methods: mean difference with a Student-t 95 % interval.

A suite run scores every method on the same (scene, teacher draw) pairs, so two methods are
compared by the per-pair differences ``d_k = score_method(k) - score_baseline(k)``: the mean
``d_bar``, its 95 % interval ``d_bar +- t_{0.975, n-1} s / sqrt(n)`` (``s`` the sample standard
deviation of the ``d_k``), the number of pairs, and the smallest difference. This removes the
spread between scenes (which is much larger than most method differences) from the comparison.

>>> from rh3dgs.eval.stats import paired_difference
>>> r = paired_difference([0.62, 0.70, 0.55], [0.60, 0.66, 0.55])
>>> round(r.mean, 4), r.n
(0.02, 3)
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, Sequence

import numpy as np

__all__ = ["PairedDifference", "paired_difference", "t_quantile_975"]


def t_quantile_975(dof: int) -> float:
    """The 0.975 quantile of Student's t with ``dof`` degrees of freedom (scipy)."""
    from scipy.stats import t

    return float(t.ppf(0.975, dof)) if dof >= 1 else math.inf


@dataclass
class PairedDifference:
    """Mean of paired differences, its 95 % interval [lo, hi], the smallest difference and n."""

    mean: float
    lo: float
    hi: float
    min: float
    n: int

    def as_dict(self) -> Dict[str, float]:
        return asdict(self)

    def fmt(self, scale: float = 100.0, digits: int = 2) -> str:
        """``+1.23 [+0.40, +2.06]`` (in points with the default ``scale``)."""
        if self.n == 0:
            return "-"
        if self.n == 1:
            return f"{scale * self.mean:+.{digits}f}"
        return f"{scale * self.mean:+.{digits}f} [{scale * self.lo:+.{digits}f}, {scale * self.hi:+.{digits}f}]"


def paired_difference(method: Sequence[float], baseline: Sequence[float]) -> PairedDifference:
    """Paired difference ``method - baseline`` over matched runs (NaN pairs are dropped)."""
    a, b = np.asarray(method, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired_difference: {a.shape} vs {b.shape} runs")
    d = (a - b)[np.isfinite(a) & np.isfinite(b)]
    n = int(d.size)
    if n == 0:
        return PairedDifference(math.nan, math.nan, math.nan, math.nan, 0)
    m = float(d.mean())
    if n == 1:
        return PairedDifference(m, math.nan, math.nan, m, 1)
    half = t_quantile_975(n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
    return PairedDifference(m, m - half, m + half, float(d.min()), n)
