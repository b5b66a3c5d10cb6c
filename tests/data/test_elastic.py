"""Elastic resume at the data level: with a global batch and data slices, global batch k holds the same
samples on 1, 2 or 4 ranks, and a position saved by 2 ranks continues on 1 or 4 with exactly the next
global batches (none lost, none repeated); a world size that cannot share the slices is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from data.data_errors import DataError
from data.datamodule import ShardDataModule

GLOBAL, SLICES = 8, 4


def _module(directory: Path, rank: int, world: int, workers: int, **kwargs: object) -> ShardDataModule:
    options: dict = dict(num_workers=workers, seed=5, shuffle_buffer=32, global_batch_size=GLOBAL)
    options.update(data_slices=SLICES)
    options.update(kwargs)
    dm = ShardDataModule(str(directory), **options)
    dm.set_rank(rank, world)
    return dm


def _global_batches(modules: list[ShardDataModule], count: int) -> list[torch.Tensor]:
    """The next `count` global batches: each rank's batch k, joined in rank order."""
    loaders = [iter(dm.train_dataloader()) for dm in modules]
    out = []
    for _ in range(count):
        parts = [next(loader) for loader in loaders]
        assert all(p.shape[0] == GLOBAL // len(modules) for p in parts)
        out.append(torch.cat(parts))
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_global_batches_do_not_depend_on_the_world_size(prepared: Path, workers: int) -> None:
    one = _global_batches([_module(prepared, 0, 1, workers)], 6)
    for world in (2, 4):
        many = _global_batches([_module(prepared, r, world, workers) for r in range(world)], 6)
        assert all(torch.equal(a, b) for a, b in zip(one, many, strict=True)), world
    rows = torch.cat(one)
    assert len({tuple(r.tolist()) for r in rows}) == len(rows)  # no sample twice within the epoch


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("world", [1, 4])
def test_position_from_two_ranks_resumes_on_another_world_size(
    prepared: Path, workers: int, world: int
) -> None:
    uninterrupted = _global_batches([_module(prepared, 0, 1, workers)], 7)
    writers = [_module(prepared, r, 2, workers) for r in range(2)]
    first = _global_batches(writers, 3)
    state = writers[0].state_dict()
    assert state["global_samples"] == 3 * GLOBAL and state["slices"] == SLICES
    readers = [_module(prepared, r, world, workers, data_slices=None) for r in range(world)]
    for dm in readers:
        dm.load_state_dict(state)  # data_slices left unset: taken from the checkpoint
    rest = _global_batches(readers, 4)
    assert all(torch.equal(a, b) for a, b in zip(first + rest, uninterrupted, strict=True))


def test_world_size_that_cannot_share_the_slices_is_refused(prepared: Path) -> None:
    state = _module(prepared, 0, 2, 0).state_dict()
    dm = _module(prepared, 0, 3, 0, global_batch_size=12, data_slices=None)
    dm.load_state_dict(state)
    with pytest.raises(DataError, match="cannot share 4 data slices"):
        list(dm.train_dataloader())
    other = _module(prepared, 0, 2, 0, global_batch_size=16, data_slices=None)
    other.load_state_dict(state)
    with pytest.raises(DataError, match="global_batch_size: checkpoint 8, now 16"):
        list(other.train_dataloader())
    with pytest.raises(DataError, match="not a multiple of the world size 3"):
        _ = _module(prepared, 0, 3, 0).batch_size
