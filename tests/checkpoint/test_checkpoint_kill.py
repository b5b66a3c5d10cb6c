"""A run killed with SIGKILL at any moment leaves every checkpoint file it wrote loadable: Lightning writes
to a temporary file and renames it into place (fsspec transaction), so a half-written file never carries a
checkpoint's name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_SEQ_LEN

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sigkill_mid_run_leaves_loadable_checkpoints(
    tiny_shards: Path, mlflow_uri: str, tmp_path: Path
) -> None:
    ckpt_dir = tmp_path / "ck"
    cmd = [
        sys.executable, str(ROOT / "main.py"), "fit",
        "--config", str(ROOT / "conf/base.yaml"), "--config", str(ROOT / "conf/model/nano.yaml"),
        "--config", str(ROOT / "conf/attention/mha.yaml"),
        "--model.arch.seq_len", str(TINY_SEQ_LEN), "--data.data_dir", str(tiny_shards),
        "--data.batch_size", "4", "--data.num_workers", "0", "--trainer.max_steps", "100000",
        "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
        "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps", "1",
        "--trainer.callbacks.save_top_k", "-1", "--trainer.callbacks.dirpath", str(ckpt_dir),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(list(ckpt_dir.glob("*.ckpt"))) < 4:  # writing a checkpoint every step by now
            assert proc.poll() is None, "training exited early"
            assert time.monotonic() < deadline, "no checkpoints within 120 s"
            time.sleep(0.05)
        time.sleep(0.137)  # land somewhere inside a step or a write
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    files = sorted(ckpt_dir.glob("*.ckpt"))
    assert len(files) >= 4
    steps = []
    for path in files:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        steps.append(checkpoint["global_step"])
        assert set(checkpoint["state_dict"]) and checkpoint["compute"]["tokens_seen"] > 0
    assert sorted(steps) == list(range(1, len(files) + 1))
