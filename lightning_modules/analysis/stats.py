"""Mean and confidence interval over seeds.

The paper reports one seed per run and effects of 0.01-0.03 nats (docs/paper-errata.md); with a handful of seeds the
normal approximation is too narrow, so the interval uses Student's t with n - 1 degrees of freedom:
mean +/- t_{(1+c)/2, n-1} * s / sqrt(n), s the sample standard deviation. One value gives no interval (NaN
bounds), never a zero-width one. scipy comes with mlflow (a declared dependency); only its t quantile is used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import stdtrit  # the t quantile; scipy.stats would cost a second to import


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float  # NaN when n < 2
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> Interval:
    """Mean of the finite `values` and the two-sided t-interval at `confidence`."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence}: must be strictly between 0 and 1")
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, 1)
    half = float(stdtrit(n - 1, (1 + confidence) / 2)) * float(x.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def summarise(
    table: pd.DataFrame, by: Sequence[str], value: str, confidence: float = 0.95, prefix: str | None = None
) -> pd.DataFrame:
    """Per group of `by`: `{prefix}mean`, `{prefix}ci_low`, `{prefix}ci_high` and `n` of column `value`
    (prefix defaults to f"{value}_"). Groups keep their first-appearance order."""
    prefix = f"{value}_" if prefix is None else prefix
    rows = []
    for key, group in table.groupby(list(by), sort=False, dropna=False):
        ci = mean_ci(group[value], confidence)
        keys = key if isinstance(key, tuple) else (key,)
        rows.append(
            {
                **dict(zip(by, keys, strict=True)),
                f"{prefix}mean": ci.mean,
                f"{prefix}ci_low": ci.low,
                f"{prefix}ci_high": ci.high,
                "n": ci.n,
            }
        )
    columns = [*by, f"{prefix}mean", f"{prefix}ci_low", f"{prefix}ci_high", "n"]
    return pd.DataFrame(rows, columns=columns)
