"""Tokens-to-target: how much of a baseline's budget another attention needs to reach the baseline's final loss.

docs/paper-errata.md reports, at 2.5B, "the first step at which LRKV's curve reaches a baseline's final loss,
as a fraction of the budget saved". Here, for every size and every ordered pair (baseline B, other label A):
  target   = B's final validation loss (its last evaluation),
  budget   = B's tokens (or FLOPs) at that evaluation,
  reached  = the first x at which A's validation curve is at or below the target, interpolated linearly
             between the two evaluations around the crossing,
  saved    = 1 - reached / budget   (0.2: A got there with 20 % of the budget to spare; negative: later).
Validation, not test, on both sides: the crossing needs a curve, and comparing A's validation curve with
B's test loss would mix two held-out sets. With seeds, runs are paired by seed (same seed, same data order);
the mean and t-interval are over the pairs, and only when every pair reached the target (a pair that never
reached it has an unknown, larger cost, so averaging the others would flatter A).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from lightning_modules.analysis.analysis_errors import NoRunsError
from lightning_modules.analysis.stats import mean_ci
from lightning_modules.analysis.styles import label_sort_key, order_sizes
from lightning_modules.analysis.tidy import COLUMNS, require_columns

PER_SEED_COLUMNS = [
    "size",
    "baseline",
    "baseline_attention",
    "label",
    "attention",
    "seed",
    "target_loss",
    "budget",
    "reached_at",
    "reached",
    "saved",
]
SUMMARY_COLUMNS = [
    "size",
    "baseline",
    "baseline_attention",
    "label",
    "attention",
    "n",
    "n_reached",
    "saved_mean",
    "saved_ci_low",
    "saved_ci_high",
    "target_loss",
    "budget",
]


def reach_point(xs: Sequence[float], losses: Sequence[float], target: float) -> float:
    """First x at which the piecewise-linear curve through (xs, losses) is at or below `target`; NaN if
    it never is. If the first evaluation is already below, that evaluation's x (the crossing happened
    earlier, at a point nobody measured, so this is an upper bound)."""
    x = np.asarray(xs, dtype=float)
    y = np.asarray(losses, dtype=float)
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    below = np.flatnonzero(y <= target)
    if below.size == 0:
        return math.nan
    i = int(below[0])
    if i == 0:
        return float(x[0])
    x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
    return float(x0 + (y0 - target) / (y0 - y1) * (x1 - x0))  # y0 > target >= y1, so y0 != y1


def tokens_to_target_per_seed(runs: pd.DataFrame, x: str = "tokens") -> pd.DataFrame:
    """One row per size, baseline label, other label and shared seed; columns PER_SEED_COLUMNS.
    `x` is "tokens" (tokens-to-target) or "flops" (compute-to-target, against B's FLOPs budget)."""
    require_columns(runs, COLUMNS, "tokens_to_target")
    if x not in ("tokens", "flops"):
        raise ValueError(f"x={x!r}: allowed values are 'tokens', 'flops'")
    val = runs[runs["split"] == "val"]
    if val.empty:
        raise NoRunsError("no validation evaluations in the table: tokens-to-target needs curves")
    rows = []
    for size in order_sizes(val["size"]):
        curves = {
            key: group.sort_values("step")
            for key, group in val[val["size"] == size].groupby(["label", "seed"])
        }
        labels = _labels(val[val["size"] == size])
        for baseline, baseline_attention in labels:
            for label, attention in labels:
                if label == baseline:
                    continue
                shared = sorted(
                    {s for (lb, s) in curves if lb == baseline} & {s for (lb, s) in curves if lb == label}
                )
                for seed in shared:
                    base, other = curves[(baseline, seed)], curves[(label, seed)]
                    target = float(base["loss"].iloc[-1])
                    budget = float(base[x].iloc[-1])
                    reached_at = reach_point(other[x], other["loss"], target)
                    rows.append(
                        {
                            "size": size,
                            "baseline": baseline,
                            "baseline_attention": baseline_attention,
                            "label": label,
                            "attention": attention,
                            "seed": seed,
                            "target_loss": target,
                            "budget": budget,
                            "reached_at": reached_at,
                            "reached": not math.isnan(reached_at),
                            "saved": 1.0 - reached_at / budget,
                        }
                    )
    return pd.DataFrame(rows, columns=PER_SEED_COLUMNS)


def tokens_to_target(runs: pd.DataFrame, x: str = "tokens", confidence: float = 0.95) -> pd.DataFrame:
    """Per size, baseline and other label: the fraction of the baseline's budget saved, mean and t-interval
    over seed pairs (NaN interval below two pairs; NaN mean unless every pair reached); SUMMARY_COLUMNS.
    Pairs of labels without a seed in common are left out: there is nothing to pair."""
    per_seed = tokens_to_target_per_seed(runs, x)
    rows = []
    for keys, group in per_seed.groupby(
        ["size", "baseline", "baseline_attention", "label", "attention"], sort=False
    ):
        all_reached = bool(group["reached"].all())
        ci = mean_ci(group["saved"], confidence) if all_reached else None
        rows.append(
            {
                **dict(
                    zip(["size", "baseline", "baseline_attention", "label", "attention"], keys, strict=True)
                ),
                "n": len(group),
                "n_reached": int(group["reached"].sum()),
                "saved_mean": ci.mean if ci else math.nan,
                "saved_ci_low": ci.low if ci else math.nan,
                "saved_ci_high": ci.high if ci else math.nan,
                "target_loss": float(group["target_loss"].mean()),
                "budget": float(group["budget"].mean()),
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def saved_matrix(summary: pd.DataFrame, size: str) -> pd.DataFrame:
    """The summary of one size as text: rows the label that reaches, columns the baseline, cells
    "19.3 % [12.0, 26.5]" (mean [interval], in % of the baseline's budget), "not reached k/n" or "19.3 %"."""
    part = summary[summary["size"] == size]
    if part.empty:
        raise NoRunsError(f"no tokens-to-target rows for size {size!r}")
    order = [
        lb
        for lb, _ in sorted(
            {(r.label, r.attention) for r in part.itertuples()}, key=lambda r: label_sort_key(r[1], r[0])
        )
    ]
    cells = {(r.label, r.baseline): _cell(r) for r in part.itertuples()}
    return pd.DataFrame(
        [[cells.get((a, b), "") for b in order] for a in order],
        index=pd.Index(order, name="reaches"),
        columns=pd.Index(order, name="baseline's final loss"),
    )


def _cell(row: object) -> str:
    n, n_reached = row.n, row.n_reached  # type: ignore[attr-defined]
    if n_reached < n:
        return f"not reached {n - n_reached}/{n}"
    mean = 100 * row.saved_mean  # type: ignore[attr-defined]
    if n < 2:
        return f"{mean:.1f} % (1 seed)"
    return f"{mean:.1f} % [{100 * row.saved_ci_low:.1f}, {100 * row.saved_ci_high:.1f}]"  # type: ignore[attr-defined]


def _labels(rows: pd.DataFrame) -> list[tuple[str, str]]:
    pairs = rows[["label", "attention"]].drop_duplicates().itertuples(index=False)
    return sorted(((r.label, r.attention) for r in pairs), key=lambda r: label_sort_key(r[1], r[0]))
