"""The tokenizer of a preparation: the one --tokenizer names, or a byte-level BPE trained on the train split
(so val/test text never shapes the vocabulary). Used by both paths, one process and --tasks N."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from data.packing import Document
from data.prepare_config import DEFAULT_VOCAB, PrepareConfig, check_nonempty
from data.sources import SourceStats
from data.tokenizer import load_tokenizer, train_bpe


def corpus_tokenizer(
    cfg: PrepareConfig, documents: Callable[[SourceStats], Iterator[Document]], files: Sequence[Path]
) -> tuple[Tokenizer, int | None]:
    """The loaded tokenizer, or one trained on the train split; with the corpus' total text bytes when
    training had to read it all anyway."""
    if cfg.tokenizer is not None:
        return load_tokenizer(cfg.tokenizer), None
    stats, total = SourceStats(), [0]

    def train_docs() -> Iterator[str]:
        for text, raw, split in documents(stats):
            total[0] += len(raw)
            if split == "train":
                yield text

    tokenizer = train_bpe(train_docs(), cfg.vocab_size or DEFAULT_VOCAB, cfg.eot_token, cfg.progress)
    check_nonempty(stats, files)
    return tokenizer, total[0]
