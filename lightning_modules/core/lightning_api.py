"""The Lightning internals the project relies on, in one place (docs/architecture.md).

Lightning offers no public API for these, and each has a reason:
- a ModelCheckpoint that also saves at the end of fit must ask for a save the way the callback does itself
  (lightning_modules/checkpoint/callback.py): `_monitor_candidates`, `_save_topk_checkpoint`, `_save_last_checkpoint`, and
  `_last_global_step_saved` to know whether this step is already saved;
- the step number Lightning gives a training step's metrics when it logs them
  (`fit_loop.epoch_loop._batches_that_stepped`): a checkpoint saved inside a step is written before that step's
  metrics are logged, so the checkpoint carries them under that number (lightning_modules/training/language_model.py);
- a sharded (ModelParallelStrategy) checkpoint is a directory; its non-tensor state (the MLflow run id) sits
  in Lightning's metadata file (`_METADATA_FILENAME`, lightning_modules/checkpoint/reader.py).

Reading a sharded checkpoint is done here rather than by Lightning or torch: torch.distributed.checkpoint
unpickles the folder's index (`.metadata`) with plain pickle and the shards' non-tensor values (the optimiser's
param groups) with `weights_only=False`, so a crafted folder would run code. `read_sharded_index` unpickles
the index with an allow-list of the metadata classes torch writes; `_SafeBytes` reads non-tensor values with
`weights_only=True`; every sharded read of the project goes through them: gathering the shards into one dict
(`load_sharded_checkpoint`, used by lightning_modules/checkpoint/reader.py) and the strategy's resume
(`load_sharded_into`, lightning_modules/distributed/strategy.py), which replaces the sharded branch of
Lightning's `lightning.fabric.strategies.model_parallel._load_checkpoint`. torch's own internals used for
that (`_load_state_dict`, `_EmptyStateDictLoadPlanner`, `set_element`, `_StorageInfo`) are imported here too;
tests/distributed/test_safe_resume.py checks that the resume restores exactly what Lightning's loader restores,
and tests/checkpoint/test_untrusted_folder.py that a real folder's index passes the allow-list.

Choice: these are gathered here, and tests/core/test_lightning_api.py checks each one's existence, signature and
behaviour against the installed Lightning, so an upgrade that changes them fails that test, naming the API,
instead of failing mid-run. The dependency stays a range (pyproject.toml) rather than pinned to one minor
release: a pin would block Lightning's fixes for everyone, while the test tells exactly which internal moved.
Each private name used here is also listed in lightning_modules/core/private_api.py.
"""

from __future__ import annotations

import dataclasses
import io
import pathlib
import pickle
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed.checkpoint as dcp
from lightning.fabric.utilities.load import _METADATA_FILENAME
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.distributed.checkpoint import CheckpointException, FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

METADATA_FILENAME: str = _METADATA_FILENAME  # the non-tensor state of a sharded checkpoint directory
INDEX_FILENAME = ".metadata"  # torch.distributed.checkpoint's index: which file holds which tensor
MODEL_KEY = "state_dict"  # the model's key in a sharded checkpoint, as ModelParallelStrategy saves it


def last_saved_step(callback: ModelCheckpoint) -> int:
    """The global step of the callback's latest save."""
    return callback._last_global_step_saved


def save_now(callback: ModelCheckpoint, trainer: L.Trainer) -> None:
    """Save as the callback does at a save point: its top-k checkpoint and, if configured, last.ckpt."""
    candidates = callback._monitor_candidates(trainer)
    callback._save_topk_checkpoint(trainer, candidates)
    callback._save_last_checkpoint(trainer, candidates)


