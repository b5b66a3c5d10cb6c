"""A one-file checkpoint from a sharded one (the command: python -m lightning_modules consolidate <dir.ckpt> [out.ckpt]).

FSDP runs (conf/strategy/fsdp.yaml, hybrid-fsdp.yaml) save each checkpoint as a directory of per-rank shards
plus Lightning's meta.pt (docs/architecture.md, "Scale"); they resume from it on any world size that
divides the data slices (docs/cluster.md, "Elastic resume"); this reads shards written by any world size. Everything that
reads a checkpoint file on one device (test / validate without FSDP, lightning_modules.commands.generate, the
analysis) takes the consolidated file: full weights, hyper-parameters, compute counters, the MLflow run id.
Optimiser states are left out: they are keyed by parameter name for FSDP and would not restore into a
single-device optimiser; a training run resumes from the directory. The folder is read by the safe reader
(lightning_modules/checkpoint/reader.py), checked whole first, so a damaged or crafted folder ends in one line;
Lightning's own `lightning.pytorch.utilities.consolidate_checkpoint` reads FSDPStrategy's layout, not
ModelParallelStrategy's, and unpickles the folder's index unrestricted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lightning_modules.checkpoint.reader import read_checkpoint
from lightning_modules.core.errors import UserError
from lightning_modules.core.files import write_atomic

SUFFIX = ".consolidated.ckpt"


class ConsolidateError(UserError):
    """A folder that cannot be consolidated or an output that cannot be written; the message names it."""


def consolidate(folder: str | Path) -> dict[str, Any]:
    """The checkpoint dict of a sharded checkpoint directory, gathered in CPU memory, without optimiser
    states; a ConsolidateError naming the folder when it is not a complete sharded checkpoint."""
    folder = Path(folder)
    if folder.is_file():
        raise ConsolidateError(
            f"{folder}: a file, not a sharded checkpoint folder; a one-file checkpoint needs no consolidation "
            "(give the folder an FSDP fit wrote, e.g. checkpoints/<run>/last.ckpt under conf/strategy/fsdp.yaml)"
        )
    if not folder.is_dir():
        raise ConsolidateError(
            f"{folder}: no such folder; give a checkpoint folder an FSDP fit wrote (checkpoints/<run>/last.ckpt)"
        )
    try:
        return read_checkpoint(folder, "", required=(), weights=True)
    except ConsolidateError:
        raise
    except UserError as exc:
        raise ConsolidateError(str(exc)) from exc


def default_output(folder: Path) -> Path:
    return folder.with_name(folder.name.removesuffix(".ckpt") + SUFFIX)


def write_consolidated(folder: str | Path, output: str | Path | None = None) -> Path:
    """Consolidate `folder` into `output` (default <folder>.consolidated.ckpt) and return its path. The file
    appears whole or not at all: written beside it under a temporary name, then renamed; an existing file of
    that name is replaced only by a complete one."""
    folder = Path(folder)
    out = Path(output) if output is not None else default_output(folder)
    if out.is_dir():
        raise ConsolidateError(f"{out}: a folder; give a file name for the consolidated checkpoint")
    if not out.parent.is_dir():
        raise ConsolidateError(
            f"{out}: its folder {out.parent} does not exist; create it or give another output"
        )
    checkpoint = consolidate(folder)
    try:
        write_atomic(out, lambda file: torch.save(checkpoint, file))
    except OSError as exc:
        raise ConsolidateError(
            f"{out}: cannot be written in {out.parent} ({exc.strerror or exc}); give another output"
        ) from exc
    return out
