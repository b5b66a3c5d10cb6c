"""The newest checkpoint of a run's folder that can be resumed from: a kill mid-save, a full disk or a torn copy
can leave `last.ckpt` unreadable, and a run must not then be stuck for good (the study runner, and any resume
that is given a run's folder, asks here).

The candidates are `last.ckpt`, then every other `*.ckpt` file or sharded folder, newest first; each is read as
a resume would read it (lightning_modules/checkpoint/reader.py: weights_only, the keys a training checkpoint
has). An unreadable one is kept where it is, renamed `<name>.unreadable-<UTC time>` so that the next save of the
same name cannot be mistaken for it and nothing the run wrote is deleted.

`fit --ckpt_path auto` (lightning_modules/training/cli.py) asks `newest_of_run`: a run's checkpoints live in
`<root>/<run name>-<UTC time>-<random suffix>` (`run_folder`), so the folders of one run name under one root are
found by name alone, whatever the job or process that wrote them; the newest folder with a readable checkpoint
wins. Under several ranks only rank 0 sets files aside (`set_aside`): the others skip an unreadable file in
place, so no two processes rename the same file.
"""

from __future__ import annotations

import glob
import re
import secrets
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


def newest_readable(folder: Path, set_aside: bool = True) -> Newest:
    skipped = []
    for path in candidates(folder):
        try:
            ckpt = read_checkpoint(path, option="")
        except UserError as e:
            if not set_aside:
                skipped.append(f"{e} (left in place)")
                continue
            aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
            path.rename(aside)
            skipped.append(f"{e} (kept as {aside.name})")
            continue
        return Newest(path, int(ckpt.get("global_step", 0)), tuple(skipped))
    return Newest(None, 0, tuple(skipped))


def run_folder(root: Path, name: str) -> Path:
    """A new run's checkpoint folder: the start time for order, a random suffix so that two runs started in the
    same second never share one."""
    return root / f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class RunCheckpoint:
    folder: Path | None  # the folder to resume in and go on writing to (None: a fresh run)
    newest: Newest


def run_folders(root: Path, name: str) -> list[Path]:
    """The checkpoint folders of a run name under root, newest first (by their newest checkpoint's time)."""
    pattern = re.compile(rf"{re.escape(name)}-\d{{8}}-\d{{6}}-[0-9a-f]{{6}}")
    found = [p for p in root.glob(f"{glob.escape(name)}-*") if p.is_dir() and pattern.fullmatch(p.name)]

    def written(folder: Path) -> float:
        return max((c.stat().st_mtime for c in folder.glob("*.ckpt")), default=0.0)

    return sorted(found, key=lambda p: (written(p), p.name), reverse=True)


def newest_of_run(root: Path, name: str, set_aside: bool = True) -> RunCheckpoint:
    """The newest readable checkpoint of any folder of `name` under root, newest folder first; the lines of
    `newest.skipped` name every unreadable checkpoint passed over on the way."""
    skipped: list[str] = []
    for folder in run_folders(root, name):
        newest = newest_readable(folder, set_aside)
        skipped += newest.skipped
        if newest.path is not None:
            return RunCheckpoint(folder, Newest(newest.path, newest.step, tuple(skipped)))
    return RunCheckpoint(None, Newest(None, 0, tuple(skipped)))