def log_step(trainer: L.Trainer) -> int:
    """The step under which Lightning logs the current training step's metrics; it moves on only after
    they are logged (and after any validation of that step)."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


# Everything torch.distributed.checkpoint (torch 2.3 to 2.13) pickles into a folder's index, by the (module,
# name) its pickle names: the metadata dataclasses, the shard locations, and the torch values they hold
# (sizes, layouts; dtypes are checked by type in find_class). pathlib is 3.13's module for its paths.
_INDEX_GLOBALS: dict[tuple[str, str], Any] = {
    **{
        ("torch.distributed.checkpoint.metadata", name): getattr(dcp_metadata, name)
        for name in (
            "Metadata",
            "TensorStorageMetadata",
            "TensorProperties",
            "ChunkStorageMetadata",
            "BytesStorageMetadata",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    },
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,  # a layout by name, nothing else
    **{
        (module, name): getattr(pathlib, name)
        for module in ("pathlib", "pathlib._local")
        for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")
    },
}


# The only objects an index's pickle may fill in with BUILD: instances of these, which the same pickle has just
# created. BUILD on anything else would set attributes on an object this process shares: a class (pathlib's
# PosixPath, a metadata class: every later Path or checkpoint would see the change), an enum member, a module.
_BUILDABLE: frozenset[type] = frozenset(
    cls for cls in _INDEX_GLOBALS.values() if isinstance(cls, type) and dataclasses.is_dataclass(cls)
)


class _IndexUnpickler(pickle._Unpickler):
    """Pickle restricted to _INDEX_GLOBALS, and to BUILD on the metadata instances it creates: a crafted index
    naming anything else (os.system, ...) fails on that name before anything is called, and one that would
    set attributes on a shared object (a class, an enum member) fails before the attribute is set. Python's
    own unpickler, not the C one, since only it lets BUILD be checked (tests/checkpoint/test_untrusted_folder.py
    measures the cost on a large index)."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _INDEX_GLOBALS:
            return _INDEX_GLOBALS[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(
            f"{module}.{name} is not part of torch.distributed.checkpoint's metadata"
        )

    def load_build(self) -> None:
        target = self.stack[-2] if len(self.stack) >= 2 else None  # BUILD: the state on top, its object below
        if type(target) not in _BUILDABLE:
            raise pickle.UnpicklingError(
                f"sets the state of a {type(target).__name__} (only the metadata it creates may be filled in)"
            )
        pickle._Unpickler.load_build(self)

    dispatch[pickle.BUILD[0]] = load_build


def read_sharded_index(folder: Path, rank: int | None = None) -> dcp_metadata.Metadata:
    """The folder's torch.distributed.checkpoint index, unpickled with the allow-list; a pickle.UnpicklingError
    when it holds anything else or names a shard outside the folder (OSError, EOFError when unreadable)."""
    name = INDEX_FILENAME if rank is None else f"__{rank}{INDEX_FILENAME}"  # rank-local: torch's naming
    with open(Path(folder) / name, "rb") as file:
        index = _IndexUnpickler(file).load()
    if not isinstance(index, dcp_metadata.Metadata) or not (
        isinstance(index.storage_data, dict) and isinstance(index.state_dict_metadata, dict)
    ):
        raise pickle.UnpicklingError(
            f"holds a {type(index).__name__}, not torch.distributed.checkpoint's Metadata"
        )
    for info in index.storage_data.values():
        relative = info.relative_path if isinstance(info, _StorageInfo) else None
        if not isinstance(relative, str) or Path(relative).name != relative or relative in ("", ".", ".."):
            raise pickle.UnpicklingError(f"names a shard {relative!r} that is not a file inside the folder")
        spans = (info.offset, info.length)
        if not all(isinstance(n, int) and n >= 0 for n in spans):
            raise pickle.UnpicklingError(f"gives shard {relative} a span {spans!r} that is not two sizes")
    return index


def shard_sizes(index: dcp_metadata.Metadata) -> dict[str, int]:
    """Each shard file the index names and the bytes it must hold at least."""
    sizes: dict[str, int] = {}
    for info in index.storage_data.values():
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), info.offset + info.length)
    return sizes


