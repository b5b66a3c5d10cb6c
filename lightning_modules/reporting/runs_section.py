"""results/<protocol>/README.md's "Runs" section: one line per run, in the order the runs started.

A study that spans days and machines is only as trustworthy as its provenance: which CPU (model and kind) ran
each run, at which commit, how long it took, and whether it resumed from a checkpoint. runs.csv has all of it
(report.per_run_table, lightning_modules/reporting/report.py); this section makes it readable on the page, so the
front README can point here instead of retelling every run.
"""

from __future__ import annotations

import math

import pandas as pd

from lightning_modules.analysis.formatting import md_table

SHORT_COMMIT = 7  # git's default abbreviation; a "-dirty" suffix is kept


def runs_section(per_run: pd.DataFrame) -> list[str]:
    """The section's lines; none for a table without runs."""
    if per_run.empty:
        return []
    order = per_run.assign(_start=per_run.get("start_utc", pd.Series("", index=per_run.index)).fillna(""))
    # Runs without a recorded start (older ledgers) go last, in the report's order.
    order = order.assign(_unknown=order["_start"] == "").sort_values(["_unknown", "_start"], kind="stable")
    view = pd.DataFrame(
        {
            "started (UTC)": order["_start"].map(lambda s: s or "unknown"),
            "size": order["size"],
            "arm": order["label"],
            "seed": order["seed"],
            "test CE": order["test_loss"].map(lambda v: f"{v:.4f}"),
            "tokens": order["tokens"].map(lambda v: f"{v:,.0f}"),
            "steps": order["steps"].map(_count),
            "wall min": order.get("duration_s", pd.Series(math.nan, index=order.index)).map(_minutes),
            "machine": _column(order, "machine"),
            "CPU kind": _column(order, "hardware"),
            "commit": order["git_commit"].map(_commit),
            "resumed from step": _column(order, "resumed_from_step").map(_step),
            "min from resume": _resumed_minutes(order),
        }
    )
    return [
        "## Runs (one row per run, in the order they started)",
        "",
        "Wall minutes are the run's start to end on its machine, not its cost alone: other jobs may have shared "
        "the machine. A run resumed from a checkpoint names the step it resumed from; 0 is a run restarted from "
        "the beginning (no checkpoint where it was taken over), whose wall time still counts from its first claim; "
        "the minutes from its resume to its end (the attempt that finished it) follow, where the run recorded when "
        "that attempt began.",
        "",
        md_table(view),
        "",
    ]


def _column(table: pd.DataFrame, name: str) -> pd.Series:
    """A text column, blank where the table lacks it or a run did not record it."""
    if name not in table:
        return pd.Series("", index=table.index)
    return table[name].map(lambda v: "" if pd.isna(v) else str(v))


def _resumed_minutes(table: pd.DataFrame) -> pd.Series:
    """The last attempt's minutes for a resumed or restarted run (report.py's last_attempt_s), blank for a run
    never stopped (its wall minutes say it all) and for one resumed before the runner recorded the resume time."""
    resumed = _column(table, "resumed_from_step") != ""
    seconds = table.get("last_attempt_s", pd.Series(math.nan, index=table.index))
    return seconds.where(resumed, math.nan).map(_minutes)


def _count(value: float) -> str:
    return "" if pd.isna(value) else f"{value:,.0f}"


def _minutes(seconds: float) -> str:
    return "" if pd.isna(seconds) else f"{seconds / 60:.1f}"


def _commit(commit: object) -> str:
    head, dirty, _ = ("" if pd.isna(commit) else str(commit)).partition("-dirty")
    return head[:SHORT_COMMIT] + ("-dirty" if dirty else "")


def _step(text: str) -> str:
    """A resume step as a whole number (the ledger's CSV may have turned "200" into 200.0)."""
    try:
        return f"{int(float(text)):,}" if text else ""
    except ValueError:
        return text
