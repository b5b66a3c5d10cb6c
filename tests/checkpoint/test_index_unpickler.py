"""The sharded index's unpickler cannot change the process that reads it: a crafted `.metadata` that sets
attributes on a class (pathlib's PosixPath, a metadata class), on an enum member or on a torch dtype through
pickle's BUILD is refused before the attribute is set, and afterwards Path, the storage-info class and the
shard-name confinement behave as before, in the same process (lightning_modules/core/lightning_api.py)."""

from __future__ import annotations

import pathlib
import pickle
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.filesystem import _StorageInfo

from lightning_modules.core.lightning_api import read_sharded_index

PROTO, GLOBAL, NONE, TUPLE2, BUILD, REDUCE, TUPLE1, STOP = (
    b"\x80\x02",
    b"c",
    b"N",
    b"\x86",
    b"b",
    b"R",
    b"\x85",
    b".",
)


def _value(value: object) -> bytes:
    """The opcodes that push `value` (plain data), without PROTO and STOP."""
    return pickle.dumps(value, protocol=2)[2:-1]


def _global(module: str, name: str) -> bytes:
    return GLOBAL + f"{module}\n{name}\n".encode()


def build_on(target: bytes, attributes: dict) -> bytes:
    """A pickle that pushes `target` and BUILDs it with `attributes` as slot state: setattr on each."""
    return PROTO + target + NONE + _value(attributes) + TUPLE2 + BUILD + STOP


CRAFTED = {
    "a class of pathlib": build_on(_global("pathlib", "PosixPath"), {"poisoned": "yes"}),
    "the storage-info class": build_on(
        _global("torch.distributed.checkpoint.filesystem", "_StorageInfo"), {"relative_path": "../outside"}
    ),
    "a metadata class's __setstate__": build_on(
        _global("torch.distributed.checkpoint.metadata", "Metadata"), {"__setstate__": "gone"}
    ),
    "an enum member": build_on(
        _global("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING")
        + _value(1)
        + TUPLE1
        + REDUCE,
        {"poisoned": "yes"},
    ),
    "a torch dtype": build_on(_global("torch", "float32"), {"poisoned": "yes"}),
}


def snapshot() -> dict[str, object]:
    return {
        "str(Path)": str(Path("/data/run/last.ckpt")),
        "PosixPath": dict(vars(pathlib.PosixPath)),
        "_StorageInfo": dict(vars(_StorageInfo)),
        "Metadata": dict(vars(dcp_metadata.Metadata)),
        "enum": [dict(vars(member)) for member in dcp_metadata._MEM_FORMAT_ENCODING],
        "float32": getattr(torch.float32, "poisoned", None),
    }


@pytest.mark.parametrize("name", list(CRAFTED))
def test_a_crafted_build_is_refused_and_the_process_is_unchanged(name: str, tmp_path: Path) -> None:
    before = snapshot()
    (tmp_path / ".metadata").write_bytes(CRAFTED[name])
    with pytest.raises(pickle.UnpicklingError, match="sets the state of"):
        read_sharded_index(tmp_path)
    assert snapshot() == before
    # the confinement check still refuses a shard outside the folder
    info = _StorageInfo("../outside", 0, 1)
    index = dcp_metadata.Metadata({}, storage_data={dcp_metadata.MetadataIndex("w"): info})
    (tmp_path / ".metadata").write_bytes(pickle.dumps(index))
    with pytest.raises(pickle.UnpicklingError, match="not a file inside the folder"):
        read_sharded_index(tmp_path)


def large_index(entries: int) -> dcp_metadata.Metadata:
    """An index the size of a large sharded checkpoint's: `entries` tensors, each one chunk in one shard."""
    state, storage = {}, {}
    for i in range(entries):
        fqn = f"model.layers.{i}.weight"
        chunk = dcp_metadata.ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([1024, 1024]))
        state[fqn] = dcp_metadata.TensorStorageMetadata(
            properties=dcp_metadata.TensorProperties(dtype=torch.bfloat16),
            size=torch.Size([1024, 1024]),
            chunks=[chunk],
        )
        storage[dcp_metadata.MetadataIndex(fqn, torch.Size([0, 0]), 0)] = _StorageInfo(
            f"__{i % 8}_0.distcp", i * 2**21, 2**21
        )
    return dcp_metadata.Metadata(state, storage_data=storage)


def test_a_real_index_reads_back_equal_and_the_checked_reader_costs_little(tmp_path: Path) -> None:
    """Equal to pickle's own reading; the time beside the C unpickler's is printed, not asserted."""
    index = large_index(2000)  # about a 6.3b model's block tensors on one rank
    (tmp_path / ".metadata").write_bytes(pickle.dumps(index))
    start = time.perf_counter()
    read = read_sharded_index(tmp_path)
    checked = time.perf_counter() - start
    start = time.perf_counter()
    with open(tmp_path / ".metadata", "rb") as file:
        plain = pickle.load(file)
    unchecked = time.perf_counter() - start
    assert read == plain == index
    print(
        f"index of 2000 tensors: checked reader {checked * 1e3:.1f} ms, C unpickler {unchecked * 1e3:.1f} ms"
    )
