"""Helpers that several test modules of this folder share (fixtures stay in conftest.py)."""

from __future__ import annotations

import csv
from pathlib import Path

from tests.conftest import TINY_SEQ_LEN

# 45 steps of nano mha (49 of lrkv-r4) at 4 x 32 tokens and the tiny shards' 512-token vocabulary: time to kill one
MICRO_FLOPS = 3.0e10


def micro_protocol(folder: Path, shards: Path, arms: str = "[{kind: mha}, {kind: lrkv, rank: 4}]",
                   budget: float = MICRO_FLOPS, extra: str = "") -> Path:  # fmt: skip
    data = folder / "data.yaml"
    data.write_text(f"data:\n  data_dir: {shards}\n  batch_size: 4\n  num_workers: 0\n")
    path = folder / "micro.yaml"
    path.write_text(
        "description: two arms, two seeds, a few steps at nano on tiny shards\n"
        f"experiment: micro\nsizes: [nano]\narms: {arms}\nseeds: [1, 2]\n"
        f"budget: {{flops: {budget!r}}}\ndata: {data}\ncheckpoint_every: 1\n"
        f"fit:\n  model.arch.seq_len: {TINY_SEQ_LEN}\n  trainer.precision: 32-true\n"
        "  trainer.limit_val_batches: 2\n  trainer.val_check_interval: 5\n  trainer.limit_test_batches: 2\n"
        + extra
    )
    return path


def started_runs(out: str) -> list[str]:
    return [ln.split("] ", 1)[1].split(" (")[0] for ln in out.splitlines() if ln.startswith("[start")]


def ledger_row(identity: str, **fields: object) -> dict[str, object]:
    """A done row of a results ledger as the report writes it (lightning_modules/study/ledger.py); `fields`
    replace its values, None leaves the column out."""
    row: dict[str, object] = {"identity": identity, "run_id": "0" * 32, "size": "nano", "label": "mha", "seed": 1,
                              "budget": "flops=3e+10", "data": "6bd091106c6eabed", "test_loss": 5.0, "settings": ""}  # fmt: skip
    row.update(fields)
    return {k: v for k, v in row.items() if v is not None}


def write_ledger(folder: Path, rows: list[dict[str, object]]) -> Path:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with (folder / "runs.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return folder / "runs.csv"
