"""Documents -> splits -> samples -> shards: the split of a document by its text hash, the batched encoding,
and the packer that cuts each split's token stream into samples of seq_len + 1 tokens overlapping by one
(see data/manifest.py), writing a shard every `shard_samples` samples."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from data.manifest import ShardInfo, SplitInfo, samples_for_stream
from data.shards import shard_name, write_shard
from data.sources import SourceOptions, SourceStats, iter_documents

ENCODE_BATCH_BYTES = 1 << 20  # encode_batch runs documents in parallel; ~1 MB batches keep all cores busy

Document = tuple[str, bytes, str]  # text, its UTF-8 bytes, its split


def split_of(text_bytes: bytes, val_frac: float, test_frac: float) -> str:
    """val if hash < val_frac, test if < val_frac + test_frac, else train (hash uniform in [0, 1))."""
    unit = int.from_bytes(hashlib.blake2b(text_bytes, digest_size=8).digest(), "big") / 2**64
    if unit < val_frac:
        return "val"
    return "test" if unit < val_frac + test_frac else "train"


def split_documents(
    files: Sequence[Path], options: SourceOptions, val_frac: float, test_frac: float, stats: SourceStats
) -> Iterator[Document]:
    """The files' documents in order, each with its bytes and its split."""
    for text in iter_documents(files, options, stats):
        raw = text.encode("utf-8")
        yield text, raw, split_of(raw, val_frac, test_frac)


class SplitWriter:
    """Packs one split's token stream into samples and writes a shard every `shard_samples` samples."""

    def __init__(self, out: Path, split: str, seq_len: int, dtype: str, shard_samples: int) -> None:
        self.out, self.split, self.seq_len, self.dtype = out, split, seq_len, np.dtype(dtype)
        self.shard_samples = shard_samples
        self.info = SplitInfo()
        self._tail = np.zeros(0, dtype=self.dtype)  # not yet packed; starts with the overlap token
        self._pending: list[np.ndarray] = []

    def shard_name(self, number: int) -> str:
        """The file name of the split's shard `number` (data/task_steps.py names a task's shards)."""
        return shard_name(self.split, number)

    def add(self, eot: int, ids: Sequence[int], text_bytes: int) -> None:
        info = self.info
        info.documents += 1
        info.text_bytes += text_bytes
        info.stream_tokens += len(ids) + 1
        stream = np.concatenate([self._tail, np.asarray([eot], self.dtype), np.asarray(ids, self.dtype)])
        count = (len(stream) - 1) // self.seq_len
        for i in range(count):
            self._pending.append(stream[i * self.seq_len : (i + 1) * self.seq_len + 1].copy())
            if len(self._pending) == self.shard_samples:
                self._flush()
        self._tail = stream[count * self.seq_len :]

    def close(self) -> SplitInfo:
        if self._pending:
            self._flush()
        info = self.info
        samples, dropped = samples_for_stream(info.stream_tokens, self.seq_len)
        assert samples == info.samples, (samples, info.samples)  # packing and manifest arithmetic agree
        info.dropped_tokens = dropped
        return info

    def _flush(self) -> None:
        name = self.shard_name(len(self.info.shards))
        sha = write_shard(self.out / name, self.info.samples, self._pending)
        count = len(self._pending)
        self.info.shards.append(ShardInfo(path=name, samples=count, tokens=count * self.seq_len, sha256=sha))
        self.info.samples += count
        self.info.tokens += count * self.seq_len
        self._pending = []


def encode(
    encoder: Tokenizer,
    documents: Iterator[Document],
    writers: dict[str, SplitWriter],
    eot: int,
    total_bytes: int | None,
    progress: bool,
) -> None:
    """Encode documents in ~1 MB batches (encode_batch runs them in parallel) and pack each into its split."""
    bar = tqdm(
        total=total_bytes,
        unit="B",
        unit_scale=True,
        desc="encode+pack",
        disable=not progress,
        file=sys.stderr,
    )
    batch: list[Document] = []

    def flush() -> None:
        encodings = encoder.encode_batch_fast([text for text, _, _ in batch], add_special_tokens=False)
        for (_, raw, split), encoding in zip(batch, encodings, strict=True):
            writers[split].add(eot, encoding.ids, len(raw))
        bar.update(sum(len(raw) for _, raw, _ in batch))
        batch.clear()

    with bar:
        size = 0
        for document in documents:
            batch.append(document)
            size += len(document[1])
            if size >= ENCODE_BATCH_BYTES:
                flush()
                size = 0
        if batch:
            flush()
