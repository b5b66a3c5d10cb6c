"""Sharded checkpoint folders as an attacker or an interrupted copy would leave them, for the tests of the safe
reader (tests/checkpoint/test_untrusted_folder.py, tests/distributed/test_safe_resume.py). Each payload, if
unpickled, creates a marker file: the tests assert it never appears."""

from __future__ import annotations

import io
import os
import pickle
import shutil
from pathlib import Path

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex


class Touch:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def copy(folder: Path, to: Path) -> Path:
    shutil.rmtree(to, ignore_errors=True)
    shutil.copytree(folder, to)
    return to


def crafted_index(folder: Path, to: Path, marker: Path) -> Path:
    """The folder with its .metadata replaced by a pickle that runs a command."""
    copy(folder, to)
    (to / ".metadata").write_bytes(pickle.dumps(Touch(marker)))
    return to


def crafted_value(folder: Path, to: Path, marker: Path) -> Path:
    """The folder with a true index, except that one non-tensor value (an optimiser param group's entry,
    or any bytes item) now points at a pickle that runs a command, appended to its shard file."""
    copy(folder, to)
    with open(to / ".metadata", "rb") as file:
        index = pickle.load(file)  # the test's own copy of a real index: trusted
    fqn = next(k for k, v in index.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata))
    key = MetadataIndex(fqn)
    info = index.storage_data[key]
    shard = to / info.relative_path
    payload = _torch_saved(Touch(marker))
    start = shard.stat().st_size
    with open(shard, "ab") as file:
        file.write(payload)
    index.storage_data[key] = _StorageInfo(
        info.relative_path, start, len(payload), info.transform_descriptors
    )
    (to / ".metadata").write_bytes(pickle.dumps(index))
    return to


def without_shards(folder: Path, to: Path) -> Path:
    copy(folder, to)
    for shard in to.glob("*.distcp"):
        shard.unlink()
    return to


def _torch_saved(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer, pickle_module=pickle)
    return buffer.getvalue()
