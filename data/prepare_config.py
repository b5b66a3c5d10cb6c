"""The options of a preparation (one process or --tasks N) and the checks both paths make on them and on
what they produced."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from data.errors import PrepareError
from data.manifest import SplitInfo
from data.parallel_options import DistributedOptions
from data.sources import SHAKESPEARE_DOC_CHARS, SourceStats, expand_inputs, shakespeare_files
from data.tokenizer import EOT_TOKEN

DEFAULT_VOCAB = 4096


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


def check_splits(cfg: PrepareConfig, splits: dict[str, SplitInfo]) -> None:
    fractions = {"train": 1 - cfg.val_frac - cfg.test_frac, "val": cfg.val_frac, "test": cfg.test_frac}
    for name, info in splits.items():
        if fractions[name] > 0 and info.samples == 0:
            raise PrepareError(
                f"split {name!r} got {info.documents} documents and {info.stream_tokens} tokens, not one sample "
                f"of {cfg.seq_len + 1} tokens: give more text (or more, smaller documents: --txt-doc-chars), "
                "raise its fraction, or lower --seq-len"
            )
