"""The options of a preparation (one process or --tasks N) and the checks both paths make on them and on
what they produced."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from data.data_errors import PrepareError
from data.manifest import SplitInfo
from data.packing import split_documents
from data.parallel_options import DistributedOptions
from data.sources import SHAKESPEARE_DOC_CHARS, SourceOptions, SourceStats, expand_inputs, shakespeare_files
from data.tokenizer import BYTE_ALPHABET, EOT_TOKEN

DEFAULT_VOCAB = 4096
MIN_VOCAB = BYTE_ALPHABET + 1  # byte-level BPE: every byte, plus the end-of-text token
# Past this the BPE trainer's tables outgrow any machine (1e9 asks Rust for 70 GB and aborts the process)
# and no published tokenizer comes near it (the largest are ~256k).
MAX_VOCAB = 1 << 20


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


def source_files(cfg: PrepareConfig) -> tuple[list[Path], int]:
    """The input files in reading order, and the --txt-doc-chars in effect."""
    if cfg.source == "shakespeare":
        files, doc_chars = shakespeare_files(), SHAKESPEARE_DOC_CHARS
    else:
        files, doc_chars = expand_inputs(cfg.inputs), 0
    if cfg.txt_doc_chars is not None:
        doc_chars = cfg.txt_doc_chars
    return files, doc_chars


def check_options(cfg: PrepareConfig) -> None:
    if (cfg.source is None) == (not cfg.inputs):
        raise PrepareError("give input files/folders or --source shakespeare (exactly one of them)")
    if cfg.source not in (None, "shakespeare"):
        raise PrepareError(f"--source {cfg.source!r}: the only embedded corpus is 'shakespeare'")
    if cfg.tokenizer is not None and cfg.vocab_size is not None:
        raise PrepareError("--vocab-size trains a tokenizer; it cannot be combined with --tokenizer")
    if cfg.vocab_size is not None and not MIN_VOCAB <= cfg.vocab_size <= MAX_VOCAB:
        raise PrepareError(
            f"--vocab-size {cfg.vocab_size}: use {MIN_VOCAB} (every byte and the end-of-text token) to "
            f"{MAX_VOCAB}, or leave it out for {DEFAULT_VOCAB}"
        )
    if cfg.seq_len < 1 or cfg.shard_samples < 1:
        raise PrepareError("--seq-len and --shard-samples must be positive")
    if not (0 <= cfg.val_frac < 1 and 0 <= cfg.test_frac < 1 and cfg.val_frac + cfg.test_frac < 1):
        raise PrepareError("--val-frac and --test-frac must be in [0, 1) and leave a train split")
    if cfg.errors not in ("strict", "replace"):
        raise PrepareError(f"--errors {cfg.errors!r}: use 'strict' or 'replace'")


def check_nonempty(stats: SourceStats, files: Sequence[Path]) -> None:
    if stats.documents == 0:
        names = ", ".join(str(f) for f in files[:3]) + (" ..." if len(files) > 3 else "")
        raise PrepareError(f"input is empty: no non-blank document in {len(files)} file(s) ({names})")


def check_splits_can_fill(cfg: PrepareConfig, files: Sequence[Path], options: SourceOptions) -> None:
    """Before the tokenizer and the shards, the cheap half of check_splits: every split with a fraction
    above 0 gets at least one document (the split is a hash of the text, data/packing.py) and, with the
    trained byte-level BPE (never more tokens than bytes), enough bytes for one sample. Reads documents only
    until each split has that, so a normal corpus costs a few documents; a corpus that cannot fill a split
    (one huge document) is refused before minutes of tokenizer training on it."""
    fractions = {"train": 1 - cfg.val_frac - cfg.test_frac, "val": cfg.val_frac, "test": cfg.test_frac}
    wanted = {name for name, fraction in fractions.items() if fraction > 0}
    # a loaded tokenizer may give more tokens than bytes: then only a document per split is certain
    needed = cfg.seq_len + 1 if cfg.tokenizer is None else 1
    documents = dict.fromkeys(fractions, 0)
    bound = dict.fromkeys(fractions, 0)  # at most this many stream tokens (bytes + one end-of-text each)
    stats = SourceStats()
    for _, raw, split in split_documents(files, options, cfg.val_frac, cfg.test_frac, stats):
        documents[split] += 1
        bound[split] += len(raw) + 1 if cfg.tokenizer is None else 1
        if all(bound[name] >= needed for name in wanted):
            return
    check_nonempty(stats, files)
    name = next(name for name in ("train", "val", "test") if name in wanted and bound[name] < needed)
    got = f"{documents[name]} of the {stats.documents} documents"
    if documents[name]:
        got += f" ({bound[name] - documents[name]} bytes: fewer than one sample of {cfg.seq_len + 1} tokens)"
    raise PrepareError(
        f"split {name!r} would get {got}, found before tokenizing (a document goes to a split by a hash of "
        "its text): give more text or more, smaller documents (--txt-doc-chars N cuts .txt files at blank "
        "lines), lower --seq-len, or change --val-frac / --test-frac (0 leaves a split out)"
    )


def check_splits(cfg: PrepareConfig, splits: dict[str, SplitInfo]) -> None:
    fractions = {"train": 1 - cfg.val_frac - cfg.test_frac, "val": cfg.val_frac, "test": cfg.test_frac}
    for name, info in splits.items():
        if fractions[name] > 0 and info.samples == 0:
            raise PrepareError(
                f"split {name!r} got {info.documents} documents and {info.stream_tokens} tokens, not one sample "
                f"of {cfg.seq_len + 1} tokens: give more text (or more, smaller documents: --txt-doc-chars), "
                "raise its fraction, or lower --seq-len"
            )
