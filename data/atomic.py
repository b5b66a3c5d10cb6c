"""Build a dataset folder atomically: write into a temporary folder beside it, verify, then swap it in.

    with atomic_dataset(out, force=False) as tmp:   # refuses a foreign folder, checks permissions first
        ...write shards, tokenizer and manifest.json into tmp, verify them...
    # on a clean exit tmp replaces out; on any exception out is untouched and tmp is removed

A dataset folder is owned by its manifest: the files a previous build may delete are exactly those its
manifest.json lists (the shards, the tokenizer, the manifest itself). Any other file in `out` is foreign: the
build is refused unless `force`, and with `force` foreign files are kept in place (moved over to the new
folder), never deleted. The swap is two renames in the same parent (old -> `.name.old-*`, new -> name), so
a crash leaves either the old dataset or the new one under `out`, plus a hidden folder to clean up.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from data.data_errors import PrepareError
from data.manifest import MANIFEST_NAME

TMP_PREFIX = "."  # hidden siblings: `.name.build-*` (being built), `.name.old-*` (swapped out)


def owned_files(out: Path) -> set[str]:
    """Names in `out` that its manifest lists (empty set: no readable manifest). Only plain names count:
    a manifest never makes this module delete anything outside the folder."""
    path = out / MANIFEST_NAME
    if not path.is_file():
        return set()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        names = {str(raw["tokenizer"])}
        names.update(str(s["path"]) for split in raw["splits"].values() for s in split["shards"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return set()  # an unreadable manifest owns nothing; its folder is treated as foreign
    return {n for n in names | {MANIFEST_NAME} if n and Path(n).name == n and n not in (".", "..")}


def foreign_files(out: Path) -> list[str]:
    """Entries of `out` its manifest does not list, sorted."""
    if not out.is_dir():
        return []
    owned = owned_files(out)
    return sorted(p.name for p in out.iterdir() if p.name not in owned)


def check_destination(out: Path, force: bool) -> None:
    """Everything that would stop the swap, checked before any work: `out` a folder (or absent), holding
    only a previous dataset's files unless `force`, and its parent (and `out` itself) writable."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PrepareError(f"{out}: --out exists and is not a folder; choose another --out")
    foreign = foreign_files(out)
    if foreign and not force:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise PrepareError(
            f"{out}: --out holds files that are not part of a dataset this tool wrote ({shown}); choose an "
            "empty or new folder, or pass --force to build there anyway (those files are kept)"
        )
    _check_writable(out.parent, "the parent folder of --out")
    if out.exists():
        _check_writable(out, "--out")


def _check_writable(folder: Path, what: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}write-probe-", dir=folder)
        os.rmdir(probe)
    except OSError as exc:  # a real attempt: os.access says yes to root on a read-only mount
        raise PrepareError(
            f"{folder}: {what} is not writable ({exc.strerror or exc}); fix its permissions or choose "
            "another --out"
        ) from exc


def dataset_folder(out: Path) -> Path:
    """Where the dataset of --out goes: a link's target, so the swap keeps the link pointing at it."""
    return out.resolve() if out.is_symlink() else out


@contextmanager
def atomic_dataset(out: Path, force: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside `out`; on a clean exit it becomes `out` (see module doc)."""
    out = dataset_folder(Path(out))
    check_destination(out, force)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{out.name}.build-", dir=out.parent))
    try:
        with _terminate_as_exit():  # the build, not the swap: two renames are not cut short halfway
            yield tmp
        swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM (`kill`, a scheduler's time limit) as SystemExit for the body, so the cleanup above runs: by
    default it ends the process on the spot and leaves the hidden build folder behind."""
    if threading.current_thread() is not threading.main_thread():  # handlers belong to the main thread
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def swap_in(new: Path, out: Path) -> None:
    """Make the finished folder `new` the dataset at `out`; the old dataset's own files are deleted, its
    foreign files (allowed by --force) move into the new folder."""
    if not out.exists():
        new.rename(out)
        return
    owned, foreign = owned_files(out), foreign_files(out)
    clash = sorted(name for name in foreign if (new / name).exists())
    if clash:  # keeping the user's file and writing ours are impossible at once
        raise PrepareError(
            f"{out}: foreign files {', '.join(clash)} have the names of the new dataset's files; move them "
            "away and rerun (the previous dataset is unchanged)"
        )
    old = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{out.name}.old-", dir=out.parent))
    os.rmdir(old)  # a fresh unique name for the rename below
    out.rename(old)
    try:
        new.rename(out)
    except BaseException:
        old.rename(out)  # put the previous dataset back
        raise
    for name in foreign:
        (old / name).rename(out / name)
    for name in owned:
        path = old / name
        if path.is_file() or path.is_symlink():
            path.unlink()
    with contextlib.suppress(OSError):  # something appeared in it meanwhile: leave it, it is not ours
        old.rmdir()
