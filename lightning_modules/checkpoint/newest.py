"""The newest checkpoint of a run's folder that can be resumed from: a kill mid-save, a full disk or a torn copy
can leave `last.ckpt` unreadable, and a run must not then be stuck for good (the study runner, and any resume
that is given a run's folder, asks here).

The candidates are `last.ckpt`, then every other `*.ckpt` file or sharded folder, newest first; each is read as
a resume would read it (lightning_modules/checkpoint/reader.py: weights_only, the keys a training checkpoint
has). An unreadable one is kept where it is, renamed `<name>.unreadable-<UTC time>` so that the next save of the
same name cannot be mistaken for it and nothing the run wrote is deleted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from lightning_modules.checkpoint.reader import read_checkpoint
from lightning_modules.core.errors import UserError

LAST = "last.ckpt"


@dataclass(frozen=True)
class Newest:
    path: Path | None  # None: nothing in the folder can be resumed from (the run starts at step 0)
    step: int  # the checkpoint's global step (0 without one)
    skipped: tuple[str, ...]  # one line per unreadable checkpoint, and where it was moved


def candidates(folder: Path) -> list[Path]:
    last = folder / LAST
    others = [p for p in folder.glob("*.ckpt") if p.name != LAST]
    others.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return ([last] if last.exists() else []) + others


def newest_readable(folder: Path) -> Newest:
    skipped = []
    for path in candidates(folder):
        try:
            ckpt = read_checkpoint(path, option="")
        except UserError as e:
            aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
            path.rename(aside)
            skipped.append(f"{e} (kept as {aside.name})")
            continue
        return Newest(path, int(ckpt.get("global_step", 0)), tuple(skipped))
    return Newest(None, 0, tuple(skipped))
