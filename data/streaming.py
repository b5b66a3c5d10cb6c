"""IterableDatasets that read the plan of data/plan.py from the shards with WebDataset, batch by batch.

Each yields whole batches, LongTensor (batch, seq_len + 1), so that one DataLoader task is one batch and the
DataLoader's round-robin over workers delivers the batches in plan order.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info
from webdataset.tariterators import group_by_keys, tar_file_expander

from data.data_errors import ShardError
from data.plan import Piece, eval_batches, pieces_for_range, train_stream_plan
from data.shards import SAMPLE_FIELD, HashingReader, decode_npy, sample_key, size_problem, tail_problem


@dataclass(frozen=True)
class ShardSet:
    """The shards of one split that are read (all, or the good ones with skip_bad_shards).

    Each shard is checked as it is opened and read: its size against the manifest's sample count (one stat),
    its last member and the end-of-archive marker where that count puts them (two block reads), its samples'
    keys, shapes and token ids as they are decoded, and, when it is read to its end, the sha256 of the bytes
    streamed against the manifest's, compared before its last sample is handed on. A damaged shard stops the
    run with a ShardError naming it on one line."""

    directory: str
    paths: tuple[str, ...]  # relative to directory
    counts: tuple[int, ...]  # samples per shard
    seq_len: int
    vocab_size: int
    dtype: str
    digests: tuple[str, ...] = ()  # the manifest's sha256 per shard; empty: not compared

    @property
    def samples(self) -> int:
        return sum(self.counts)

    def read(self, piece: Piece, wanted: np.ndarray | None = None) -> Iterator[np.ndarray | None]:
        """The piece's samples in order; None for those where `wanted` (per piece position) is False."""
        path = str(Path(self.directory) / self.paths[piece.shard])
        count = self.counts[piece.shard]
        if problem := size_problem(Path(path), count, self.seq_len, self.dtype):
            raise ShardError(f"{path}: {problem}{self._hint}")
        # A piece always starts at the shard's first byte; one that runs to the shard's end streams every
        # byte, so its sha256 comes free with the read (a piece ending earlier is checked by decoding only).
        hashed = piece.stop == count and bool(self.digests)
        seen, first_key = 0, 0  # samples met in the tar, whether in the piece or not
        try:
            # unbuffered: the tail check's two blocks are all it reads before the stream starts at byte 0
            with open(path, "rb", buffering=0) as raw:
                if problem := tail_problem(raw, count, self.seq_len, self.dtype):
                    raise ShardError(f"{path}: {problem}{self._hint}")
                reader = HashingReader(raw)
                members = tar_file_expander(iter([{"url": path, "stream": reader}]))
                for position, sample in enumerate(group_by_keys(members)):
                    seen = position + 1
                    key = sample.get("__key__", "")
                    if position == 0 and key.isdigit():
                        first_key = int(key)
                    # keys number the samples consecutively: a gap or a stranger means a damaged shard
                    if key != sample_key(first_key + position) or SAMPLE_FIELD not in sample:
                        raise ShardError(
                            f"{path}: sample {position} is {key!r}, expected "
                            f"{sample_key(first_key + position)}{self._hint}"
                        )
                    if position < piece.start:
                        continue  # skipping costs a read of the bytes but no decoding
                    if position >= piece.stop:
                        break
                    if hashed and seen == count:
                        self._check_digest(path, piece.shard, reader)
                    if wanted is not None and not wanted[position - piece.start]:
                        yield None
                    else:
                        yield self._decode(path, position, sample[SAMPLE_FIELD])
        except ShardError:
            raise
        except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
            raise ShardError(
                f"{path}: unreadable tar after {seen} samples ({type(exc).__name__}: {exc}){self._hint}"
            ) from exc
        if seen < piece.stop:
            raise ShardError(f"{path}: ends after {seen} samples, the manifest says {count}{self._hint}")

    @property
    def _hint(self) -> str:
        return f"; `python -m lightning_modules verify {self.directory}` checks every shard"

    def _check_digest(self, path: str, shard: int, reader: HashingReader) -> None:
        actual, expected = reader.finish(), self.digests[shard]
        if actual != expected:
            raise ShardError(
                f"{path}: sha256 {actual[:16]}... of the bytes read differs from the manifest's "
                f"{expected[:16]}... (changed since prepare){self._hint}"
            )

    def _decode(self, path: str, position: int, payload: bytes) -> np.ndarray:
        try:
            sample = decode_npy(payload)
        except ValueError as exc:
            raise ShardError(
                f"{path}: sample {position} is not a valid .npy array ({exc}){self._hint}"
            ) from exc
        if sample.dtype != np.dtype(self.dtype) or sample.shape != (self.seq_len + 1,):
            raise ShardError(
                f"{path}: sample {position} is {sample.dtype}{list(sample.shape)}, "
                f"the manifest says {self.dtype}[{self.seq_len + 1}]{self._hint}"
            )
        if int(sample.max()) >= self.vocab_size:
            raise ShardError(
                f"{path}: sample {position} holds token id {int(sample.max())} >= vocab {self.vocab_size}{self._hint}"
            )
        return sample


