"""Helpers that several test modules of this folder share (fixtures stay in conftest.py)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import TINY_SEQ_LEN

ROOT = Path(__file__).resolve().parents[2]

NANO = [
    "--config", str(ROOT / "conf/base.yaml"), "--config", str(ROOT / "conf/model/nano.yaml"),
    "--config", str(ROOT / "conf/attention/lrkv.yaml"), "--model.arch.seq_len", str(TINY_SEQ_LEN),
    "--trainer.precision", "32-true", "--trainer.max_steps", "2", "--data.batch_size", "4",
    "--trainer.enable_progress_bar", "false",
]  # fmt: skip
