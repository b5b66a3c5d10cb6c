"""The pooled arm + seed analysis: one additive model per size over all arms and seeds.

loss[arm, seed] = mu + alpha[arm] + beta[seed] + e, fitted by least squares on the final test cross-entropy
(the equal-FLOP view). The seed term absorbs what a seed does to every arm alike (its initialisation and data
order), as pairing by seed does; the residuals of all arms together estimate the noise, so a contrast
alpha[a] - alpha[b] gets the pooled residual sd with (A - 1)(S - 1) degrees of freedom instead of a single
pair's S - 1. On a complete table (every arm ran every seed) the estimate is the difference of the two arms'
means, and its standard error is sd_resid * sqrt(2 / S).

The assumption that buys the tighter interval: the noise is homogeneous, i.e. every pair's seed-to-seed
scatter of differences has the same variance and arm and seed do not interact. When one pair is much noisier
than the rest the pooled interval is too narrow for it (and too wide for the others); the per-pair intervals
of analysis/pairwise.py do not assume this. Only complete seeds are used: a seed that some arm of the size
lacks is left out for all arms (`seeds_dropped` counts them), so the table stays balanced (docs/statistics.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

from lightning_modules.analysis.families import Pair, family, ordered_pairs, with_holm
from lightning_modules.analysis.multiplicity import t_test
from lightning_modules.analysis.tidy import final_losses

VIEW = "pooled"
COLUMNS = ["size", "view", "split", "metric", "a", "b", "family", "n_arms", "n_seeds", "seeds_dropped", "df",
           "residual_sd", "diff_mean", "se", "ci_low", "ci_high", "p", "p_holm", "resolved"]  # fmt: skip


def two_way_fit(table: pd.DataFrame) -> tuple[pd.Series, float, int]:
    """Arm means, residual sd and residual degrees of freedom of the additive model on a complete table
    (rows: seeds, columns: arms)."""
    y = table.to_numpy(dtype=float)
    seeds, arms = y.shape
    fitted = y.mean(axis=1, keepdims=True) + y.mean(axis=0, keepdims=True) - y.mean()
    df = (arms - 1) * (seeds - 1)
    sd = math.sqrt(float(((y - fitted) ** 2).sum()) / df) if df > 0 else math.nan
    return pd.Series(y.mean(axis=0), index=table.columns), sd, df


def pooled_table(runs: pd.DataFrame, primary: Iterable[Pair] = (), metric: str = "loss") -> pd.DataFrame:
    """Every pairwise contrast of every size's arms under the additive model, Holm within each family."""
    primary = [tuple(p) for p in primary]
    finals = final_losses(runs)
    rows = []
    for size, part in finals.groupby("size", sort=False):
        labels = [str(label) for label in dict.fromkeys(part["label"])]
        kinds = part.groupby("label", sort=False)["attention"].first().astype(str).to_dict()
        wide = part.pivot_table(index="seed", columns="label", values=metric, aggfunc="first")[labels]
        complete = wide.dropna()
        means, sd, df = two_way_fit(complete)
        se = sd * math.sqrt(2 / len(complete)) if len(complete) else math.nan
        for a, b in ordered_pairs(labels, kinds, primary):
            t = t_test(float(means[a] - means[b]) if len(complete) else math.nan, se, df)
            rows.append({"size": size, "view": VIEW, "split": "test", "metric": metric, "a": a, "b": b,
                         "family": family(a, b, primary), "n_arms": len(labels), "n_seeds": len(complete),
                         "seeds_dropped": len(wide) - len(complete), "df": df, "residual_sd": sd,
                         "diff_mean": t.estimate, "se": se, "ci_low": t.low, "ci_high": t.high, "p": t.p})  # fmt: skip
    table = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("p_holm", "resolved")])
    return with_holm(table)[COLUMNS]
