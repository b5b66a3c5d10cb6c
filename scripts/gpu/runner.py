"""Run the steps of scripts/gpu/steps.py one subprocess each, within one time budget.

Each step NN-name leaves in the output folder NN-name.stdout, NN-name.stderr (written as they come, so a
killed step keeps what it printed) and NN-name.json: its status (ok / failed / timeout / skipped), the reason
on one line, its seconds, its command and what its JSON stdout held ("result"). A step's stdout is one JSON
document; a step may itself report {"status": "skipped", "reason": ...}.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpu.steps import ROOT, Step


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


def run_step(step: Step, prefix: str, out: Path, timeout_s: float, python: str = sys.executable) -> dict:
    """Run one step; its record (also written to out/prefix.json)."""
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
        # A session of its own: on a timeout the whole group goes (compile workers, decode's probes).
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=step_env(step, timeout_s), stdout=so, stderr=se, start_new_session=True
        )
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
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
    (out / f"{prefix}.json").write_text(json.dumps(record, indent=1))
    return record


def run_all(steps: list[Step], out: Path, budget_s: float, python: str = sys.executable) -> list[dict]:
    """Every step in order, each given the smaller of its timeout and the budget left; a step is skipped
    when less than its min_s is left. Progress on stderr, one line a step."""
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    records = []
    for i, step in enumerate(steps, 1):
        prefix = f"{i:02d}-{step.name}"
        left = budget_s - (time.perf_counter() - start)
        if left < step.min_s:
            record = {"step": step.name, "title": step.title, "kind": step.kind, "status": "skipped",
                      "reason": f"budget spent: {max(left, 0):.0f} s left, the step needs {step.min_s:.0f} s",
                      "seconds": 0.0, "command": " ".join(step.argv(python)), "env": step.env}  # fmt: skip
            (out / f"{prefix}.json").write_text(json.dumps(record, indent=1))
        else:
            record = run_step(step, prefix, out, min(step.timeout_s, left), python)
        records.append(record)
        why = f" ({record['reason']})" if record["reason"] else ""
        print(
            f"[{i}/{len(steps)}] {step.name}: {record['status']}, {record['seconds']} s{why}", file=sys.stderr
        )
    return records
