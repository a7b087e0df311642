"""rh3dgs.eval.stats: paired differences against a hand computation."""
import math

import pytest

from rh3dgs.eval.stats import paired_difference, t_quantile_975


def test_paired_difference_by_hand():
    a = [0.70, 0.62, 0.81, 0.55]
    b = [0.65, 0.60, 0.80, 0.50]
    r = paired_difference(a, b)
    d = [0.05, 0.02, 0.01, 0.05]
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    half = 3.182446305284263 * sd / 2  # t_{0.975, 3} = 3.1824
    assert r.n == 4 and r.mean == pytest.approx(mean)
    assert r.lo == pytest.approx(mean - half) and r.hi == pytest.approx(mean + half)
    assert r.min == pytest.approx(0.01)
    assert r.fmt() == f"{100 * mean:+.2f} [{100 * (mean - half):+.2f}, {100 * (mean + half):+.2f}]"
    assert t_quantile_975(3) == pytest.approx(3.182446, rel=1e-6)


def test_nan_pairs_dropped_and_small_n():
    r = paired_difference([0.5, float("nan"), 0.7], [0.4, 0.3, float("nan")])
    assert r.n == 1 and r.mean == pytest.approx(0.1) and math.isnan(r.lo) and r.fmt() == "+10.00"
    assert paired_difference([], []).n == 0 and paired_difference([], []).fmt() == "-"
    with pytest.raises(ValueError):
        paired_difference([1.0], [1.0, 2.0])
