"""The frontier of KV-cache bytes per token against final loss, over attentions and rank / latent sweeps.

The paper compares attentions at different cache sizes (docs/paper-errata.md: "the comparison is not cache-matched";
below about 40 % cache MLA matches or beats LRKV). The fair reading is a Pareto frontier: a label is
Pareto-optimal when no other label of the same size caches at most as much and reaches at most the same
loss, with one of the two strictly smaller. Cache bytes are what the code caches (cost.kv_cache_bytes_per_token,
bf16, all layers); losses are means over seeds, so with few seeds a point near the frontier is within noise
of it: the intervals are drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from lightning_modules.analysis import paper
from lightning_modules.analysis.analysis_errors import MissingMetricsError
from lightning_modules.analysis.stats import summarise
from lightning_modules.analysis.styles import attention_style, order_sizes, size_sort_key
from lightning_modules.analysis.tidy import final_losses

FRONTIER_COLUMNS = [
    "size",
    "attention",
    "label",
    "kv_cache_bytes_per_token",
    "kv_cache_vs_mha",
    "loss_mean",
    "loss_ci_low",
    "loss_ci_high",
    "n",
    "pareto",
]
# The cost row's column of a variant's cache counted in the paper's convention (mla.py extra_costs).
PAPER_CONVENTION = "kv_cache_vs_mha_paper_convention"


def pareto_mask(cache: Sequence[float], loss: Sequence[float]) -> np.ndarray:
    """True where no other point has cache <= and loss <= with at least one strictly smaller."""
    c = np.asarray(cache, dtype=float)
    y = np.asarray(loss, dtype=float)
    no_worse = (c[None, :] <= c[:, None]) & (y[None, :] <= y[:, None])  # [i, j]: j at least as good as i
    better = (c[None, :] < c[:, None]) | (y[None, :] < y[:, None])
    return ~(no_worse & better).any(axis=1)


def cache_frontier(runs: pd.DataFrame, split: str = "test", confidence: float = 0.95) -> pd.DataFrame:
    """Per size and label: cache bytes per token, its fraction of MHA's, the final `split` loss (mean,
    t-interval, n seeds) and whether it is Pareto-optimal within its size; sorted by size, then cache,
    then loss. Columns FRONTIER_COLUMNS."""
    finals = final_losses(runs, split)
    lacking = sorted(set(finals["run_name"][finals["kv_cache_bytes_per_token"].isna()]))
    if lacking:
        raise MissingMetricsError(
            f"runs without the cost.kv_cache_bytes_per_token param: {'; '.join(lacking[:10])}"
        )
    group = ["size", "attention", "label"]
    caches = finals.groupby(group, sort=False)[["kv_cache_bytes_per_token", "kv_cache_vs_mha"]].agg(
        ["min", "max"]
    )
    disagree = caches[
        caches[("kv_cache_bytes_per_token", "min")] != caches[("kv_cache_bytes_per_token", "max")]
    ]
    if not disagree.empty:
        # Same label, different cache: the label does not identify the configuration, so no point is right.
        raise MissingMetricsError(
            f"runs of one size and label log different KV-cache bytes: {', '.join(map(str, disagree.index))}"
        )
    summary = summarise(finals, group, "loss", confidence)
    cache = caches.xs("min", axis=1, level=1).reset_index()
    table = summary.merge(cache, on=group)
    return _with_pareto(table)


def _with_pareto(table: pd.DataFrame) -> pd.DataFrame:
    table = table.copy()
    table["pareto"] = False
    for size in table["size"].unique():
        rows = table["size"] == size
        table.loc[rows, "pareto"] = pareto_mask(
            table.loc[rows, "kv_cache_bytes_per_token"], table.loc[rows, "loss_mean"]
        )
    table["_size"] = [size_sort_key(s) for s in table["size"]]
    table = table.sort_values(["_size", "kv_cache_bytes_per_token", "loss_mean"], kind="stable")
    return table[FRONTIER_COLUMNS].reset_index(drop=True)


def paper_frontier_128m() -> pd.DataFrame:
    """The paper's 128M points in the frontier's columns: its main runs and sweeps (paper.runs), one seed
    each, with the paper's own cache convention (MLA: latent only). Bytes come from the cost model
    (bf16, all layers of conf/model/128m.yaml) as a fraction of MHA's; they reproduce the printed percentages."""
    # late: the cost model and the registry import torch, which the frontier of logged runs does not need
    from lightning_modules.costs import counts as costs
    from lightning_modules.model.attention import resolve

    size = "128m"
    model = costs.load_configs([costs.fragment("model", size)])[0]
    baseline = costs.mha_cache_bytes_per_token(model)
    rows = []
    for config, ce in paper.runs(size):
        resolved = resolve(model, config)
        ours = costs.kv_cache_bytes_per_token(model, resolved)
        # The paper's count where the variant reports one (its cost row's extra column), else what is cached.
        fraction = resolved.variant.extra_costs(model, resolved.knobs).get(PAPER_CONVENTION, ours / baseline)
        rows.append(
            {
                "size": size,
                "attention": config.kind,
                "label": config.label(),
                "kv_cache_bytes_per_token": float(round(fraction * baseline)),
                "kv_cache_vs_mha": fraction,
                "loss_mean": ce,
                "loss_ci_low": math.nan,
                "loss_ci_high": math.nan,
                "n": 1,
            }
        )
    return _with_pareto(pd.DataFrame(rows))


