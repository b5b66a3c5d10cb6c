"""A forest plot of paired differences: the declared primary comparisons, then every arm against mha.

One row per comparison (equal-FLOP view of analysis/pairwise.py's table): the mean difference a - b in final
test cross-entropy and its 95 % t-interval; a filled marker when the difference is resolved after Holm's
correction within its family, an open one otherwise. Twenty-odd intervals read faster as bars around zero than
as a table of bracketed numbers.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from lightning_modules.analysis.families import PRIMARY
from lightning_modules.analysis.pairwise import EQUAL_FLOPS
from lightning_modules.costs.counts import BASELINE


def forest_rows(pairs: pd.DataFrame) -> pd.DataFrame:
    """The rows the plot shows, top to bottom: primary pairs, then the other pairs with the baseline (mha)."""
    flops = pairs[pairs["view"] == EQUAL_FLOPS]
    primary = flops[flops["family"] == PRIMARY]
    with_baseline = (flops["a_attention"] == BASELINE) | (flops["b_attention"] == BASELINE)
    return pd.concat([primary, flops[(flops["family"] != PRIMARY) & with_baseline]])


def plot_forest(pairs: pd.DataFrame, title: str = "") -> Figure:
    rows = forest_rows(pairs).reset_index(drop=True)
    fig = Figure(figsize=(7.5, 0.9 + 0.38 * max(len(rows), 1)))
    ax = fig.add_subplot()
    if rows.empty:
        ax.text(0.5, 0.5, "no pairs of arms", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    sizes = rows["size"].nunique() > 1
    y = list(range(len(rows)))[::-1]
    for yi, r in zip(y, rows.itertuples(), strict=True):
        colour = "tab:red" if r.family == PRIMARY else "tab:blue"
        ax.plot([r.ci_low, r.ci_high], [yi, yi], color=colour, linewidth=1.5)
        ax.plot([r.diff_mean], [yi], "o", color=colour, markerfacecolor=colour if r.resolved else "white")
    labels = [
        f"{f'{r.size} ' if sizes else ''}{r.a} - {r.b} ({r.family}, n={r.n_pairs})" for r in rows.itertuples()
    ]
    ax.set_yticks(y, labels)
    ax.axvline(0.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("a - b, final test CE (nats/token), mean and 95 % t-interval; filled: resolved after Holm")
    ax.set_title(title)
    return fig
