"""Writing a file so that a crash leaves the old one or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
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
