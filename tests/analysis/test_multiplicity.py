"""Holm's step-down adjustment and the paired t-test (lightning_modules/analysis/multiplicity.py), against a
textbook example, the definition written out another way, and scipy.stats."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from lightning_modules.analysis import stats
from lightning_modules.analysis.multiplicity import holm, paired_t, t_test


def test_holm_on_the_textbook_example() -> None:
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06 (monotone)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_holm_leaves_nan_alone_and_does_not_count_it() -> None:
    adjusted = holm([0.01, math.nan, 0.04])
    assert (
        adjusted[0] == pytest.approx(0.02) and adjusted[2] == pytest.approx(0.04) and math.isnan(adjusted[1])
    )
    assert all(math.isnan(v) for v in holm([math.nan, math.nan])) and holm([]) == []


def test_holm_caps_at_one_and_keeps_one_test_as_it_is() -> None:
    assert holm([0.5, 0.6, 0.9]) == [1.0, 1.0, 1.0]
    assert holm([0.037]) == [0.037]


def _holm_by_definition(p: list[float]) -> list[float]:
    """adjusted p_i = max over p_j <= p_i of min(1, (m - rank_j + 1) p_j), rank 1 = smallest."""
    m = len(p)
    ranked = sorted(p)
    return [max(min(1.0, (m - k) * q) for k, q in enumerate(ranked) if q <= pi) for pi in p]


@pytest.mark.parametrize("seed", range(5))
def test_holm_equals_its_definition_and_is_monotone(seed: int) -> None:
    p = list(np.random.default_rng(seed).uniform(0, 0.2, size=12))
    adjusted = holm(p)
    assert adjusted == pytest.approx(_holm_by_definition(p))
    order = np.argsort(p)
    assert all(np.diff(np.asarray(adjusted)[order]) >= 0) and all(
        a >= q for a, q in zip(adjusted, p, strict=True)
    )


@pytest.mark.parametrize("n", [2, 3, 5, 9])
def test_paired_t_is_scipys_ttest_rel_and_the_stats_interval(n: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.normal(5.6, 0.05, size=n)
    y = x + rng.normal(-0.03, 0.02, size=n)
    test = paired_t(list(y - x))
    assert test.p == pytest.approx(scipy.stats.ttest_rel(y, x).pvalue, rel=1e-9)
    ci = stats.mean_ci(list(y - x))
    assert (test.estimate, test.low, test.high) == pytest.approx((ci.mean, ci.low, ci.high))
    assert test.df == n - 1


def test_p_below_005_exactly_when_the_interval_excludes_zero() -> None:
    for shift in np.linspace(0, 0.05, 11):
        test = paired_t([shift - 0.01, shift, shift + 0.012])
        assert (test.p < 0.05) == (test.low > 0 or test.high < 0)


def test_paired_t_without_a_spread_estimate() -> None:
    one = paired_t([0.1])
    assert one.estimate == 0.1 and math.isnan(one.p) and math.isnan(one.low)
    assert math.isnan(paired_t([]).p)
    assert paired_t([0.02, 0.02, 0.02]).p == 0.0  # every seed agrees exactly
    assert math.isnan(paired_t([0.0, 0.0]).p)  # 0 / 0: no test


def test_t_test_is_scipys_t_distribution() -> None:
    test = t_test(0.05, 0.02, 16)
    assert test.p == pytest.approx(2 * scipy.stats.t.sf(2.5, 16), rel=1e-9)
    assert test.high - test.estimate == pytest.approx(scipy.stats.t.ppf(0.975, 16) * 0.02, rel=1e-9)