def plot_cache_frontier(frontier: pd.DataFrame, title: str | None = None) -> Figure:
    """A panel per size: loss against KV cache as a % of MHA's (bytes per token beside each label).
    Filled markers and the grey staircase: Pareto-optimal; hollow: dominated; bars: t-interval over seeds."""
    sizes = order_sizes(frontier["size"])
    ncols = min(len(sizes), 3)
    nrows = math.ceil(len(sizes) / ncols)
    width = 5.6 * ncols if ncols > 1 else 7.5  # a lone panel (a sweep) needs room for its labels
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, 4.6 * nrows), squeeze=False)
    for ax, size in zip(axes.flat, sizes, strict=False):
        part = frontier[frontier["size"] == size]
        best = part[part["pareto"]].sort_values("kv_cache_bytes_per_token")
        # The staircase bounds what is attainable: at any larger cache, at least the frontier's loss.
        ax.step(100 * best["kv_cache_vs_mha"], best["loss_mean"], where="post", color="0.6", lw=1.2, zorder=1)
        for row in part.itertuples(index=False):
            style = attention_style(row.attention)
            half = (row.loss_ci_high - row.loss_ci_low) / 2 if row.n >= 2 else None
            ax.errorbar(
                100 * row.kv_cache_vs_mha,
                row.loss_mean,
                yerr=half,
                fmt="o",
                color=style["color"],
                markerfacecolor=style["color"] if row.pareto else "white",
                markersize=7,
                capsize=3,
                zorder=2,
            )
            # Label just above-right (clear of the staircase, which runs right at the point's height), in the
            # point's colour, so that close points stay told apart.
            ax.annotate(
                f"{row.label} ({row.kv_cache_bytes_per_token:,.0f} B)",
                (100 * row.kv_cache_vs_mha, row.loss_mean),
                textcoords="offset points",
                xytext=(5, 3),
                va="bottom",
                fontsize=7,
                color=style["color"],
            )
        ax.set_title(size)
        ax.set_xlabel("KV cache per token (% of MHA's; labels: bytes per token, bf16, all layers)")
        ax.set_ylabel("final loss (nats/token)")
        ax.grid(alpha=0.3)
        ax.margins(x=0.22, y=0.12)
        ax.legend(
            [
                Line2D([], [], ls="", marker="o", color="0.3"),
                Line2D([], [], ls="", marker="o", color="0.3", markerfacecolor="white"),
            ],
            ["Pareto-optimal", "dominated"],
            fontsize=8,
            loc="best",
        )
    for ax in list(axes.flat)[len(sizes) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
