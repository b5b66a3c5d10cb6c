"""The one file scripts/gpu_check.py's results come back in: every file of its output folder in a gzip'd tar.

A lent GPU machine returns only a few files from its output folder (docs/gpu.md), and the check writes three
per step, so what must come back is one archive. It is rewritten whole after every step and as rows stream
in, through a temporary file renamed over the last one, so a run killed at any moment leaves a complete
archive of everything finished until then.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path

NAME = "gpu-check.tar.gz"
TOP = "gpu-check"  # the folder every member is under: tar xzf gpu-check.tar.gz makes gpu-check/
PART = ".part"  # the temporary file's suffix, never archived


def write(folder: Path, archive: Path) -> list[str]:
    """Every file under `folder` (but the archive and its temporary file), as TOP/<path relative to folder>,
    into `archive`, replacing it at once; the members' names. A file is read whole before it is added: one
    that a running step is still writing goes in as it stood at that moment."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    part = archive.with_name(archive.name + PART)
    names = []
    with tarfile.open(part, "w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            if not path.is_file() or path.name.endswith(PART) or path.resolve() == archive.resolve():
                continue
            try:
                data = path.read_bytes()
            except OSError:  # gone between the listing and the read (a lock file, a step's scratch)
                continue
            info = tarfile.TarInfo(f"{TOP}/{path.relative_to(folder).as_posix()}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))
            names.append(info.name)
    os.replace(part, archive)
    return names
