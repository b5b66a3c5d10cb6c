"""Run the steps of scripts/gpu/steps.py one subprocess each, within one time budget.

Each step NN-name leaves in the output folder NN-name.stdout, NN-name.stderr (written as they come, so a
killed step keeps what it printed) and NN-name.json: its status (ok / failed / timeout / skipped), the reason
on one line, its seconds, its command and what its JSON stdout held ("result"). A step's stdout ends with one
JSON document; a step may itself report {"status": "skipped", "reason": ...}. A step that measures rows
(benchmarks/gpu.py) also prints each row as a ROW_MARK line as it finishes: the runner prints each on
stderr as it comes, hands the rows so far to `on_change` (scripts/gpu_check.py rewrites its summary and
archive), and keeps them as the result of a step that then times out or fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu.steps import ROOT, ROW_MARK, Step

POLL_S = 1.0  # how often a running step's stdout is read for new rows
REFRESH_S = 30.0  # how often on_change runs during a step that prints no row (its logs grow all the same)
OnChange = Callable[[list[dict[str, Any]]], None]


def last_line(path: Path) -> str:
    """The last non-blank line of a file (a traceback's last line names the exception), at most 300 chars."""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def parse_stdout(text: str) -> Any:
    """The step's JSON: the whole stdout, else its last line (a script that printed something first)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        lines = text.strip().splitlines()
        return json.loads(lines[-1]) if lines else None


def row_line(row: dict[str, Any]) -> str:
    """A streamed row in one line of stderr: what a run killed now still printed."""
    mode = "compiled" if row.get("compile") else "eager"
    figures = [row.get("status", "-")]
    if row.get("tokens_per_s") is not None:
        figures.append(f"{row['tokens_per_s']:,} tokens/s")
    if row.get("mfu") is not None:
        figures.append(f"MFU {row['mfu']:.1%}")
    if row.get("error"):
        figures.append(str(row["error"])[:120])
    return (
        f"    {row.get('size', '')} {row.get('attention')} {row.get('kernel')} {mode}: {', '.join(figures)}"
    )


class RowReader:
    """The ROW_MARK lines a step has written to its stdout file so far, read from where the last read ended
    (complete lines only)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.rows = path, 0, []

    def new_rows(self) -> list[dict[str, Any]]:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            text = f.read()
        complete = text[: text.rfind(b"\n") + 1]
        self.offset += len(complete)
        new = []
        for line in complete.decode(errors="replace").splitlines():
            if line.startswith(ROW_MARK):
                try:
                    new.append(json.loads(line[len(ROW_MARK) :]))
                except json.JSONDecodeError:
                    continue  # a row cut by a kill: the rest still counts
        self.rows += new
        return new


def judge_rows(result: Any) -> dict[str, str]:
    """A benchmark exits 0 with each row's own failure in the row: a step none of whose rows is ok failed
    (the first row's error says why); one with some rows not ok is ok, the reason counting them."""
    rows = result.get("rows") if isinstance(result, dict) else result
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and "status" in r for r in rows):
        return {"status": "ok", "reason": ""}
    bad = [r for r in rows if r["status"] != "ok"]
    if not bad:
        return {"status": "ok", "reason": ""}
    first = bad[0].get("error") or bad[0]["status"]
    if len(bad) == len(rows):
        return {"status": "failed", "reason": f"no row ok; the first: {first}"[:300]}
    return {"status": "ok", "reason": f"{len(bad)} of {len(rows)} rows not ok; the first: {first}"[:300]}


def step_env(step: Step, timeout_s: float) -> dict[str, str]:
    # The project is not installed on the GPU machine: every step finds it from the repository root. A step
    # that runs commands of its own (scripts/gpu/fit.py) sizes them by GPU_CHECK_STEP_TIMEOUT_S.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    extra = {"PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "GPU_CHECK_STEP_TIMEOUT_S": f"{timeout_s:.0f}"}
    return {**os.environ, **extra, **step.env}


