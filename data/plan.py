"""Which samples each rank and DataLoader worker reads: pure index arithmetic, no I/O.

Train, per epoch e (all ranks compute the same plan from (seed, e) and the manifest's shard sizes):
  1. shard order = a permutation from (seed, e); the N train samples are laid out shard after shard in it;
  2. rank r takes positions [r*M, (r+1)*M), M = N // world: every rank gets exactly M samples (the remainder,
     < world, is dropped for this epoch) and K = M // batch_size batches, so DDP never waits on a rank;
  3. the rank's batches are dealt round-robin to S streams (S = DataLoader workers, or 1): batch b belongs to
     stream b % S, which is the order in which DataLoader collects from its workers; stream s reads its own
     contiguous run of the rank's samples (whole shards where it can) and shuffles it through a buffer
     whose output order is a permutation computed up front from (seed, e, rank, s);
  4. resuming after k batches: each stream knows which of its outputs were batches < k and skips them by
     index, without decoding; DataLoader worker w serves stream (w + k) % S so that the next batch, k,
     comes first.
Elastic resume (data/datamodule.py): "rank" and "world" above are data slices and their count, fixed for a
run; each rank reads data_slices / world of them and joins their batches, so global batch k is the same
samples at any world size.
Eval: rank r takes the contiguous range [r*N//world, (r+1)*N//world) (each sample once); every rank runs the
same number of batches (sizes differ by at most one), so per-step collectives cannot hang.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from data.data_errors import DataError


@dataclass(frozen=True)
class Piece:
    """Samples [start, stop) of the split's shard number `shard`."""

    shard: int
    start: int
    stop: int


def shard_order(num_shards: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, 0]).permutation(num_shards)


def train_batches_per_rank(total_samples: int, world: int, batch_size: int) -> int:
    return (total_samples // world) // batch_size


def stream_batches(batches: int, streams: int, stream: int) -> int:
    """How many of batches 0..batches-1 fall to `stream` when batch b goes to stream b % streams."""
    return max(0, (batches - stream + streams - 1) // streams)


def pieces_for_range(start: int, stop: int, order: Sequence[int], counts: Sequence[int]) -> list[Piece]:
    """Positions [start, stop) of the shards laid out in `order`, as per-shard pieces in reading order."""
    pieces, offset = [], 0
    for shard in order:
        size = counts[shard]
        lo, hi = max(start, offset), min(stop, offset + size)
        if lo < hi:
            pieces.append(Piece(int(shard), lo - offset, hi - offset))
        offset += size
        if offset >= stop:
            break
    return pieces


@dataclass(frozen=True)
class TrainStreamPlan:
    pieces: list[Piece]  # what the stream reads, in order
    batches: int  # batches the stream yields in a whole epoch
    skip: int  # of those, already consumed before a resume
    permutation: np.ndarray  # output j of the stream is read position permutation[j]


def train_stream_plan(
    counts: Sequence[int],
    *,
    seed: int,
    epoch: int,
    rank: int,
    world: int,
    streams: int,
    stream: int,
    batch_size: int,
    buffer: int,
    consumed: int,
) -> TrainStreamPlan:
    total = sum(counts)
    per_rank = total // world
    batches = per_rank // batch_size
    before = sum(stream_batches(batches, streams, s) for s in range(stream))
    mine = stream_batches(batches, streams, stream)
    start = rank * per_rank + before * batch_size
    pieces = pieces_for_range(start, start + mine * batch_size, shard_order(len(counts), seed, epoch), counts)
    rng = np.random.default_rng([seed, epoch, 1, rank, stream])
    return TrainStreamPlan(
        pieces=pieces,
        batches=mine,
        skip=stream_batches(consumed, streams, stream),
        permutation=buffer_permutation(mine * batch_size, buffer, rng),
    )


def buffer_permutation(n: int, buffer: int, rng: np.random.Generator) -> np.ndarray:
    """Output order of a shuffle buffer of `buffer` slots fed positions 0..n-1 (fill, then emit a random slot
    and refill it with the next position; drain randomly at the end). Computed on indices, so a reader can
    skip outputs exactly and hold at most `buffer` samples in memory."""
    if buffer <= 1 or n <= 1:
        return np.arange(n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    slots = list(range(min(buffer, n)))
    following = len(slots)
    draws = rng.random(n)
    for j in range(n):
        i = int(draws[j] * len(slots))
        out[j] = slots[i]
        if following < n:
            slots[i] = following
            following += 1
        else:
            slots[i] = slots[-1]
            slots.pop()
    return out


def eval_batches(total_samples: int, world: int, rank: int, batch_size: int) -> list[tuple[int, int]]:
    """This rank's eval batches as [start, stop) sample ranges; the same count on every rank."""
    if total_samples < world:
        raise DataError(f"{total_samples} evaluation samples cannot be shared by {world} ranks")
    lo, hi = rank * total_samples // world, (rank + 1) * total_samples // world
    # Enough batches that none exceeds batch_size, but never more than the smallest rank has samples.
    count = min(math.ceil(total_samples / (world * batch_size)), total_samples // world)
    size = hi - lo
    return [(lo + i * size // count, lo + (i + 1) * size // count) for i in range(count)]


def train_shards_read(
    counts: Sequence[int], *, seed: int, epoch: int, slices: Sequence[int], world: int, batch_size: int
) -> list[int]:
    """The shards (indices into counts) that the data slices `slices` of `world` read in `epoch`, in shard order.

    Slice s reads positions [s*M, s*M + K*batch_size) of the epoch's shard layout (M = N // world samples, K =
    M // batch_size batches); its streams split exactly that range (train_stream_plan), so this is every shard
    a rank reading those slices opens in the epoch, and no other."""
    per_slice = sum(counts) // world
    used = per_slice // batch_size * batch_size
    order = shard_order(len(counts), seed, epoch)
    shards = {
        piece.shard
        for s in slices
        for piece in pieces_for_range(s * per_slice, s * per_slice + used, order, counts)
    }
    return sorted(shards)


def eval_shards_read(counts: Sequence[int], *, rank: int, world: int) -> list[int]:
    """The shards (indices into counts) that rank `rank` of `world` reads of a validation or test split."""
    total = sum(counts)
    lo, hi = rank * total // world, (rank + 1) * total // world
    return [piece.shard for piece in pieces_for_range(lo, hi, range(len(counts)), counts)]
