"""A sharded checkpoint folder is written under a temporary name and takes its own name only when whole
(lightning_modules/distributed/strategy.py, FSDP2Strategy.save_checkpoint; core/files.py, replace_dir): a save
killed part-way leaves the previous checkpoint whole under the name, and the next save clears what the killed
one left. The shard writer is replaced by one that writes a known set of files and can die part-way, so the
test needs no process group; tests/distributed/test_fsdp_training.py resumes from real sharded folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch.strategies import ModelParallelStrategy

from lightning_modules.core import files
from lightning_modules.distributed.strategy import FSDP2Strategy

SHARDS = ("__0_0.distcp", "__1_0.distcp", ".metadata", "meta.pt")


class Killed(BaseException):
    """A kill part-way through a save (not an Exception: nothing may catch it on the way out)."""


def fake_writer(die_after: int | None) -> Any:
    """ModelParallelStrategy.save_checkpoint's stand-in: the folder's files, each holding the step, in order."""

    def write(
        self: ModelParallelStrategy, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None
    ) -> None:
        folder = Path(filepath)
        folder.mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(SHARDS):
            if die_after is not None and i == die_after:
                raise Killed
            (folder / name).write_text(str(checkpoint["step"]))

    return write


@pytest.fixture
def strategy(monkeypatch: pytest.MonkeyPatch) -> FSDP2Strategy:
    made = FSDP2Strategy()
    monkeypatch.setattr(made, "broadcast", lambda obj, src=0: obj)
    monkeypatch.setattr(made, "barrier", lambda name=None: None)
    return made


def save(
    strategy: FSDP2Strategy,
    monkeypatch: pytest.MonkeyPatch,
    path: Path,
    step: int,
    die_after: int | None = None,
) -> None:
    monkeypatch.setattr(ModelParallelStrategy, "save_checkpoint", fake_writer(die_after))
    strategy.save_checkpoint({"step": step}, path)


def steps_in(folder: Path) -> set[str]:
    assert sorted(p.name for p in folder.iterdir()) == sorted(SHARDS)
    return {(folder / name).read_text() for name in SHARDS}


@pytest.mark.parametrize("swap", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_a_save_killed_part_way_leaves_the_previous_checkpoint_whole(
    strategy: FSDP2Strategy, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, swap: bool
) -> None:
    if not swap:
        monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    last = tmp_path / "last.ckpt"
    save(strategy, monkeypatch, last, 1)
    assert steps_in(last) == {"1"} and files.stale_partials(last) == []
    with pytest.raises(Killed):
        save(strategy, monkeypatch, last, 2, die_after=2)
    assert steps_in(last) == {"1"}  # not a mix of step 1 and step 2 shards
    assert len(files.stale_partials(last)) == 1
    save(strategy, monkeypatch, last, 3)
    assert steps_in(last) == {"3"}
    assert files.stale_partials(last) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_a_one_file_checkpoint_under_the_name_is_replaced_by_the_folder(
    strategy: FSDP2Strategy, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    last = tmp_path / "last.ckpt"
    last.write_text("a one-file checkpoint of an earlier run")
    save(strategy, monkeypatch, last, 4)
    assert steps_in(last) == {"4"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
