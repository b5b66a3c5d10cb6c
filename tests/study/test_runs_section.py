"""results/<protocol>/README.md's Runs section (lightning_modules/reporting/runs_section.py): order and formatting."""

from __future__ import annotations

import math

import pandas as pd

from lightning_modules.reporting.runs_section import runs_section


def _row(**kw: object) -> dict[str, object]:
    row: dict[str, object] = {"size": "5m", "label": "mha", "seed": 1, "test_loss": 3.6978562, "tokens": 9996288.0,
                              "steps": 4880, "duration_s": 2805.3, "machine": "AMD EPYC, 2 cores",
                              "hardware": "cpu-native-bf16", "git_commit": "d119b8c2749c8c8bc977ef6f8b94a958249939c5",
                              "start_utc": "2026-12-02 16:03:54", "resumed_from_step": ""}  # fmt: skip
    row.update(kw)
    return row


def _body(lines: list[str]) -> list[list[str]]:
    text = "\n".join(lines).splitlines()
    rows = [line for line in text if line.startswith("| ") and not line.startswith("| started")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in rows]


def test_runs_are_listed_in_start_order_with_unknown_starts_last() -> None:
    per_run = pd.DataFrame([
        _row(label="lrkv-r16", start_utc="2026-12-03 16:14:11", git_commit="f3f0ae2e55f9-dirty"),
        _row(label="gqa-g2", start_utc=None, duration_s=math.nan, machine=math.nan, resumed_from_step=200.0),
        _row(),
    ])  # fmt: skip
    body = _body(runs_section(per_run))
    assert [r[2] for r in body] == ["mha", "lrkv-r16", "gqa-g2"]
    first, second, last = body
    assert first == ["2026-12-02 16:03:54", "5m", "mha", "1", "3.6979", "9,996,288", "4,880", "46.8",
                     "AMD EPYC, 2 cores", "cpu-native-bf16", "d119b8c", "", ""]  # fmt: skip
    assert second[10] == "f3f0ae2-dirty"  # a run from a modified tree stays marked as one
    assert last[0] == "unknown" and last[7] == "" and last[8] == "" and last[11] == "200" and last[12] == ""


def test_a_ledger_without_store_columns_still_lists_its_runs() -> None:
    per_run = pd.DataFrame([_row()]).drop(columns=["start_utc", "duration_s", "machine", "hardware",
                                                   "resumed_from_step"])  # fmt: skip
    (row,) = _body(runs_section(per_run))
    assert row[0] == "unknown" and row[2] == "mha" and row[7:10] == ["", "", ""] and row[10] == "d119b8c"


def test_no_runs_no_section() -> None:
    assert runs_section(pd.DataFrame(columns=list(_row()))) == []


def test_a_resumed_run_gives_its_last_attempt_and_a_whole_run_does_not() -> None:
    per_run = pd.DataFrame([
        _row(duration_s=5124.0, resumed_from_step="0", last_attempt_s=3408.0),  # restarted: 85.4 min from the claim
        _row(label="gqa-g2", start_utc="2026-12-02 17:00:00", resumed_from_step="1200", last_attempt_s=1500.0),
        _row(label="mqa", start_utc="2026-12-02 18:00:00", last_attempt_s=2805.3),  # never stopped: no repeat
        _row(label="mla-c224", start_utc="2026-12-02 19:00:00", resumed_from_step="600", last_attempt_s=math.nan),
    ])  # fmt: skip
    body = _body(runs_section(per_run))
    assert [(r[2], r[7], r[11], r[12]) for r in body] == [
        ("mha", "85.4", "0", "56.8"),
        ("gqa-g2", "46.8", "1,200", "25.0"),
        ("mqa", "46.8", "", ""),
        ("mla-c224", "46.8", "600", ""),  # resumed before the resume time was recorded: unknown, not made up
    ]
