"""Writing a file so that a crash leaves the old one or the new one, never half of one."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str, durable: bool = False) -> None:
    """Write one file through a temporary sibling and a rename, so a crash leaves the old file or the new
    one, never half of one. `durable`: on disk before this returns (the file, then its folder's entry), for a
    file whose presence others act on (a task's summary, followed by its completion marker)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Make the renames into `folder` durable (a file's own fsync does not cover its name)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
