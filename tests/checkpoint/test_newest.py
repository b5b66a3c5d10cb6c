"""A run's folder with an unreadable last.ckpt (a kill mid-save, a torn copy) still resumes: from its newest
readable checkpoint, or from step 0, with the bad file set aside and nothing deleted; `--ckpt_path auto` finds
a run's folder by its name (lightning_modules/checkpoint/newest.py)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from lightning_modules.checkpoint.newest import (
    Newest,
    RunCheckpoint,
    newest_of_run,
    newest_readable,
    run_folder,
    run_folders,
)


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


def test_a_run_is_found_by_its_name_in_its_newest_folder_with_a_readable_checkpoint(tmp_path: Path) -> None:
    """`fit --ckpt_path auto`: the folders of one run name, newest checkpoint first; another name (a prefix of
    this one's included) and a folder with nothing readable are passed over."""
    older = tmp_path / "nano-mha-seed7-20261201-100000-aaaaaa"
    newer = tmp_path / "nano-mha-seed7-20261202-100000-bbbbbb"
    other = tmp_path / "nano-mha-seed70-20261203-100000-cccccc"
    broken = tmp_path / "nano-mha-seed7-20261204-100000-dddddd"
    for folder in (older, newer, other, broken):
        folder.mkdir()
    save(older / "last.ckpt", 9, 1_000)
    chosen = save(newer / "last.ckpt", 4, 2_000)
    save(other / "last.ckpt", 5, 3_000)
    truncate(save(broken / "last.ckpt", 6, 4_000))
    found = newest_of_run(tmp_path, "nano-mha-seed7")
    assert (found.folder, found.newest.path, found.newest.step) == (newer, chosen, 4)
    (line,) = found.newest.skipped
    assert str(broken / "last.ckpt") in line and "kept as last.ckpt.unreadable-" in line
    assert newest_of_run(tmp_path, "nano-gqa-g2-seed7") == RunCheckpoint(None, Newest(None, 0, ()))
    assert run_folders(tmp_path, "nano-mha-seed7") == [newer, older, broken]  # nothing left to resume: last


def test_a_rank_other_than_zero_leaves_an_unreadable_checkpoint_in_place(tmp_path: Path) -> None:
    good = save(tmp_path / "epoch=0-step=3.ckpt", 3, 1_000)
    last = truncate(save(tmp_path / "last.ckpt", 5, 2_000))
    newest = newest_readable(tmp_path, set_aside=False)
    assert newest.path == good and newest.skipped[0].endswith("(left in place)") and last.exists()


def test_a_new_run_folder_matches_the_run_name_pattern(tmp_path: Path) -> None:
    folder = run_folder(tmp_path, "nano-mha-seed7")
    folder.mkdir()
    save(folder / "last.ckpt", 1, 1_000)
    assert run_folders(tmp_path, "nano-mha-seed7") == [folder]
