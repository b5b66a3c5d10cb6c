"""How long the next run should take (lightning_modules/study/timing.py), and the runner's --hours that plans
with it (lightning_modules/study/runner.py): a run expected to end after the window is not started."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from lightning_modules.commands.run_study import main as study_main
from lightning_modules.core import precision
from lightning_modules.study import protocol as protocols
from lightning_modules.study import timing
from lightning_modules.study.runner import machine
from tests.study.helpers import micro_protocol

EPYC = timing.Machine("AMD EPYC, 2 cores", "cpu-native-bf16", 1)
EPYC_AVX2 = timing.Machine("AMD EPYC, 2 cores", "cpu-no-native-bf16", 1)
COLUMNS = ["identity", "run_id", "seed", "budget", "data", "test_loss", "size", "label", "duration_s", "machine",
           "hardware", "command", "resumed_from_step", "last_attempt_s"]  # fmt: skip


def write_ledger(folder: Path, rows: list[dict[str, str]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "runs.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows([{c: r.get(c, "") for c in COLUMNS} for r in rows])
    return folder


def row(label: str, seconds: float, hardware: str = "cpu-native-bf16", **extra: str) -> dict[str, str]:
    return {"identity": f"{label}-{seconds}", "test_loss": "3.7", "size": "5m", "label": label,
            "duration_s": str(seconds), "machine": "AMD EPYC, 2 cores", "hardware": hardware,
            "command": "python -m lightning_modules study conf/study/main.yaml --workers 1 --max-runs 2",
            **extra}  # fmt: skip


def test_the_mean_of_the_same_arm_on_a_like_machine_else_the_longest_of_the_size_else_nothing() -> None:
    done = [
        timing.Done("5m", "mha", EPYC, 2800.0),
        timing.Done("5m", "mha", EPYC, 3000.0),
        timing.Done("5m", "mqa", EPYC, 2500.0),
        timing.Done("5m", "lrkv-r16", EPYC_AVX2, 4300.0),  # the other CPU kind: not like EPYC
        timing.Done("nano", "gqa-g2", EPYC, 9000.0),  # another size
    ]
    mha = timing.expect(done, "5m", "mha", EPYC)
    assert mha is not None and mha.seconds == 2900.0 and "mean of 2 mha runs" in mha.basis
    gqa = timing.expect(done, "5m", "gqa-g2", EPYC)  # no gqa-g2 at 5m here: the longest 5m run
    assert gqa is not None and gqa.seconds == 3000.0 and "longest of 3 5m run(s)" in gqa.basis
    avx2 = timing.expect(done, "5m", "mha", EPYC_AVX2)
    assert avx2 is not None and avx2.seconds == 4300.0
    xeon = timing.Machine("Intel Xeon, 2 cores", "cpu-native-bf16", 1)
    assert timing.expect(done, "5m", "mha", xeon) is None
    assert timing.expect(done, "5m", "mha", timing.Machine("AMD EPYC, 2 cores", "cpu-native-bf16", 2)) is None


def test_the_ledger_gives_finished_whole_runs_with_their_machine_and_workers(tmp_path: Path) -> None:
    folder = write_ledger(tmp_path, [
        row("mha", 2805.3),
        row("mqa", 2400.0, command="python -m lightning_modules study conf/study/main.yaml --workers=2"),
        row("gqa-g2", 1000.0, resumed_from_step="1200", last_attempt_s="400.0"),  # its time holds the pause and
        # its last attempt trained part of it: left out
        row("mqa", 5000.0, resumed_from_step="0", last_attempt_s="2600.0"),  # restarted: its last attempt, whole
        row("mqa", 1000.0, resumed_from_step="0"),  # restarted before the attempt's start was recorded: left out
        row("mla-c224", 3100.0, test_loss=""),  # not finished
        row("lrkv-r16", 3000.0, hardware=""),  # no CPU kind recorded
        row("mha", float("nan")),
    ])  # fmt: skip
    done = timing.from_ledger(folder)
    assert done == [
        timing.Done("5m", "mha", EPYC, 2805.3),
        timing.Done("5m", "mqa", timing.Machine("AMD EPYC, 2 cores", "cpu-native-bf16", 2), 2400.0),
        timing.Done("5m", "mqa", EPYC, 2600.0),
    ]
    assert timing.from_ledger(tmp_path / "none") == []
    assert timing.workers_of("python -m lightning_modules study p.yaml") == 1


def test_hours_leaves_a_run_that_would_end_after_the_window_for_later(
    tiny_shards: Path, tmp_path: Path, mlflow_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = micro_protocol(tmp_path, tiny_shards, arms="[{kind: mha}]")  # seeds 1 and 2
    first = protocols.load(path).runs[0]
    # Seed 1 took 10 hours on this very machine, so seed 2 does not fit in 1 hour and nothing trains.
    here = {"machine": machine(), "hardware": precision.detect().capability, "size": "nano"}
    fields = first.identity_fields()  # the row the report would write for seed 1 (the runner checks it)
    proof = {"identity": first.identity, "run_id": "0" * 32, "seed": fields["seed"], "budget": fields["budget"],
             "data": fields["data"]}  # fmt: skip
    ledger = write_ledger(tmp_path / "ledger", [{**row("mha", 36000.0), **proof, **here}])
    assert study_main([str(path), "--settle-s", "0", "--ledger", str(ledger), "--hours", "1"]) == 0
    out = capsys.readouterr().out
    assert "--hours 1: nano mha seed 2 would take about 10 h 00 min (the mean of 1 mha run here)" in out, out
    assert "and the 0 after it are left for a later run" in out and "[start" not in out, out
    assert "study micro: 1/2 runs done" in out, out


@pytest.mark.parametrize("hours", ["0", "-1", "nan", "inf", "soon"])
def test_hours_must_be_a_positive_number(hours: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        study_main(["conf/study/main.yaml", "--hours", hours])
    assert stop.value.code == 2
    assert f"--hours: {hours}: must be a number of hours > 0" in capsys.readouterr().err
