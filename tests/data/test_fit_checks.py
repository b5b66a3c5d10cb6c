"""The checks a fit makes by default: at set-up one stat per shard this rank reads ("sizes"), and each shard as it
is opened and streamed (size, structure, its sha256 when read to the end), a damaged one named in one line."""

from __future__ import annotations

import importlib.util
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from data.data_errors import ShardError
from data.datamodule import ShardDataModule
from data.manifest import Manifest
from data.plan import Piece, shard_order
from data.shards import shard_bytes, write_shard
from data.streaming import ShardSet
from tests.data.helpers import edit_manifest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "data_startup.py"


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("data_startup", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dm(directory: Path, **options: Any) -> ShardDataModule:
    return ShardDataModule(str(directory), batch_size=4, num_workers=0, shuffle_buffer=1, **options)


def _first_read_whole(directory: Path) -> Path:
    """The train shard that epoch 0 of one rank reads first, from its first sample to its last."""
    shards = Manifest.load(directory).split("train").shards
    return directory / shards[int(shard_order(len(shards), 0, 0)[0])].path


def _one_line_error(dm: ShardDataModule, epochs: int = 1) -> str:
    with pytest.raises(ShardError) as caught:
        for _ in range(epochs):
            for _ in dm.train_dataloader():
                pass
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_sizes_is_the_default_and_full_stays_available(prepared: Path) -> None:
    assert _dm(prepared).verify_mode == "sizes"
    assert _dm(prepared, verify="full").verify_mode == "full"


@pytest.mark.parametrize("dtype", ["uint16", "int32"])
@pytest.mark.parametrize("seq_len", [16, 255, 2048])
def test_shard_bytes_is_what_write_shard_writes(tmp_path: Path, dtype: str, seq_len: int) -> None:
    for samples in (0, 1, 7, 23, 64):
        path = tmp_path / "x.tar"
        write_shard(path, 0, [np.zeros(seq_len + 1, dtype=dtype)] * samples)
        assert path.stat().st_size == shard_bytes(samples, seq_len, dtype)


@pytest.mark.parametrize("damage", ["missing", "truncated", "grown"])
def test_missing_or_wrong_size_is_caught_at_set_up_in_one_line(prepared_copy: Path, damage: str) -> None:
    shard = _first_read_whole(prepared_copy)
    if damage == "missing":
        shard.unlink()
    elif damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:-2048])
    else:
        shard.write_bytes(shard.read_bytes() + b"\0" * 512)
    with pytest.raises(ShardError) as caught:
        _dm(prepared_copy).setup("fit")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{shard}: ")
    assert ("missing" if damage == "missing" else "bytes, not the") in message


def test_set_up_checks_only_the_shards_this_rank_reads(prepared_copy: Path) -> None:
    dms = []
    for rank in range(2):
        dm = _dm(prepared_copy)
        dm.set_rank(rank, 2)
        dms.append(dm)
    counts = [s.samples for s in Manifest.load(prepared_copy).split("train").shards]
    mine = [set(dm._rank_shards("train", counts, 0)) for dm in dms]
    only_second = sorted(mine[1] - mine[0])
    assert only_second, mine
    shard = prepared_copy / Manifest.load(prepared_copy).split("train").shards[only_second[0]].path
    shard.unlink()
    dms[0].setup("fit")  # rank 0 never opens it, so it does not look for it
    with pytest.raises(ShardError, match=f"{shard.name}: missing"):
        dms[1].setup("fit")


@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_shards_checked_are_the_shards_read(
    prepared: Path, monkeypatch: pytest.MonkeyPatch, world: int
) -> None:
    opened: list[int] = []
    read = ShardSet.read

    def recording(
        self: ShardSet, piece: Piece, wanted: np.ndarray | None = None
    ) -> Iterator[np.ndarray | None]:
        opened.append(piece.shard)
        return read(self, piece, wanted)

    monkeypatch.setattr(ShardSet, "read", recording)
    counts = [s.samples for s in Manifest.load(prepared).split("train").shards]
    for rank in range(world):
        dm = _dm(prepared)
        dm.set_rank(rank, world)
        for epoch in range(2):
            opened.clear()
            for _ in dm.train_dataloader():
                pass
            assert set(opened) == set(dm._rank_shards("train", counts, epoch))


