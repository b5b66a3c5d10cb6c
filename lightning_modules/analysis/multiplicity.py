"""Paired t-tests and Holm's correction for testing many comparisons at once.

A study compares every pair of arms, so at a 5 % level one comparison in twenty "resolves" by chance alone.
Holm's step-down adjustment keeps the chance of any false claim in a family at 5 % (the family-wise error
rate) without assuming the tests are independent, and it is never less powerful than Bonferroni: sort the m
p-values, multiply the k-th smallest (k = 1..m) by m - k + 1, carry the running maximum so that the adjusted
values keep the raw order (monotone), and cap at 1. A NaN p-value (a pair with fewer than two seeds) is no
test: it stays NaN and is not counted in m. The paired test is Student's t on the differences (n - 1 degrees
of freedom), the same interval lightning_modules/analysis/stats.py gives, so `p < 0.05` exactly when that
95 % interval excludes 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import stdtr, stdtrit  # t CDF and quantile; scipy.stats would cost a second to import


@dataclass(frozen=True)
class TTest:
    """A t statistic's estimate, standard error, degrees of freedom, interval and two-sided p-value."""

    estimate: float
    se: float
    df: float
    low: float  # NaN without a test (df < 1 or no spread estimate)
    high: float
    p: float


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values in the input order; NaN in, NaN out (and not counted in m)."""
    p = np.asarray(p_values, dtype=float)
    adjusted = np.full(p.shape, math.nan)
    finite = np.flatnonzero(~np.isnan(p))
    m = len(finite)
    order = finite[np.argsort(p[finite], kind="stable")]
    running = 0.0
    for k, index in enumerate(order):
        running = max(running, (m - k) * float(p[index]))
        adjusted[index] = min(1.0, running)
    return [float(v) for v in adjusted]


def t_test(estimate: float, se: float, df: float, confidence: float = 0.95) -> TTest:
    """Two-sided test of estimate = 0 and its t-interval, from a standard error with `df` degrees of freedom.
    A zero standard error with a non-zero estimate is p = 0 (every seed agrees exactly); 0 / 0 is no test."""
    if not (df >= 1 and math.isfinite(se) and math.isfinite(estimate)):
        return TTest(estimate, se, df, math.nan, math.nan, math.nan)
    half = float(stdtrit(df, (1 + confidence) / 2)) * se
    return TTest(estimate, se, df, estimate - half, estimate + half, _two_sided(estimate, se, df))


def _two_sided(estimate: float, se: float, df: float) -> float:
    if se == 0:
        return math.nan if estimate == 0 else 0.0
    return min(1.0, float(2 * stdtr(df, -abs(estimate) / se)))


def paired_t(differences: Iterable[float], confidence: float = 0.95) -> TTest:
    """The paired t-test of mean difference = 0 over the finite `differences` (one per seed pair), as
    scipy.stats.ttest_rel gives it for the two samples: t = mean / (sd / sqrt(n)), n - 1 degrees of freedom."""
    x = np.asarray([d for d in differences if d is not None and math.isfinite(d)], dtype=float)
    n = len(x)
    if n == 0:
        return TTest(math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    if n < 2:
        return TTest(float(x.mean()), math.nan, 0.0, math.nan, math.nan, math.nan)
    return t_test(float(x.mean()), float(x.std(ddof=1)) / math.sqrt(n), n - 1, confidence)
