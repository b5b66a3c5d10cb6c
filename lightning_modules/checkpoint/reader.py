"""Open a training checkpoint safely and say in one line why one cannot be used.

Loading is always `weights_only=True`: a checkpoint of this project holds tensors and plain data only, and
unpickling anything else from a file of unknown origin can run code. A sharded (FSDP) checkpoint is a folder:
torch.distributed.checkpoint's index (`.metadata`, a pickle), the shard files it names, and Lightning's
meta.pt with the non-tensor state. Its index is read with an allow-list of torch's metadata classes and its
shards through the safe reader of lightning_modules/core/lightning_api.py, the one every command uses: fit,
validate and test through lightning_modules/training/cli.py (then the strategy,
lightning_modules/distributed/strategy.py), generate (lightning_modules/generation/checkpoint.py) and
consolidate (lightning_modules/checkpoint/consolidation.py).

A folder is checked whole before anything else happens (`check_sharded_folder`): index readable and safe,
every shard it names present and long enough, meta.pt readable. So a resume from an incomplete folder ends in
one line before training starts and before the MLflow run it continues is reopened.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from lightning_modules.core.errors import UserError
from lightning_modules.core.lightning_api import (
    INDEX_FILENAME,
    METADATA_FILENAME,
    MODEL_KEY,
    load_sharded_checkpoint,
    load_sharded_values,
    read_sharded_index,
    shard_sizes,
    sharded_top_keys,
)

REQUIRED = ("pytorch-lightning_version", "global_step", "hyper_parameters")
SPECIAL = ("best", "last", "hpc")  # names Lightning resolves itself (`--ckpt_path last` for test)
EARLIER = "use an earlier checkpoint of the run (checkpoints/<run>/*.ckpt)"
UNSAFE = "so it was not written by this project's fit; not loaded (unpickling an untrusted file can run code)"


def is_special(path: str | Path) -> bool:
    return str(path) in SPECIAL or str(path).startswith("registry")


def _where(option: str, path: Path) -> str:
    return f"{option} {path}" if option else str(path)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__


def _load_file(file: Path, where: str) -> Any:
    """A torch.save file, weights_only=True, memory-mapped."""
    if not zipfile.is_zipfile(file):
        raise UserError(
            f"{where}: not a readable checkpoint (truncated, or not a file torch.save wrote); {EARLIER}"
        )
    try:
        return torch.load(file, map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError as exc:  # torch's message advises an unsafe load: not repeated here
        raise UserError(f"{where}: holds objects other than tensors and plain data, {UNSAFE}") from exc
    except Exception as exc:  # a damaged archive surfaces as RuntimeError, OSError, EOFError, ...
        raise UserError(f"{where}: cannot be read ({_first_line(exc)}); {EARLIER}") from exc


def check_sharded_folder(folder: Path, option: str = "--ckpt_path") -> dict[str, Any]:
    """meta.pt's dict of a sharded checkpoint folder, once the whole folder is known to be there and safe to
    read; a UserError naming the folder and what is wrong otherwise. Reads no tensor, only the shards' few
    non-tensor values (the optimiser's param groups), so that a crafted one is refused here too."""
    where = _where(option, folder)
    if not (folder / INDEX_FILENAME).is_file():
        raise UserError(
            f"{where}: a folder without {INDEX_FILENAME}, so not a sharded checkpoint; give a .ckpt file or a "
            "checkpoint folder written by fit (checkpoints/<run>/last.ckpt)"
        )
    try:
        index = read_sharded_index(folder)
    except pickle.UnpicklingError as exc:
        raise UserError(
            f"{where}: its {INDEX_FILENAME} holds objects other than torch.distributed.checkpoint's metadata "
            f"({exc}), {UNSAFE}"
        ) from exc
    except Exception as exc:  # truncated or not a pickle: EOFError, ValueError, OSError, ...
        raise UserError(
            f"{where}: its {INDEX_FILENAME} cannot be read ({_first_line(exc)}); {EARLIER}"
        ) from exc
    sizes = shard_sizes(index)
    missing = sorted(name for name in sizes if not (folder / name).is_file())
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise UserError(
            f"{where}: {len(missing)} of the {len(sizes)} shard files its {INDEX_FILENAME} names are missing "
            f"({shown}); copy the whole folder again, or {EARLIER}"
        )
    short = sorted(name for name, size in sizes.items() if (folder / name).stat().st_size < size)
    if short:
        raise UserError(
            f"{where}: shard file {short[0]} is shorter than its {INDEX_FILENAME} says (truncated); copy the "
            f"whole folder again, or {EARLIER}"
        )
    try:
        load_sharded_values(folder)
    except pickle.UnpicklingError as exc:
        raise UserError(
            f"{where}: a shard holds objects other than tensors and plain data, {UNSAFE}"
        ) from exc
    except Exception as exc:  # a damaged shard: RuntimeError, OSError, EOFError, ...
        raise UserError(f"{where}: its shards cannot be read ({_first_line(exc)}); {EARLIER}") from exc
    meta = folder / METADATA_FILENAME
    if not meta.is_file():
        raise UserError(
            f"{where}: no {METADATA_FILENAME} in the folder (the run's step, settings and MLflow run id); copy "
            f"the whole folder again, or {EARLIER}"
        )
    return _load_file(meta, f"{where}: {METADATA_FILENAME}")


def read_checkpoint(
    path: str | Path,
    option: str = "--ckpt_path",
    required: tuple[str, ...] = REQUIRED,
    weights: bool = False,
) -> dict[str, Any]:
    """The checkpoint's dict (tensors memory-mapped), or a UserError naming the file and what to do.

    A sharded folder is checked whole; its dict is meta.pt's (what the CLI needs before training), or with
    `weights` also the model's full "state_dict" gathered from the shards (optimiser states are not read)."""
    given = Path(path)
    where = _where(option, given)
    if given.is_dir():
        ckpt = check_sharded_folder(given, option)
        if weights and isinstance(ckpt, dict):
            index = read_sharded_index(given)  # checked above; its keys say what to gather
            keys = {key for key in sharded_top_keys(index) if not key.startswith("optimizer_")} or {MODEL_KEY}
            try:
                ckpt = load_sharded_checkpoint(given, keys)
            except pickle.UnpicklingError as exc:
                raise UserError(
                    f"{where}: a shard holds objects other than tensors and plain data, {UNSAFE}"
                ) from exc
            except Exception as exc:  # a damaged shard: RuntimeError, OSError, EOFError, ...
                raise UserError(
                    f"{where}: its shards cannot be read ({_first_line(exc)}); {EARLIER}"
                ) from exc
    elif not given.is_file():
        raise UserError(
            f"{where}: no such file; give a checkpoint written by fit (checkpoints/<run>/last.ckpt)"
        )
    else:
        ckpt = _load_file(given, where)
    missing = [key for key in required if not isinstance(ckpt, dict) or key not in ckpt]
    if missing or not isinstance(ckpt, dict):
        raise UserError(
            f"{where}: not a training checkpoint of this project (no {', '.join(missing)}); give a checkpoint "
            "written by `main.py fit`"
        )
    return ckpt
