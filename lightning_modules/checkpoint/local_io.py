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
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from lightning_modules.core.files import write_atomic


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        save_atomic(checkpoint, Path(path))


def save_atomic(checkpoint: dict[str, Any], path: Path) -> None:
    """torch.save through core/files.py's write_atomic (beside `path`, synced, renamed). The temporary files
    of earlier saves of `path` that were killed are removed first: one process writes a checkpoint name (rank
    0, or the only one), so such a file is no one's."""
    for stale in path.parent.glob(f".{path.name}.*.partial"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    write_atomic(path, lambda file: torch.save(checkpoint, file))
