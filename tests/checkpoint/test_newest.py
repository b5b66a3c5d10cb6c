"""A run's folder with an unreadable last.ckpt (a kill mid-save, a torn copy) still resumes: from its newest
readable checkpoint, or from step 0, with the bad file set aside and nothing deleted
(lightning_modules/checkpoint/newest.py)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from lightning_modules.checkpoint.newest import newest_readable


def save(path: Path, step: int, mtime: float) -> Path:
    torch.save({"pytorch-lightning_version": "2.6", "global_step": step, "hyper_parameters": {}}, path)
    os.utime(path, (mtime, mtime))
    return path


def truncate(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def test_a_readable_last_checkpoint_is_the_one(tmp_path: Path) -> None:
    save(tmp_path / "epoch=0-step=3.ckpt", 3, 1_000)
    last = save(tmp_path / "last.ckpt", 5, 2_000)
    newest = newest_readable(tmp_path)
    assert (newest.path, newest.step, newest.skipped) == (last, 5, ())


def test_a_truncated_last_checkpoint_is_set_aside_for_the_newest_readable_one(tmp_path: Path) -> None:
    save(tmp_path / "epoch=0-step=2.ckpt", 2, 1_000)
    three = save(tmp_path / "epoch=0-step=3.ckpt", 3, 2_000)
    last = truncate(save(tmp_path / "last.ckpt", 5, 3_000))
    torn = last.read_bytes()
    newest = newest_readable(tmp_path)
    assert (newest.path, newest.step) == (three, 3)
    (line,) = newest.skipped
    assert "last.ckpt" in line and "kept as last.ckpt.unreadable-" in line
    (aside,) = tmp_path.glob("last.ckpt.unreadable-*")
    assert aside.read_bytes() == torn and not last.exists()  # moved, not deleted


def test_with_nothing_readable_the_run_starts_at_step_zero(tmp_path: Path) -> None:
    truncate(save(tmp_path / "last.ckpt", 5, 1_000))
    (tmp_path / "epoch=0-step=1.ckpt").write_bytes(b"not a checkpoint")
    newest = newest_readable(tmp_path)
    assert (newest.path, newest.step, len(newest.skipped)) == (None, 0, 2)
    assert sorted(p.name.split(".unreadable-")[0] for p in tmp_path.iterdir()) == [
        "epoch=0-step=1.ckpt",
        "last.ckpt",
    ]
    assert newest_readable(tmp_path / "empty") == newest_readable(
        tmp_path
    )  # an empty or missing folder: step 0
