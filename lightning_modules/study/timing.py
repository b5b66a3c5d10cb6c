"""How long a protocol's next run should take here, from the runs already done: what `--hours` plans with
(runner.py), so a machine lent for a few hours starts only the runs that end before it goes, and none is cut
off half-trained (only finished runs reach the committed ledger, ledger.py).

A run is expected to take the mean duration of the done runs of the same size and arm on a machine like this
one: the same CPU model, the same CPU kind (lightning_modules/core/precision.py: one model name comes with and
without native bf16, and the main study's fp32 runs take about 1.5x longer on the kind without) and the same
number of workers (they share the cores). Failing that, the longest such run of any arm of that size (arms of
one FLOP budget differ in wall time by a few tens of per cent at most); failing that, nothing is known. A run
resumed after an interruption is left out: its wall time includes the pause, and its last attempt trained only
part of it. A run restarted from step 0 (runner.py) counts with its last attempt's time (last_attempt_s,
report.py), which trained all of it; one restarted before the runner recorded that is left out.

Done runs come from the committed ledger (results/<protocol>/runs.csv: machine, hardware, command, duration_s,
resumed_from_step, last_attempt_s); the runner adds the runs it finishes itself as it goes. A run that resumes from a
checkpoint is timed as a whole one, so its estimate errs long, on the side of not cutting a run off.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

from lightning_modules.study.ledger import RUNS, finished

_WORKERS = re.compile(r"--workers[ =](\d+)")


@dataclass(frozen=True)
class Machine:
    """What a run's wall time depends on besides the run: CPU model and cores, CPU kind, workers at once."""

    name: str  # runner.machine(): "AMD EPYC, 2 cores"
    kind: str  # precision.Hardware.capability: "cpu-native-bf16"
    workers: int


@dataclass(frozen=True)
class Done:
    size: str
    label: str
    machine: Machine
    seconds: float


@dataclass(frozen=True)
class Estimate:
    seconds: float
    basis: str  # what it is the mean or maximum of, for the runner's line


def workers_of(command: str) -> int:
    """The --workers of a recorded study command (1 where it gives none, the runner's default)."""
    found = _WORKERS.search(command or "")
    return int(found.group(1)) if found else 1


def from_ledger(folder: Path) -> list[Done]:
    """The ledger's done runs with a usable wall time: finished, not resumed, machine and kind recorded."""
    path = folder / RUNS
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    done = []
    for row in rows:
        if not finished(row):
            continue
        seconds = _whole_run_seconds(row)
        if not (math.isfinite(seconds) and seconds > 0):
            continue
        if not row.get("machine") or not row.get("hardware"):
            continue
        machine = Machine(row["machine"], row["hardware"], workers_of(row.get("command", "")))
        done.append(Done(row.get("size", ""), row.get("label", ""), machine, seconds))
    return done


def expect(done: list[Done], size: str, label: str, machine: Machine) -> Estimate | None:
    """The expected wall time of a run of `size` and arm `label` on `machine` (module docstring), or None."""
    alike = [d for d in done if d.machine == machine and d.size == size]
    same_arm = [d.seconds for d in alike if d.label == label]
    if same_arm:
        runs = "run" if len(same_arm) == 1 else "runs"
        return Estimate(sum(same_arm) / len(same_arm), f"the mean of {len(same_arm)} {label} {runs} here")
    if alike:
        return Estimate(max(d.seconds for d in alike), f"the longest of {len(alike)} {size} run(s) here")
    return None


def _whole_run_seconds(row: dict[str, str]) -> float:
    """The wall time of an attempt that trained the whole run (module docstring), NaN where there is none."""
    resumed = (row.get("resumed_from_step") or "").strip()
    if not resumed:
        return _number(row.get("duration_s"))
    if _number(resumed) == 0:
        return _number(row.get("last_attempt_s"))
    return math.nan


def _number(text: str | None) -> float:
    try:
        return float(text or "nan")
    except ValueError:
        return math.nan
