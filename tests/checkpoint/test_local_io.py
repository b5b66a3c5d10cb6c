"""One-file checkpoints are atomic on any filesystem layout (lightning_modules/checkpoint/local_io.py): the
temporary file is made beside the checkpoint, never in TMPDIR, so a failure or a SIGKILL during a save leaves
the old checkpoint whole under its name, with TMPDIR on another filesystem too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lightning_modules.checkpoint import local_io
from lightning_modules.checkpoint.local_io import AtomicCheckpointIO

ROOT = Path(__file__).resolve().parents[2]


def test_a_save_that_fails_midway_leaves_the_old_checkpoint_and_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "tmpdir"
    elsewhere.mkdir()
    monkeypatch.setenv("TMPDIR", str(elsewhere))
    folder = tmp_path / "run"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"global_step": 1}, folder / "last.ckpt")
    before = (folder / "last.ckpt").read_bytes()

    def half_then_fail(obj: object, file: object) -> None:
        file.write(b"PK\x03\x04 half of a checkpoint")  # type: ignore[attr-defined]
        raise OSError("disk full")

    monkeypatch.setattr(local_io.torch, "save", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"global_step": 2}, folder / "last.ckpt")
    assert (folder / "last.ckpt").read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"] and list(elsewhere.iterdir()) == []


SAVER = """
import sys, torch
from pathlib import Path
from lightning_modules.checkpoint.local_io import AtomicCheckpointIO
path, step = Path(sys.argv[1]), 0
big = torch.arange(30_000_000, dtype=torch.float32)  # 120 MB: a save takes long enough to be killed inside
while True:
    step += 1
    AtomicCheckpointIO().save_checkpoint({"global_step": step, "w": big + step}, path)
    print(step, flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_saves_with_tmpdir_on_another_filesystem_never_tears_the_checkpoint(
    tmp_path: Path,
) -> None:
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's folder")
    tmpdir = other / f"lrkv-test-{os.getpid()}"
    tmpdir.mkdir(exist_ok=True)
    path = tmp_path / "last.ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmpdir), "OMP_NUM_THREADS": "1"}
    try:
        for kill_after in (0.0, 0.15, 0.4):
            child = subprocess.Popen(
                [sys.executable, "-c", SAVER, str(path)], env=env, stdout=subprocess.PIPE
            )
            assert child.stdout is not None
            child.stdout.readline()  # one whole save first
            time.sleep(kill_after)  # then a kill somewhere inside a later save
            child.send_signal(signal.SIGKILL)
            child.wait()
            ckpt = torch.load(path, weights_only=True)  # whole: the old or the new, never half
            assert torch.equal(ckpt["w"][:3], torch.arange(3, dtype=torch.float32) + ckpt["global_step"])
        assert list(tmpdir.iterdir()) == []  # nothing went through TMPDIR
    finally:
        for leftover in tmpdir.iterdir():
            leftover.unlink()
        tmpdir.rmdir()


def test_a_killed_saves_temporary_file_is_removed_by_the_next_save(tmp_path: Path) -> None:
    left = tmp_path / ".last.ckpt.x1y2.partial"  # what a SIGKILL in the middle of a save leaves
    left.parent.mkdir(exist_ok=True)
    left.write_bytes(b"half")
    other = tmp_path / ".epoch=0-step=3.ckpt.x1y2.partial"  # another name's: not this save's to remove
    other.write_bytes(b"half")
    AtomicCheckpointIO().save_checkpoint({"global_step": 1}, tmp_path / "last.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name, "last.ckpt"]
