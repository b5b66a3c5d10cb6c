"""The results ledger: results/<protocol>/runs.csv and evaluations.csv, committed to git.

A study of many CPU-hours outlives the machine it starts on, and the tracking store (MLflow, SQLite) is local
to a machine and never committed. What survives is the ledger the report writes (report.py): one row per done
run in runs.csv, with its identity (protocol.py: protocol, size, arm, seed, budget, data manifest), and every
evaluation of those runs in evaluations.csv. So
- the runner (runner.py) treats a run whose identity the ledger records as done, also when the store lacks
  it: a fresh machine with an empty store trains only what no machine finished;
- the report merges the ledger's runs with the store's: results/ keeps every run done anywhere, and says how
  many of the protocol's runs that is.
Only identities of the protocol as it is now count: a run of an edited protocol (another budget, other data)
has another identity and stays out, as it does in the store; one edited in what the identity leaves out (a
rate, a validation setting) is refused by the runner from each run's recorded `settings` (settings.py).

This module reads the identities with the csv module only: the runner needs them before any run starts and
should not pay for pandas; report.py reads the tables themselves.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from lightning_modules.core.errors import ConfigError
from lightning_modules.study.protocol import ROOT

RUNS = "runs.csv"
EVALUATIONS = "evaluations.csv"
IDENTITY = "identity"
SETTINGS = "settings"  # the run's recorded settings (settings.py)
DONE_COLUMN = "test_loss"  # a run with a finite final test loss finished: fit, last validation and test


def default_folder(protocol_name: str) -> Path:
    return ROOT / "results" / protocol_name


def done_identities(folder: Path) -> set[str]:
    """The identities of the runs the ledger in `folder` records as done (none when it has no runs.csv)."""
    return set(done_settings(folder))


def done_settings(folder: Path) -> dict[str, str]:
    """identity -> recorded settings (settings.py; "" where the run predates the record) of every run the
    ledger in `folder` records as done."""
    path = folder / RUNS
    if not path.is_file():
        return {}
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
            header = rows[0].keys() if rows else set()
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(
            f"ledger {path}: cannot be read ({e}); restore it from git (git checkout -- {path})"
        ) from e
    if rows and (IDENTITY not in header or DONE_COLUMN not in header):
        raise ConfigError(
            f"ledger {path}: no `{IDENTITY}` or `{DONE_COLUMN}` column, so its runs cannot be matched to the "
            "protocol; rewrite it with `python -m lightning_modules study <protocol> --report` from a store that "
            "holds its runs, or pass --ledger to another folder"
        )
    return {row[IDENTITY]: row.get(SETTINGS) or "" for row in rows if row[IDENTITY] and finished(row)}


def finished(row: dict[str, str]) -> bool:
    """Whether a ledger row is a finished run: a finite final test loss (DONE_COLUMN)."""
    return _finite(row.get(DONE_COLUMN))


def _finite(text: str | None) -> bool:
    try:
        return math.isfinite(float(text or "nan"))
    except ValueError:
        return False
