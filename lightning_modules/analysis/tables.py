"""Tables of runs: what is in the store, and the final losses with intervals beside the paper's."""

from __future__ import annotations

import math

import pandas as pd

from lightning_modules.analysis import paper
from lightning_modules.analysis.stats import summarise
from lightning_modules.analysis.tidy import COLUMNS, final_losses, require_columns

GROUP = ["size", "attention", "label"]


def runs_overview(runs: pd.DataFrame) -> pd.DataFrame:
    """Per size and label: the seeds, number of evaluations, budget tag and the tokens and FLOPs reached."""
    require_columns(runs, COLUMNS, "runs_overview")
    val = runs[runs["split"] == "val"]
    last = val.loc[val.groupby("run_id", sort=False)["step"].idxmax()]
    grouped = last.groupby(GROUP, sort=False)
    overview = grouped.agg(
        seeds=("seed", lambda s: ", ".join(str(v) for v in sorted(s))),
        budget=("budget", lambda s: ", ".join(sorted({str(v) for v in s}))),
        tokens=("tokens", "max"),
        flops=("flops", "max"),
        kv_cache_vs_mha=("kv_cache_vs_mha", "first"),
    )
    evaluations = val.groupby(GROUP, sort=False)["step"].nunique().rename("evaluations")
    return overview.join(evaluations).reset_index()


def final_loss_table(runs: pd.DataFrame, split: str = "test", confidence: float = 0.95) -> pd.DataFrame:
    """Per size and label: final `split` loss and bits per byte (mean, t-interval, n seeds) and the paper's
    test loss where the paper ran the same configuration (paper.loss_for)."""
    finals = final_losses(runs, split)
    loss = summarise(finals, GROUP, "loss", confidence)
    bpb = summarise(finals, GROUP, "bpb", confidence).drop(columns="n")
    table = loss.merge(bpb, on=GROUP)
    table["paper_test_loss"] = [
        _or_nan(paper.loss_for(r.size, r.attention, r.label)) for r in table.itertuples(index=False)
    ]
    return table


def format_final_losses(table: pd.DataFrame) -> pd.DataFrame:
    """final_loss_table() for reading: "2.893 [2.881, 2.905]" cells, n, and the paper's number."""
    return pd.DataFrame(
        {
            "size": table["size"],
            "label": table["label"],
            "n seeds": table["n"],
            "loss (nats/token)": [
                _interval(r.loss_mean, r.loss_ci_low, r.loss_ci_high) for r in table.itertuples()
            ],
            "bits per byte": [_interval(r.bpb_mean, r.bpb_ci_low, r.bpb_ci_high) for r in table.itertuples()],
            "paper test loss": table["paper_test_loss"].map(lambda v: "" if math.isnan(v) else f"{v:.3f}"),
        }
    )


def _interval(mean: float, low: float, high: float) -> str:
    if math.isnan(mean):
        return ""
    return f"{mean:.3f}" if math.isnan(low) else f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value