def test_flipped_bytes_are_named_when_the_shard_is_read(prepared_copy: Path) -> None:
    shard = _first_read_whole(prepared_copy)
    with tarfile.open(shard) as tar:
        token = tar.getmembers()[3].offset_data + 128 + 2  # after the .npy header: a token, still below vocab
    data = bytearray(shard.read_bytes())
    data[token] ^= 0x01
    shard.write_bytes(bytes(data))
    dm = _dm(prepared_copy)
    dm.setup("fit")  # same size: the set-up check cannot see it
    message = _one_line_error(dm)
    assert message.startswith(f"{shard}: sha256 ") and "differs from the manifest's" in message
    assert f"python -m lightning_modules verify {prepared_copy}" in message


def test_a_broken_member_header_is_named_when_the_shard_is_read(prepared_copy: Path) -> None:
    shard = _first_read_whole(prepared_copy)
    with tarfile.open(shard) as tar:
        header = tar.getmembers()[2].offset
    data = bytearray(shard.read_bytes())
    data[header : header + 100] = b"\xff" * 100
    shard.write_bytes(bytes(data))
    dm = _dm(prepared_copy)
    dm.setup("fit")
    assert _one_line_error(dm).startswith(f"{shard}: ")


@pytest.mark.parametrize("verify", ["sizes", "off"])
def test_a_shard_cut_after_set_up_is_named_when_opened(prepared_copy: Path, verify: str) -> None:
    shard = _first_read_whole(prepared_copy)
    dm = _dm(prepared_copy, verify=verify)
    dm.setup("fit")
    shard.write_bytes(shard.read_bytes()[:-1024])
    message = _one_line_error(dm)
    assert message.startswith(f"{shard}: ") and "bytes, not the" in message


def test_each_epoch_starts_by_checking_its_shards(prepared_copy: Path) -> None:
    dm = _dm(prepared_copy)
    dm.setup("fit")
    for _ in dm.train_dataloader():
        pass
    shards = Manifest.load(prepared_copy).split("train").shards
    last = prepared_copy / shards[int(shard_order(len(shards), 0, 1)[-1])].path  # read last in epoch 1
    last.unlink()
    with pytest.raises(ShardError, match=f"{last.name}: missing"):
        next(iter(dm.train_dataloader()))  # before the first batch, not when the reader gets there


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.skipif(
    not Path("/proc/self/io").exists() or sys.platform != "linux", reason="needs /proc/self/io"
)
def test_the_default_check_reads_no_shard_and_reading_reads_each_once(tmp_path: Path) -> None:
    """Bytes the process reads (/proc/self/io rchar): "sizes" reads none of the shards at set-up where "full"
    reads all of them; a whole epoch then reads each shard about once, its sha256 taken on the way."""
    total = _benchmark().generate(tmp_path / "data", shards=16, samples=32, seq_len=255, vocab=1000)
    read = {}
    for level in ("sizes", "full"):
        dm = _dm(tmp_path / "data", verify=level)
        before = _rchar()
        dm.setup("fit")
        read[level] = _rchar() - before
    assert read["sizes"] < total / 50 and read["full"] >= total
    before = _rchar()
    for _ in dm.train_dataloader():
        pass
    epoch = _rchar() - before
    train = sum(p.stat().st_size for p in (tmp_path / "data").glob("train-*.tar"))
    assert train * 0.9 <= epoch < train * 1.2


@pytest.mark.parametrize("change", [-1, 1])
def test_a_sample_count_hidden_in_the_padding_is_named_when_opened(prepared_copy: Path, change: int) -> None:
    """One sample more or less in the manifest can leave the size unchanged (tarfile pads to 10 KB records):
    the last member and the end-of-archive marker, read when the shard is opened, tell."""
    shard = _first_read_whole(prepared_copy)
    manifest = Manifest.load(prepared_copy)
    samples = next(s.samples for s in manifest.split("train").shards if s.path == shard.name)
    assert shard_bytes(samples + change, manifest.seq_len, manifest.dtype) == shard.stat().st_size

    def edit(raw: dict) -> None:
        split = raw["splits"]["train"]
        for entry in split["shards"]:
            if entry["path"] == shard.name:
                entry["samples"] += change
                entry["tokens"] += change * raw["seq_len"]
        split["samples"] += change
        split["tokens"] += change * raw["seq_len"]

    edit_manifest(prepared_copy, edit)
    dm = _dm(prepared_copy)
    dm.setup("fit")
    with pytest.raises(ShardError) as caught:
        next(iter(dm.train_dataloader()))  # the first shard read: no sample of it is handed on
    assert str(caught.value).startswith(f"{shard}: ") and "\n" not in str(caught.value)