def run_step(
    step: Step,
    prefix: str,
    out: Path,
    timeout_s: float,
    python: str = sys.executable,
    on_rows: Callable[[list[dict[str, Any]]], None] = lambda rows: None,
) -> dict:
    """Run one step; its record (also written to out/prefix.json). While it runs, each streamed row is
    printed on stderr and on_rows gets the rows so far (also every REFRESH_S without a new row)."""
    argv = step.argv(python)
    record: dict[str, Any] = {
        "step": step.name,
        "title": step.title,
        "kind": step.kind,
        "command": " ".join(argv),
        "env": step.env,
        "timeout_s": round(timeout_s, 1),
    }
    stdout, stderr = out / f"{prefix}.stdout", out / f"{prefix}.stderr"
    start = time.perf_counter()
    with stdout.open("w") as so, stderr.open("w") as se:
        reader, refreshed = RowReader(stdout), start
        # A session of its own: on a timeout the whole group goes (compile workers, decode's probes).
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=step_env(step, timeout_s), stdout=so, stderr=se, start_new_session=True
        )
        rc: int | None = None
        while True:
            try:
                rc = proc.wait(timeout=max(min(POLL_S, start + timeout_s - time.perf_counter()), 0.01))
                break
            except subprocess.TimeoutExpired:
                if time.perf_counter() - start >= timeout_s:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
            new = reader.new_rows()
            for row in new:
                print(row_line(row), file=sys.stderr, flush=True)
            if new or time.perf_counter() - refreshed > REFRESH_S:
                on_rows(reader.rows)
                refreshed = time.perf_counter()
    for row in reader.new_rows():  # what it printed after the last look
        print(row_line(row), file=sys.stderr, flush=True)
    record["seconds"] = round(time.perf_counter() - start, 1)
    record["returncode"] = rc
    if rc is None:
        record.update(
            status="timeout", reason=f"killed after {timeout_s:.0f} s; last line: {last_line(stderr)}"
        )
    elif rc != 0:
        record.update(status="failed", reason=f"exit {rc}: {last_line(stderr) or last_line(stdout)}")
    else:
        try:
            record["result"] = parse_stdout(stdout.read_text())
        except json.JSONDecodeError:
            record["result"] = None
        result = record["result"]
        if isinstance(result, dict) and result.get("status") == "skipped":
            record.update(status="skipped", reason=result.get("reason", ""))
        elif result is None:
            record.update(
                status="failed", reason=f"exit 0 but no JSON on stdout; stderr: {last_line(stderr)}"
            )
        else:
            record.update(judge_rows(result))
    if record.get("result") is None and reader.rows:  # timed out or failed: the rows it finished stay
        record["result"] = {"rows": reader.rows, "partial": True}
    (out / f"{prefix}.json").write_text(json.dumps(record, indent=1))
    return record


def run_all(
    steps: list[Step],
    out: Path,
    budget_s: float,
    python: str = sys.executable,
    on_change: OnChange = lambda records: None,
) -> list[dict]:
    """Every step in order, each given the smaller of its timeout and the budget left; a step is skipped
    when less than its min_s is left. Progress on stderr, one line a step and one a streamed row; on_change
    gets the records so far after every step, and while a step runs the records with that step's
    provisional one (status "running", the rows so far as its result)."""
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    records: list[dict] = []
    for i, step in enumerate(steps, 1):
        prefix = f"{i:02d}-{step.name}"
        left = budget_s - (time.perf_counter() - start)
        if left < step.min_s:
            record = {"step": step.name, "title": step.title, "kind": step.kind, "status": "skipped",
                      "reason": f"budget spent: {max(left, 0):.0f} s left, the step needs {step.min_s:.0f} s",
                      "seconds": 0.0, "command": " ".join(step.argv(python)), "env": step.env}  # fmt: skip
            (out / f"{prefix}.json").write_text(json.dumps(record, indent=1))
        else:
            print(f"[{i}/{len(steps)}] {step.name}: running", file=sys.stderr, flush=True)
            began = time.perf_counter()

            def running(rows: list[dict[str, Any]], step: Step = step, began: float = began) -> None:
                provisional = {"step": step.name, "title": step.title, "kind": step.kind, "status": "running",
                               "reason": f"{len(rows)} rows so far", "seconds": round(time.perf_counter() - began, 1),
                               "command": " ".join(step.argv(python)), "env": step.env, "result": {"rows": rows}}  # fmt: skip
                on_change([*records, provisional])

            record = run_step(step, prefix, out, min(step.timeout_s, left), python, running)
        records.append(record)
        why = f" ({record['reason']})" if record["reason"] else ""
        print(
            f"[{i}/{len(steps)}] {step.name}: {record['status']}, {record['seconds']} s{why}",
            file=sys.stderr,
            flush=True,
        )
        on_change(records)
    return records
