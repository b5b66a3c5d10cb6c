"""Loss against training tokens or cumulative training FLOPs: one panel per size, one line per attention label.

Each line is the mean over seeds of the validation loss at each evaluation, with a shaded t-interval where
two or more seeds ran; a marker at the end of each line is the final test loss (mean and interval over
seeds). Differences between attentions are hundredths of a nat against a curve that falls by nats
(docs/paper-errata.md), so by default the y-axis is zoomed to the part of the run after `zoom` of the budget.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from lightning_modules.analysis.analysis_errors import NoRunsError
from lightning_modules.analysis.stats import summarise
from lightning_modules.analysis.styles import SWEEP_MARKERS, attention_style, label_sort_key, order_sizes
from lightning_modules.analysis.tidy import COLUMNS, require_columns
from lightning_modules.analysis.units import axis_label

GROUP = ["size", "attention", "label"]
SPLIT_NAMES = {"val": "validation", "test": "test"}


def mean_curves(
    runs: pd.DataFrame, x: str = "tokens", split: str = "val", confidence: float = 0.95
) -> pd.DataFrame:
    """Per size, label and step: mean `x` and the loss's mean, t-interval (NaN below two seeds) and n seeds."""
    require_columns(runs, COLUMNS, "mean_curves")
    rows = runs[runs["split"] == split]
    if rows.empty:
        raise NoRunsError(f"no {split} evaluations in the table")
    keys = [*GROUP, "step"]
    summary = summarise(rows, keys, "loss", confidence)
    xs = rows.groupby(keys, sort=False)[x].mean().rename(x).reset_index()
    return (
        summary.merge(xs, on=keys, how="left").sort_values([*GROUP, x], kind="stable").reset_index(drop=True)
    )


def plot_loss_curves(
    runs: pd.DataFrame,
    x: str = "tokens",
    split: str = "val",
    zoom: float | None = 0.2,
    confidence: float = 0.95,
    show_test: bool = True,
) -> Figure:
    """Loss against `x` ("tokens" or "flops"), a panel per size in the fixed size order. `zoom`: the y-axis
    spans the losses reached after this fraction of each panel's largest x (None: everything)."""
    curves = mean_curves(runs, x, split, confidence)
    tests = _test_points(runs, x, confidence) if show_test else pd.DataFrame()
    sizes = order_sizes(curves["size"])
    ncols = min(len(sizes), 3)
    nrows = math.ceil(len(sizes) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.6 * ncols, 4.2 * nrows), squeeze=False)
    for ax, size in zip(axes.flat, sizes, strict=False):
        panel_tests = tests[tests["size"] == size] if show_test else tests
        _draw_panel(ax, curves[curves["size"] == size], panel_tests, x, split, zoom)
        ax.set_title(size)
    for ax in list(axes.flat)[len(sizes) :]:
        ax.set_visible(False)
    note = f"lines: mean {SPLIT_NAMES.get(split, split)} loss over seeds; bands: {confidence:.0%} t-interval (2+ seeds)"
    if show_test and not tests.empty:
        note += "; hollow markers: final test loss"
    fig.suptitle(note, fontsize=9)
    fig.tight_layout()
    return fig


def _test_points(runs: pd.DataFrame, x: str, confidence: float) -> pd.DataFrame:
    rows = runs[runs["split"] == "test"]
    if rows.empty:
        return pd.DataFrame(columns=[*GROUP, "loss_mean", "loss_ci_low", "loss_ci_high", "n", x])
    last = rows.loc[rows.groupby("run_id", sort=False)["step"].idxmax()]
    summary = summarise(last, GROUP, "loss", confidence)
    xs = last.groupby(GROUP, sort=False)[x].mean().rename(x).reset_index()
    return summary.merge(xs, on=GROUP, how="left")


def _draw_panel(
    ax: Axes, curves: pd.DataFrame, tests: pd.DataFrame, x: str, split: str, zoom: float | None
) -> None:
    x_max = max(curves[x].max(), tests[x].max() if not tests.empty else 0.0)
    unit, xlabel = axis_label(x, x_max)
    labels = sorted(
        curves[["attention", "label"]].drop_duplicates().itertuples(index=False),
        key=lambda r: label_sort_key(*r),
    )
    seen: dict[str, int] = {}
    for attention, label in labels:
        style = attention_style(attention)
        marker = SWEEP_MARKERS[seen.get(attention, 0) % len(SWEEP_MARKERS)]
        seen[attention] = seen.get(attention, 0) + 1
        curve = curves[curves["label"] == label]
        xs = curve[x] / unit.scale
        n = int(curve["n"].max())
        if len(curve) == 1:
            marker = marker or "o"  # a run validated once is a point; a line without a marker would not show
        ax.plot(xs, curve["loss_mean"], marker=marker, markersize=4, label=f"{label} (n={n})", **style)
        if n >= 2:
            ax.fill_between(
                xs, curve["loss_ci_low"], curve["loss_ci_high"], color=style["color"], alpha=0.15, lw=0
            )
        point = tests[tests["label"] == label] if not tests.empty else tests
        for row in point.itertuples(index=False):
            half = (row.loss_ci_high - row.loss_ci_low) / 2 if row.n >= 2 else None
            ax.errorbar(
                getattr(row, x) / unit.scale,
                row.loss_mean,
                yerr=half,
                fmt=marker or "o",
                color=style["color"],
                markerfacecolor="white",
                markersize=6,
                capsize=3,
            )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"{SPLIT_NAMES.get(split, split)} loss (nats/token)")
    ax.grid(alpha=0.3)
    if zoom is not None:
        _zoom(ax, curves, tests, x, x_max, zoom)
    handles, names = ax.get_legend_handles_labels()
    if not tests.empty:
        handles.append(Line2D([], [], ls="", marker="o", color="0.3", markerfacecolor="white"))
        names.append("test loss (end)")
    ax.legend(handles, names, fontsize=8)


def _zoom(ax: Axes, curves: pd.DataFrame, tests: pd.DataFrame, x: str, x_max: float, zoom: float) -> None:
    late = curves[curves[x] >= zoom * x_max]
    if late.empty:
        return
    values = pd.concat(
        [late["loss_mean"], late["loss_ci_low"], late["loss_ci_high"]]
        + ([tests["loss_mean"], tests["loss_ci_low"], tests["loss_ci_high"]] if not tests.empty else [])
    ).dropna()
    low, high = float(values.min()), float(values.max())
    pad = 0.05 * (high - low) or 0.01
    ax.set_ylim(low - pad, high + pad)
