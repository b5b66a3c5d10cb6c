"""The table of a sweep across protocols (the command: lightning_modules/commands/sweep.py, whose docstring says what it
answers): per arm, every column's final test CE, the best column, and each column minus the reference paired
by seed with Holm's adjustment over all comparisons (docs/statistics.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lightning_modules.analysis.formatting import p_value, signed
from lightning_modules.analysis.multiplicity import holm, paired_t
from lightning_modules.analysis.stats import mean_ci
from lightning_modules.core.errors import ConfigError


@dataclass(frozen=True)
class Column:
    """A column of a sweep: its name and the ledger folders whose runs it pools, with the ledger's file names
    (lightning_modules/study/ledger.py owns the ledger's layout; the command passes them)."""

    name: str
    folders: tuple[Path, ...]
    runs_file: str
    evaluations_file: str


def finals(column: Column) -> pd.DataFrame:
    """(label, seed) -> test loss of the column's done runs; a run in two of its folders counts once."""
    parts = []
    for folder in column.folders:
        path = folder / column.runs_file
        if not path.is_file():
            raise ConfigError(
                f"column {column.name}: no ledger {path}; run the protocol and --report it first"
            )
        parts.append(pd.read_csv(path)[["label", "seed", "test_loss"]])
    table = pd.concat(parts).dropna(subset=["test_loss"]).drop_duplicates(["label", "seed"])
    return table.set_index(["label", "seed"])["test_loss"]


def sweep(columns: list[Column], reference: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    names = [c.name for c in columns]
    if reference not in names:
        raise ConfigError(f"--reference {reference}: not one of the columns ({', '.join(names)})")
    losses = {c.name: finals(c) for c in columns}
    labels = list(dict.fromkeys(label for c in names for label in losses[c].index.get_level_values(0)))
    rows, diffs = [], []
    for label in labels:
        row: dict[str, object] = {"label": label}
        means = {}
        have = {n: losses[n][label] for n in names if label in losses[n].index.get_level_values(0)}
        # The seeds every column ran: a column with more seeds would otherwise average over other draws
        common = set.intersection(*(set(v.index) for v in have.values())) if have else set()
        row["seeds"] = ", ".join(map(str, sorted(common)))
        for name in names:
            values = have[name][sorted(common)] if name in have else pd.Series(dtype=float)
            ci = mean_ci(values)
            row.update({f"{name}_mean": ci.mean, f"{name}_ci_low": ci.low, f"{name}_ci_high": ci.high,
                        f"{name}_seeds": ci.n})  # fmt: skip
            if ci.n:
                means[name] = ci.mean
        row["best"] = min(means, key=means.__getitem__) if means else ""
        rows.append(row)
        for name in names:
            if name == reference or name not in means or reference not in means:
                continue
            a, b = losses[name][label], losses[reference][label]
            seeds = sorted(set(a.index) & set(b.index))
            t = paired_t([float(a[s] - b[s]) for s in seeds])
            diffs.append({"label": label, "column": name, "reference": reference, "n_pairs": len(seeds),
                          "diff_mean": t.estimate, "ci_low": t.low, "ci_high": t.high, "p": t.p})  # fmt: skip
    differences = pd.DataFrame(diffs)
    if not differences.empty:
        differences["p_holm"] = holm(list(differences["p"]))
        differences["resolved"] = differences["p_holm"] < 0.05
    return pd.DataFrame(rows), differences


def page(columns: list[Column], reference: str, table: pd.DataFrame, differences: pd.DataFrame) -> str:
    names = [c.name for c in columns]
    sources = "; ".join(f"{c.name}: {', '.join(map(str, c.folders))}" for c in columns)
    lines = ["# Sweep", "", f"Columns (ledgers): {sources}. Reference: {reference}.", "",
             "Final test CE (nats/token), mean [95 % t-interval] (seeds):", "",
             "| arm | " + " | ".join(names) + " | best |", "|---|" + "---|" * (len(names) + 1)]  # fmt: skip
    for _, row in table.iterrows():
        cells = [_interval(row, name) for name in names]
        lines.append(f"| {row['label']} | " + " | ".join(cells) + f" | {row['best']} |")
    lines += ["", f"Each column minus {reference}, paired by seed; Holm over all {len(differences)} comparisons:", "",
              "| arm | column | pairs | diff | p | Holm p | resolved |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for _, d in differences.iterrows():
        diff = signed(d["diff_mean"], d["ci_low"], d["ci_high"])  # one pair: no interval, no test
        lines.append(
            f"| {d['label']} | {d['column']} | {d['n_pairs']} | {diff} | {p_value(d['p'])} | "
            f"{p_value(d['p_holm'])} | {'yes' if d['resolved'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def _interval(row: pd.Series, name: str) -> str:
    if not row[f"{name}_seeds"]:
        return "not run"
    low, high = row[f"{name}_ci_low"], row[f"{name}_ci_high"]
    spread = f" [{low:.4f}, {high:.4f}]" if not math.isnan(low) else ""
    return f"{row[f'{name}_mean']:.4f}{spread} ({row[f'{name}_seeds']})"
