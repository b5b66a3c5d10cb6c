"""Writing a file, or a folder of files, so that a crash leaves the old one or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomic(path: Path, write: Callable[[BinaryIO], object], durable: bool = True) -> None:
    """Call `write` on a temporary file beside `path`, then rename it over `path`: the name only ever holds a
    whole file, on any filesystem layout (a temporary file elsewhere, e.g. in TMPDIR, would be copied, not
    renamed). `durable`: on disk before this returns (the file, then its folder's entry). On any failure the
    temporary file is removed and `path` is as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str, durable: bool = False) -> None:
    """write_atomic for text (UTF-8). `durable` for a file whose presence others act on (a task's summary,
    followed by its completion marker)."""
    write_atomic(path, lambda handle: handle.write(text.encode("utf-8")), durable)


def fsync_dir(folder: Path) -> None:
    """Make the renames into `folder` durable (a file's own fsync does not cover its name)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def partial_dir(path: Path) -> Path:
    """A fresh, unused name beside `path` for a folder written before it takes `path`'s name (replace_dir)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))


def stale_partials(path: Path) -> list[Path]:
    """Temporary files and folders of earlier writes of `path` that were killed before their rename."""
    return sorted(path.parent.glob(f".{path.name}.*.partial"))


def fsync_tree(folder: Path) -> None:
    """Every file under `folder`, then every folder's entries, on disk."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(root))


_RENAME_EXCHANGE = 2  # linux/fs.h: swap two existing names in one step


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names a and b atomically (Linux renameat2 with RENAME_EXCHANGE); False where the system or the
    filesystem cannot."""
    import ctypes  # late: only for a folder replaced on Linux

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    done = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    return done == 0


def replace_dir(written: Path, path: Path) -> None:
    """Give the complete folder `written` the name `path`, removing what `path` held (a folder or a file).

    Where Linux can swap the two names in one step (renameat2, RENAME_EXCHANGE: ext4, xfs, tmpfs, btrfs) the
    name `path` always holds a whole checkpoint, the old or the new. Elsewhere the old is renamed aside and the
    new into place: a kill between the two renames leaves no `path` at all, never a mixed one, and the old and
    new folders are both whole under their temporary names."""
    if path.exists() and _exchange(written, path):
        old = written  # after the swap, the old checkpoint is under the temporary name
    else:
        old = path.with_name(f".{path.name}.{os.getpid()}.old.partial") if path.exists() else None
        if old is not None:
            os.replace(path, old)
        os.replace(written, path)
    fsync_dir(path.parent)
    if old is not None:
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