class _SafeReader(FileSystemReader):
    """torch's FileSystemReader, with the index read by read_sharded_index (tensors it already reads with
    weights_only=True)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        index = read_sharded_index(Path(self.path), kwargs.get("rank"))
        if getattr(index, "storage_meta", None) is None:  # as torch's own reader does
            index.storage_meta = dcp_metadata.StorageMeta()
        assert index.storage_meta is not None
        index.storage_meta.load_id = self.load_id
        return index


class _SafeBytes(DefaultLoadPlanner):
    """torch's load planner, with non-tensor values read with weights_only=True (torch: weights_only=False)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:  # torch's message advises weights_only=False: not passed on
            found = re.search(r"GLOBAL (\S+)", str(exc))
            raise pickle.UnpicklingError(
                f"the value {read_item.dest_index.fqn} holds "
                + (f"{found.group(1)}, not only tensors and plain data" if found else "more than plain data")
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class _SafeGather(_SafeBytes, _EmptyStateDictLoadPlanner):
    """torch's planner that rebuilds the whole state from the index (no model needed), read safely."""


def _read(state: dict[str, Any], folder: Path, planner: _SafeBytes, gather: bool) -> None:
    """Fill `state` from the folder through the safe reader: `gather`, in this process alone (the whole state
    the planner rebuilds), else as torch.distributed.checkpoint.load does on every rank. torch reports a failed
    read as a CheckpointException (a BaseException, with the tracebacks in its message); the first rank's own
    exception is raised instead, so callers catch ordinary exceptions."""
    try:
        if gather:
            _load_state_dict(state, storage_reader=_SafeReader(folder), planner=planner, no_dist=True)
        else:
            dcp.load(state, storage_reader=_SafeReader(folder), planner=planner)
    except CheckpointException as exc:
        failures = [failure[0] for failure in exc.failures.values() if isinstance(failure[0], BaseException)]
        if not failures:
            raise
        raise failures[0] from None


def load_sharded_checkpoint(folder: Path, keys: Iterable[str] | None = None) -> dict[str, Any]:
    """A sharded checkpoint directory gathered into one checkpoint dict in CPU memory, as Lightning's
    `_load_distributed_checkpoint` does, read safely; `keys`: only these top-level entries of the shards
    (e.g. "state_dict"; default all), meta.pt is always added."""
    folder = Path(folder)
    checkpoint: dict[str, Any] = {}
    _read(checkpoint, folder, _SafeGather(keys=set(keys) if keys is not None else None), gather=True)
    checkpoint.update(torch.load(folder / METADATA_FILENAME, map_location="cpu", weights_only=True))
    return checkpoint


def load_sharded_values(folder: Path) -> dict[str, Any]:
    """Every non-tensor value of a sharded checkpoint (the optimiser's param groups: small), read safely, nested
    as saved; a pickle.UnpicklingError when one holds more than plain data. Reading them up front lets a
    command refuse a crafted shard before the training run, or its MLflow run, starts."""
    folder = Path(folder)
    index = read_sharded_index(folder)
    keys = {
        fqn
        for fqn, item in index.state_dict_metadata.items()
        if isinstance(item, dcp_metadata.BytesStorageMetadata)
    }
    values: dict[str, Any] = {}
    if keys:
        _read(values, folder, _SafeGather(keys=keys), gather=True)
    return values


def sharded_top_keys(index: dcp_metadata.Metadata) -> set[str]:
    """The top-level entries of a sharded checkpoint ("state_dict", "optimizer_0", ...)."""
    planner_data = index.planner_data if isinstance(index.planner_data, dict) else {}
    return {str(path[0]) if path else fqn for fqn, path in planner_data.items()}


def load_sharded_into(
    folder: Path, module: torch.nn.Module, optimizers: list[torch.optim.Optimizer], strict: bool
) -> dict[str, Any]:
    """ModelParallelStrategy's resume from a sharded folder, read safely: the shards into the sharded module
    and its optimisers, and meta.pt's dict returned (Lightning's `_load_checkpoint`, sharded branch, with the
    module under MODEL_KEY and the optimisers as optimizer_<i>)."""
    folder = Path(folder)
    index = read_sharded_index(folder)  # before torch reads it: its failure there would only log and go on
    missing = sorted(name for name in shard_sizes(index) if not (folder / name).is_file())
    if missing:
        raise FileNotFoundError(f"shard files {', '.join(missing)} named by its {INDEX_FILENAME} are missing")
    module_state = {MODEL_KEY: get_model_state_dict(module)}
    _read(module_state, folder, _SafeBytes(), gather=False)
    module.load_state_dict(module_state[MODEL_KEY], strict=strict)
    for i, optimizer in enumerate(optimizers):
        key = f"optimizer_{i}"
        optimizer_state = {key: get_optimizer_state_dict(module, optimizer)}
        _read(optimizer_state, folder, _SafeBytes(), gather=False)
        set_optimizer_state_dict(
            module,
            optimizer,
            optim_state_dict=optimizer_state[key],
            options=StateDictOptions(cpu_offload=True),
        )
    return torch.load(folder / METADATA_FILENAME, map_location="cpu", weights_only=True)
