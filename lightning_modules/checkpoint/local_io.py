"""Writing a one-file checkpoint so that a kill at any moment leaves the old file or the new one under its name.

Lightning's own write goes through a temporary file of fsspec's, made in TMPDIR, then moved onto the
checkpoint's name. A move is a rename only within one filesystem: with TMPDIR on local disk and checkpoints on a
shared filesystem (the usual cluster layout) it is a copy, and a kill during the copy leaves `last.ckpt`
truncated under its final name. Here the temporary file is made in the checkpoint's own folder, synced, then
renamed over the name (and the folder synced), so the name only ever points at a whole file. Paths that are not
local (an fsspec URL) keep Lightning's write. The CLI installs this for every strategy that writes one file
(lightning_modules/training/cli.py).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from lightning_modules.core.files import fsync_dir


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        save_atomic(checkpoint, Path(path))


def save_atomic(checkpoint: dict[str, Any], path: Path) -> None:
    """torch.save into a temporary file beside `path`, fsync, rename over `path`, fsync the folder. The
    temporary files of earlier saves of `path` that were killed are removed first: one process writes a
    checkpoint name (rank 0, or the only one), so such a file is no one's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.partial"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
