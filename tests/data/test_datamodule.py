"""ShardDataModule: even split over simulated ranks and real DataLoader workers, exactly-once evaluation."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from data.data_errors import DataError
from data.datamodule import ShardDataModule
from data.manifest import Manifest
from data.plan import buffer_permutation, eval_batches, stream_batches
from tests.data.helpers import SEQ_LEN, read_split


def _module(directory: Path, rank: int = 0, world: int = 1, **kwargs: object) -> ShardDataModule:
    options: dict = dict(batch_size=4, num_workers=2, seed=7, shuffle_buffer=16)
    options.update(kwargs)
    dm = ShardDataModule(str(directory), **options)
    dm.set_rank(rank, world)
    dm.setup("fit")
    return dm


def _rows(batches: list[torch.Tensor]) -> list[tuple[int, ...]]:
    return [tuple(row.tolist()) for batch in batches for row in batch]


def test_properties_come_from_the_manifest(prepared: Path) -> None:
    dm = ShardDataModule(str(prepared), batch_size=4)
    manifest = Manifest.load(prepared)
    assert (dm.vocab_size, dm.seq_len, dm.eot_id) == (manifest.vocab_size, SEQ_LEN, manifest.eot_id)
    for split in ("train", "val", "test"):
        assert dm.tokens(split) == manifest.split(split).samples * SEQ_LEN
        assert dm.text_bytes(split) == manifest.split(split).text_bytes > 0
    assert Path(dm.tokenizer_path).is_file()


def test_batches_are_long_with_seq_len_plus_one(prepared: Path) -> None:
    batch = next(iter(_module(prepared, num_workers=0).train_dataloader()))
    assert batch.dtype == torch.long and batch.shape == (4, SEQ_LEN + 1)


@pytest.mark.slow
@pytest.mark.parametrize("world, workers", [(2, 2), (3, 2)])
def test_each_train_sample_once_per_epoch_with_equal_batches(
    prepared: Path, world: int, workers: int
) -> None:
    all_samples = [tuple(s.tolist()) for s in read_split(prepared, "train")]
    assert len(set(all_samples)) == len(all_samples)  # the corpus makes every sample distinct
    shards = len(Manifest.load(prepared).split("train").shards)
    assert shards % (world * workers) != 0  # the awkward case
    modules = [_module(prepared, rank, world, num_workers=workers) for rank in range(world)]
    loaders = [dm.train_dataloader() for dm in modules]
    per_rank = len(all_samples) // world // 4
    orders = []
    for _epoch in range(2):
        epoch = [list(loader) for loader in loaders]
        assert [len(batches) for batches in epoch] == [per_rank] * world == [len(l) for l in loaders]
        rows = [row for batches in epoch for row in _rows(batches)]
        assert len(rows) == len(set(rows)) == world * per_rank * 4  # none twice; only the remainder left out
        assert set(rows) <= set(all_samples)
        assert len(all_samples) - len(rows) < world * 4
        orders.append(rows)
    assert orders[0] != orders[1]  # the next epoch reshuffles
    assert all(dm.state_dict()["epoch"] == 1 for dm in modules)


def test_fewer_shards_than_ranks_times_workers_still_split_evenly(one_shard: Path) -> None:
    assert len(Manifest.load(one_shard).split("train").shards) == 1
    loaders = [_module(one_shard, rank, 2).train_dataloader() for rank in range(2)]
    epoch = [list(loader) for loader in loaders]
    assert len(epoch[0]) == len(epoch[1]) > 0
    rows = _rows(epoch[0]) + _rows(epoch[1])
    assert len(rows) == len(set(rows))


def test_shuffling_depends_on_the_seed(prepared: Path) -> None:
    first = _rows(list(_module(prepared, seed=1).train_dataloader()))
    again = _rows(list(_module(prepared, seed=1).train_dataloader()))
    other = _rows(list(_module(prepared, seed=2).train_dataloader()))
    assert first == again and first != other and sorted(first) != first


@pytest.mark.parametrize("split", ["val", "test"])
@pytest.mark.parametrize("world, workers", [(2, 2), (3, 2), (1, 0)])
def test_eval_reads_each_sample_exactly_once(prepared: Path, split: str, world: int, workers: int) -> None:
    expected = Counter(tuple(s.tolist()) for s in read_split(prepared, split))
    modules = [_module(prepared, rank, world, num_workers=workers, val_batch_size=3) for rank in range(world)]
    loaders = [dm.val_dataloader() if split == "val" else dm.test_dataloader() for dm in modules]
    batches = [list(loader) for loader in loaders]
    assert len({len(b) for b in batches}) == 1 and [len(b) for b in batches] == [len(l) for l in loaders]
    assert all(0 < len(batch) <= 3 for rank in batches for batch in rank)
    assert Counter(row for rank in batches for row in _rows(rank)) == expected
    if world == 1:  # one rank reads the split in order
        assert _rows(batches[0]) == [tuple(s.tolist()) for s in read_split(prepared, split)]


def test_eval_batch_plan_covers_every_sample() -> None:
    for total in range(4, 60):
        for world in (1, 2, 3, 4):
            for size in (1, 2, 5):
                ranges = [r for rank in range(world) for r in eval_batches(total, world, rank, size)]
                counts = {len(eval_batches(total, world, rank, size)) for rank in range(world)}
                assert len(counts) == 1
                covered = [i for a, b in ranges for i in range(a, b)]
                assert covered == list(range(total)) and all(b > a for a, b in ranges)


def test_buffer_permutation_and_stream_split() -> None:
    rng = np.random.default_rng(0)
    perm = buffer_permutation(1000, 64, rng)
    assert sorted(perm.tolist()) == list(range(1000)) and perm.tolist() != list(range(1000))
    # a buffer of 64 slots never emits a position more than 63 ahead of what it has read
    assert all(perm[j] <= j + 63 for j in range(1000))
    assert [stream_batches(10, 3, s) for s in range(3)] == [4, 3, 3]
    assert [stream_batches(2, 3, s) for s in range(3)] == [1, 1, 0]


def test_too_few_samples_for_the_world(prepared: Path) -> None:
    dm = _module(prepared, 0, 1, batch_size=10_000)
    with pytest.raises(DataError, match="give no batch of 10000"):
        len(dm.train_dataloader())


def test_constructor_is_exposed_to_the_cli(prepared: Path) -> None:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(ShardDataModule, "data")
    args = ["--data.data_dir", str(prepared), "--data.batch_size", "8", "--data.seq_len", str(SEQ_LEN)]
    dm = parser.instantiate_classes(parser.parse_args([*args, "--data.verify", "quick"])).data
    assert (dm.batch_size, dm.num_workers, dm.verify_mode, dm.val_batch_size) == (8, 2, "quick", 8)
    with pytest.raises(Exception, match="verify"):
        parser.parse_args([*args, "--data.verify", "sometimes"])