def to_batch(samples: Sequence[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(samples).astype(np.int64))


def _worker() -> tuple[int, int]:
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


class TrainStream(IterableDataset):
    """One rank's training batches for one epoch, starting after `consumed` batches.

    The plan (data/plan.py) is made for `world` data slices; this rank reads the slices `slices` (default:
    slice `rank` alone) and each of its batches joins their batches, in slice order. Global batch k is
    then batch k of every slice, whichever ranks read them, so the samples a run trains on do not depend
    on how many ranks share the slices (elastic resume, data/datamodule.py)."""

    def __init__(
        self,
        shards: ShardSet,
        *,
        seed: int,
        epoch: int,
        rank: int,
        world: int,
        streams: int,
        batch_size: int,
        buffer: int,
        consumed: int,
        slices: Sequence[int] | None = None,
    ) -> None:
        self.shards, self.seed, self.epoch, self.rank, self.world = shards, seed, epoch, rank, world
        self.streams, self.batch_size, self.buffer, self.consumed = streams, batch_size, buffer, consumed
        self.slices = tuple(slices) if slices is not None else (rank,)

    def __iter__(self) -> Iterator[torch.Tensor]:
        worker, workers = _worker()
        if workers != self.streams:
            raise RuntimeError(f"TrainStream planned for {self.streams} streams, run by {workers} workers")
        # DataLoader worker w delivers outputs w, w + S, ...: after k batches that is stream (w + k) % S.
        stream = (worker + self.consumed) % self.streams
        if len(self.slices) == 1:
            yield from self.stream(stream, self.slices[0])
            return
        for parts in zip(*(self.stream(stream, s) for s in self.slices), strict=True):
            yield torch.cat(parts)

    def stream(self, stream: int, slice_: int | None = None) -> Iterator[torch.Tensor]:
        plan = train_stream_plan(
            self.shards.counts,
            seed=self.seed,
            epoch=self.epoch,
            rank=self.rank if slice_ is None else slice_,
            world=self.world,
            streams=self.streams,
            stream=stream,
            batch_size=self.batch_size,
            buffer=self.buffer,
            consumed=self.consumed,
        )
        first = plan.skip * self.batch_size  # first output still to deliver
        order = plan.permutation
        rank_of = np.empty_like(order)
        rank_of[order] = np.arange(len(order))  # read position -> output index
        wanted = rank_of >= first
        samples = self._positions(plan.pieces, wanted)
        held: dict[int, np.ndarray] = {}
        batch: list[np.ndarray] = []
        for j in range(first, len(order)):
            target = int(order[j])
            while target not in held:
                position, sample = next(samples)
                if sample is not None:
                    held[position] = sample
            batch.append(held.pop(target))
            if len(batch) == self.batch_size:
                yield to_batch(batch)
                batch = []

    def _positions(self, pieces: list[Piece], wanted: np.ndarray) -> Iterator[tuple[int, np.ndarray | None]]:
        """(read position, sample or None when not wanted), never opening a piece with nothing wanted."""
        position = 0
        for piece in pieces:
            size = piece.stop - piece.start
            mask = wanted[position : position + size]
            if mask.any():
                for offset, sample in enumerate(self.shards.read(piece, mask)):
                    yield position + offset, sample
            position += size


class EvalStream(IterableDataset):
    """One rank's share of a validation/test split, in order; each worker takes a contiguous block of batches."""

    def __init__(self, shards: ShardSet, *, rank: int, world: int, batch_size: int) -> None:
        self.shards, self.rank, self.world, self.batch_size = shards, rank, world, batch_size

    def __len__(self) -> int:
        return len(eval_batches(self.shards.samples, self.world, self.rank, self.batch_size))

    def __iter__(self) -> Iterator[torch.Tensor]:
        worker, workers = _worker()
        batches = eval_batches(self.shards.samples, self.world, self.rank, self.batch_size)
        mine = batches[worker * len(batches) // workers : (worker + 1) * len(batches) // workers]
        if not mine:
            return
        order = range(len(self.shards.counts))
        pieces = pieces_for_range(mine[0][0], mine[-1][1], order, self.shards.counts)
        samples = (s for piece in pieces for s in self.shards.read(piece))
        for start, stop in mine:
            yield to_batch([next(samples) for _ in range(stop - start)])
