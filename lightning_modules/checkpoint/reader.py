"""Open a training checkpoint safely and say in one line why one cannot be used.

Loading is always `weights_only=True`: a checkpoint of this project holds tensors and plain data only, and
unpickling anything else from a file of unknown origin can run code. A sharded (FSDP) checkpoint is a folder
whose non-tensor state sits in Lightning's metadata file; that file is what is read here.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from lightning_modules.core.errors import UserError
from lightning_modules.core.lightning_api import METADATA_FILENAME

REQUIRED = ("pytorch-lightning_version", "global_step", "hyper_parameters")
SPECIAL = ("best", "last", "hpc")  # names Lightning resolves itself (`--ckpt_path last` for test)


def is_special(path: str | Path) -> bool:
    return str(path) in SPECIAL or str(path).startswith("registry")


def read_checkpoint(
    path: str | Path, option: str = "--ckpt_path", required: tuple[str, ...] = REQUIRED
) -> dict[str, Any]:
    """The checkpoint's dict (tensors memory-mapped), or a UserError naming the file and what to do."""
    given = Path(path)
    where = f"{option} {given}"
    file = given / METADATA_FILENAME if given.is_dir() else given
    if given.is_dir() and not file.is_file():
        raise UserError(
            f"{where}: a folder without {METADATA_FILENAME}, so not a sharded checkpoint; give a .ckpt file "
            "or a checkpoint folder written by fit (checkpoints/<run>/last.ckpt)"
        )
    if not file.is_file():
        raise UserError(
            f"{where}: no such file; give a checkpoint written by fit (checkpoints/<run>/last.ckpt)"
        )
    if not zipfile.is_zipfile(file):
        raise UserError(
            f"{where}: not a readable checkpoint (truncated, or not a file torch.save wrote); use an earlier "
            "checkpoint of the run (checkpoints/<run>/*.ckpt)"
        )
    try:
        ckpt = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError as exc:  # torch's message advises an unsafe load: not repeated here
        raise UserError(
            f"{where}: holds objects other than tensors and plain data, so it was not written by this project's "
            "fit; not loaded (unpickling an untrusted file can run code)"
        ) from exc
    except Exception as exc:  # a damaged archive surfaces as RuntimeError, OSError, EOFError, ...
        raise UserError(
            f"{where}: cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); use an earlier "
            "checkpoint of the run (checkpoints/<run>/*.ckpt)"
        ) from exc
    missing = [key for key in required if not isinstance(ckpt, dict) or key not in ckpt]
    if missing or not isinstance(ckpt, dict):
        raise UserError(
            f"{where}: not a training checkpoint of this project (no {', '.join(missing)}); give a checkpoint "
            "written by `main.py fit`"
        )
    return ckpt
