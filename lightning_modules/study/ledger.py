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
import json
import math
import re
from pathlib import Path

from lightning_modules.core.errors import ConfigError
from lightning_modules.study.protocol import ROOT

RUNS = "runs.csv"
EVALUATIONS = "evaluations.csv"
IDENTITY = "identity"
SETTINGS = "settings"  # the run's recorded settings (settings.py)
DONE_COLUMN = "test_loss"  # a run with a finite final test loss finished: fit, last validation and test
# What every done row holds (the report writes them all); a row lacking one proves no run.
REQUIRED = (IDENTITY, "run_id", "size", "label", "seed", "budget", "data", DONE_COLUMN)
IDENTITY_LENGTH = 16  # hex digits of protocol.py's identity
HEX = re.compile(r"[0-9a-f]+")
# A protocol's identity field -> the ledger column holding it (the protocol's name is the ledger's folder).
LEDGER_COLUMN = {"size": "size", "arm": "label", "seed": "seed", "budget": "budget", "data": "data"}


def default_folder(protocol_name: str) -> Path:
    return ROOT / "results" / protocol_name


def done_identities(folder: Path) -> set[str]:
    """The identities of the runs the ledger in `folder` records as done (none when it has no runs.csv)."""
    return set(done_rows(folder))


def done_settings(folder: Path) -> dict[str, str]:
    """identity -> recorded settings (settings.py; "" where the run predates the record) of every run the
    ledger in `folder` records as done."""
    return settings_of(done_rows(folder))


def settings_of(rows: dict[str, dict[str, str]]) -> dict[str, str]:
    """identity -> recorded settings of done rows (done_rows)."""
    return {identity: row.get(SETTINGS) or "" for identity, row in rows.items()}


def done_rows(folder: Path) -> dict[str, dict[str, str]]:
    """identity -> row of every run the ledger in `folder` records as done, each row checked first (`check_row`):
    a ledger is trusted only as far as it proves a run finished."""
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
    done = {}
    for number, row in enumerate(rows, start=2):  # line 1 is the header
        if row.get(IDENTITY) and finished(row):
            check_row(path, number, row)
            done[row[IDENTITY]] = row
    return done


def check_row(path: Path, number: int, row: dict[str, str]) -> None:
    """ConfigError naming the file and line of a done row that does not hold what the report writes: every
    identity field, a run id, a test loss that is a cross-entropy (finite, >= 0), settings as a JSON object."""
    where = f"ledger {path}, line {number}"
    fix = f"restore it from git (git checkout -- {path}) or rewrite it with --report"
    missing = [c for c in REQUIRED if not (row.get(c) or "").strip()]
    if missing:
        raise ConfigError(
            f"{where}: no {', '.join(missing)} for run {row.get(IDENTITY)!r}, so it proves nothing; {fix}"
        )
    if not HEX.fullmatch(row[IDENTITY]) or len(row[IDENTITY]) != IDENTITY_LENGTH:
        raise ConfigError(f"{where}: identity {row[IDENTITY]!r} is not one a protocol gives; {fix}")
    if not row["seed"].isdigit():
        raise ConfigError(f"{where}: seed {row['seed']!r} is not a whole number; {fix}")
    if not float(row[DONE_COLUMN]) >= 0:
        raise ConfigError(f"{where}: test loss {row[DONE_COLUMN]} is negative, not a cross-entropy; {fix}")
    recorded = (row.get(SETTINGS) or "").strip()
    if recorded:
        try:
            settings = json.loads(recorded)
        except (ValueError, RecursionError):
            settings = None
        if not isinstance(settings, dict) or not all(isinstance(v, dict) for v in settings.values()):
            raise ConfigError(
                f"{where}: settings are not the JSON object of groups the runner records; {fix}"
            )


def check_identities(
    path: Path, rows: dict[str, dict[str, str]], expected: dict[str, dict[str, str]]
) -> None:
    """ConfigError when a done row's identity is one of the protocol's but its fields are not that run's
    (identity -> the protocol's identity fields, protocol.py): a row copied or edited by hand."""
    for identity, fields in expected.items():
        row = rows.get(identity)
        if row is None:
            continue
        wrong = [f"{k} {row.get(LEDGER_COLUMN.get(k, k))!r}, not {v!r}" for k, v in fields.items()
                 if k in LEDGER_COLUMN and row.get(LEDGER_COLUMN[k]) != v]  # fmt: skip
        if wrong:
            raise ConfigError(
                f"ledger {path}: the row of identity {identity} records {'; '.join(wrong)}: it is not the run the "
                f"protocol gives that identity; restore the ledger from git (git checkout -- {path})"
            )


def finished(row: dict[str, str]) -> bool:
    """Whether a ledger row is a finished run: a finite final test loss (DONE_COLUMN)."""
    return _finite(row.get(DONE_COLUMN))


def _finite(text: str | None) -> bool:
    try:
        return math.isfinite(float(text or "nan"))
    except ValueError:
        return False
