"""A run's validation loss at a given token count, read off its curve, for comparisons at equal tokens.

The study gives every arm one FLOP budget, so a cheaper attention trains more tokens: the final losses compare
equal compute, not equal data. To compare at equal data, a pair of runs (same seed) is read at the smaller of
their two last validated token counts (their final counts: every fit validates at its last step), on each run's
validation curve, interpolated linearly in tokens between the two evaluations around it. A curve is never
extrapolated: when the count lies outside the tokens a run evaluated, that run has no value there and its pair
is dropped (and counted) rather than guessed.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def loss_at(curve: pd.DataFrame, tokens: float, metric: str = "loss") -> float:
    """`metric` of the curve (rows with `tokens`, one run's evaluations on one split) at `tokens`, linear in
    tokens between evaluations; NaN when `tokens` lies outside the evaluated range (no extrapolation)."""
    points = curve[["tokens", metric]].dropna().sort_values("tokens")
    if points.empty or not math.isfinite(tokens):
        return math.nan
    x = points["tokens"].to_numpy(dtype=float)
    y = points[metric].to_numpy(dtype=float)
    if tokens < x[0] or tokens > x[-1]:
        return math.nan
    return float(np.interp(tokens, x, y))
