"""Byte-level BPE (HF tokenizers): train one on the train split, or load a tokenizer.json."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data.data_errors import PrepareError

EOT_TOKEN = "<|endoftext|>"
TOKENIZER_NAME = "tokenizer.json"
BYTE_ALPHABET = 256  # byte-level BPE starts from every byte, so any UTF-8 text encodes without <unk>


def train_bpe(
    documents: Iterable[str], vocab_size: int, eot_token: str = EOT_TOKEN, show_progress: bool = True
) -> Tokenizer:
    """Deterministic for a given document order: the trainer breaks count ties by the pair itself."""
    if vocab_size < BYTE_ALPHABET + 1:
        raise PrepareError(f"--vocab-size {vocab_size} is too small: byte-level BPE needs at least 257")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eot_token],  # id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return tokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for both missing and malformed files
        raise PrepareError(f"{path}: cannot load tokenizer ({exc})") from exc


def eot_id(tokenizer: Tokenizer, eot_token: str, where: str) -> int:
    token_id = tokenizer.token_to_id(eot_token)
    if token_id is None:
        raise PrepareError(
            f"{where}: tokenizer has no end-of-text token {eot_token!r} (set it with --eot-token)"
        )
    return token_id


def for_encoding(tokenizer: Tokenizer) -> Tokenizer:
    """A copy that reads special-token strings inside documents as plain text.

    Otherwise a document that quotes "<|endoftext|>" would get a real document separator in the middle.
    """
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.encode_special_tokens = True
    return copy
