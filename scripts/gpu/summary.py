"""OUT/summary.md of scripts/gpu_check.py: one table of the steps' statuses, then a table per step of its result."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gpu.steps import BACKEND_ENV, backend_note


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value).replace("|", "/").replace("\n", "; ")


def grid(head: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]


def key_values(result: dict[str, Any]) -> list[str]:
    return grid(["what", "value"], [[k, v] for k, v in result.items()])


def train_rows(result: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """benchmarks/gpu.py's rows; a key it does not (yet) print shows as '-'."""
    backend = record.get("env", {}).get(BACKEND_ENV, "-")
    head = ["attention", "kernel", "ran", "compile", "backend", "tokens/s", "MFU", "MFU causal/2", "peak GiB",
            "plan GiB", "peak/plan", "recompiles", "status"]  # fmt: skip
    rows = []
    for r in result.get("rows", []):
        peak, plan = r.get("peak_mem_gib"), r.get("plan_peak_gib")
        ratio = round(peak / plan, 2) if peak is not None and plan else None
        mfu = [f"{r[k]:.1%}" if r.get(k) is not None else None for k in ("mfu", "mfu_causal_half")]
        status = r.get("status", "-") + (f": {r['error']}" if r.get("error") else "")
        rows.append([r.get("attention"), r.get("kernel"), r.get("kernel_ran"), "on" if r.get("compile") else "off",
                     backend, r.get("tokens_per_s"), *mfu, peak, plan, ratio, r.get("recompiles"), status])  # fmt: skip
    lines = grid(head, rows)
    env = result.get("environment", {})
    if env:
        lines += ["", f"{env.get('device', '-')}, torch {env.get('torch', '-')}: `{env.get('command', '')}`"]
    lines += [f"- {t}" for t in result.get("targets", [])]
    note = backend_note()
    if note and backend != "-":
        lines.append(f"- NOTE {note}")
    return lines


def decode_rows(result: Any, record: dict[str, Any]) -> list[str]:
    """benchmarks/decode.py's rows (a list, or {"rows": [...]})."""
    rows = result.get("rows", []) if isinstance(result, dict) else result
    head = ["attention", "arm", "context", "batch", "tokens/s", "graph tokens/s", "FLOP/byte", "peak MiB",
            "cache bytes/token", "dtype", "status"]  # fmt: skip
    lines = []
    for r in rows:
        peak = round(r["peak_memory_bytes"] / 2**20, 1) if r.get("peak_memory_bytes") is not None else None
        status = r.get("status", "-") + (f": {r['error']}" if r.get("error") else "")
        lines.append([r.get("label", r.get("attention")), r.get("arm_label", r.get("arm")), r.get("context"),
                      r.get("batch"), r.get("tokens_per_s"), r.get("graph_tokens_per_s"), r.get("flop_per_byte"),
                      peak, r.get("cache_bytes_per_token"), r.get("dtype"), status])  # fmt: skip
    return grid(head, lines)


def fit_rows(result: dict[str, Any], record: dict[str, Any]) -> list[str]:
    metrics = result.get("metrics", {})
    flat = {k: v for k, v in result.items() if k != "metrics"}
    lines = key_values(flat)
    if metrics:
        rows = [[k, m.get("value"), m.get("step")] for k, m in metrics.items()]
        lines += ["", *grid(["MLflow metric", "last value", "step"], rows)]
    return lines


RENDER: dict[str, Callable[[Any, dict[str, Any]], list[str]]] = {
    "env": lambda result, _: key_values(result),
    "ceiling": lambda result, _: key_values(result),
    "train": train_rows,
    "decode": decode_rows,
    "fit": fit_rows,
}


def render(records: list[dict[str, Any]], header: str) -> str:
    lines = [f"# GPU check: {header}", ""]
    rows = [
        [i, r["step"], r["status"], r.get("seconds"), r.get("reason", "")] for i, r in enumerate(records, 1)
    ]
    lines += grid(["#", "step", "status", "seconds", "why"], rows)
    for i, record in enumerate(records, 1):
        lines += ["", f"## {i}. {record['step']}: {record['title']} ({record['status']})", ""]
        if record.get("reason"):
            lines += [f"{record['status']}: {record['reason']}", ""]
        lines.append(
            f"`{record.get('command', '')}`" + (f" with {record['env']}" if record.get("env") else "")
        )
        result = record.get("result")
        if result is None:
            continue
        lines.append("")
        try:
            lines += RENDER[record["kind"]](result, record)
        except (AttributeError, KeyError, TypeError) as exc:  # a changed JSON shape: show it raw
            lines += [
                f"(table failed: {exc!r}; the raw JSON)",
                "```",
                json.dumps(result, indent=1)[:4000],
                "```",
            ]
    return "\n".join(lines) + "\n"
