"""A sweep's validation curves (lightning_modules/commands/sweep.py): each column minus the reference at every
evaluation step both runs of an (arm, seed) pair made.

The final test CE says where two runs end; the curve says how they got there. For a control that repeats a run
under a change that should not matter (another kind of CPU, another commit: conf/study/main-kind-control.yaml),
the difference along the run shows whether the two trajectories drift apart as training amplifies float-level
differences, or stay within a fixed band. Read from the ledgers' evaluations.csv (ledger.py); a ledger without
one contributes no curve.
"""

from __future__ import annotations

import pandas as pd

from lightning_modules.analysis.formatting import md_table
from lightning_modules.analysis.sweep_table import Column

KEYS = ["label", "seed", "step"]


def curves(column: Column) -> pd.DataFrame:
    """(label, seed, step, tokens, loss) of the column's validation evaluations; a run in two of its folders
    counts once."""
    parts = [
        pd.read_csv(folder / column.evaluations_file, usecols=[*KEYS, "split", "tokens", "loss"])
        for folder in column.folders
        if (folder / column.evaluations_file).is_file()
    ]
    if not parts:
        return pd.DataFrame(columns=[*KEYS, "tokens", "loss"])
    table = pd.concat(parts)
    table = table[table["split"] == "val"].dropna(subset=["loss"])
    return table.drop(columns="split").drop_duplicates(KEYS).reset_index(drop=True)


def curve_differences(columns: list[Column], reference: str) -> pd.DataFrame:
    """One row per (column, arm, seed, step) both the column and the reference evaluated: their validation
    losses and column - reference."""
    by_name = {c.name: c for c in columns}
    ref = curves(by_name[reference]).rename(columns={"loss": "loss_reference"})
    parts = []
    for column in columns:
        if column.name == reference:
            continue
        mine = curves(column).drop(columns="tokens")
        both = ref.merge(mine, on=KEYS, how="inner")
        both.insert(0, "column", column.name)
        parts.append(both)
    table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if table.empty:
        return pd.DataFrame(columns=["column", *KEYS, "tokens", "loss_reference", "loss", "diff"])
    table["diff"] = table["loss"] - table["loss_reference"]
    return table.sort_values(["column", "label", "seed", "step"]).reset_index(drop=True)


def curves_section(differences: pd.DataFrame, reference: str) -> list[str]:
    """Per column and evaluation step: the pairs, their mean difference and the mean and largest absolute difference."""
    if differences.empty:
        return []
    d = differences.assign(abs_diff=differences["diff"].abs())
    view = (
        d.groupby(["column", "step"], sort=True)
        .agg(
            tokens=("tokens", "median"),
            pairs=("diff", "size"),
            mean=("diff", "mean"),
            mean_abs=("abs_diff", "mean"),
            max_abs=("abs_diff", "max"),
        )
        .reset_index()
    )
    table = pd.DataFrame(
        {
            "column": view["column"],
            "step": view["step"].map(lambda s: f"{s:,.0f}"),
            "tokens": view["tokens"].map(lambda t: f"{t:,.0f}"),
            "pairs": view["pairs"],
            "mean diff": view["mean"].map(lambda v: f"{v:+.4f}"),
            "mean abs diff": view["mean_abs"].map(lambda v: f"{v:.4f}"),
            "largest abs diff": view["max_abs"].map(lambda v: f"{v:.4f}"),
        }
    )
    return [
        "",
        f"Validation CE along the run, each column minus {reference} at the evaluation steps both runs of an "
        "(arm, seed) pair made, over every such pair (`curves.csv` has each one):",
        "",
        md_table(table),
    ]
