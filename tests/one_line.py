"""The one-line check shared by the entry-error tables (tests/core/test_entry_errors.py and the tables beside
each concern's tests): a bad input given to a real entry point ends in exactly one ': error: ' line that holds
the expected words, a non-zero exit, no traceback and no unsafe load."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (name, argv after the interpreter, extra env, substrings the error line must hold)
Case = tuple[str, list[str], dict[str, str], list[str]]


def problems(argv: list[str], env: dict[str, str], expected: list[str], cwd: Path) -> list[str]:
    """What is wrong with how this command failed (empty: it failed as promised)."""
    run = subprocess.run(
        [sys.executable, *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in run.stderr.splitlines() if ": error: " in line]
    found = []
    if run.returncode == 0:
        found.append("exit 0")
    if "Traceback" in run.stderr or len(errors) != 1:
        found.append(f"not one error line: {run.stderr[-1500:]}")
    elif not all(part in errors[0] for part in expected):
        found.append(f"{errors[0]!r} lacks {expected}")
    if "weights_only=False" in run.stderr or "unsafe-code-ran" in run.stdout:
        found.append("unsafe load advised or done")
    return found


def assert_each_ends_in_one_line(cases: Sequence[Case], cwd: Path) -> None:
    # The rows are independent processes that spend most of their time importing (one thread each):
    # three at a time on two cores take about half as long as one after another.
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda case: problems(case[1], case[2], case[3], cwd), cases))
    failures = [f"{case[0]}: {'; '.join(found)}" for case, found in zip(cases, results, strict=True) if found]
    assert not failures, "\n".join(failures)
