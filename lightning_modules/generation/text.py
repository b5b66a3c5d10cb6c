"""Text in and out of generation: the run's tokenizer, found through its data directory's manifest.json
("tokenizer": file name relative to data_dir, "eot_id"), and the new tokens streamed as text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

from tokenizers import Tokenizer

from lightning_modules.generation.checkpoint import GenerateError


def load_tokenizer(data_dir: str | Path) -> tuple[Tokenizer, int]:
    """The run's tokenizer and end-of-text id, through <data_dir>/manifest.json."""
    manifest_path = Path(data_dir) / "manifest.json"
    if not manifest_path.is_file():
        raise GenerateError(
            f"{manifest_path}: no data manifest; pass --data-dir with the directory the run was trained on "
            "(it holds manifest.json and the tokenizer)"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        name = manifest["tokenizer"]
        tokenizer_path = Path(data_dir) / name
        eot_id = int(manifest["eot_id"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise GenerateError(f"{manifest_path}: malformed manifest ({type(exc).__name__}: {exc})") from exc
    if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
        # the same rule as data/manifest.py's readers: nothing outside the data folder is opened
        raise GenerateError(
            f"{manifest_path}: tokenizer {name!r} is not a plain file name in {data_dir}; fix the manifest"
        )
    if not tokenizer_path.is_file():
        raise GenerateError(f"{tokenizer_path}: tokenizer named by {manifest_path} is missing")
    try:
        return Tokenizer.from_file(str(tokenizer_path)), eot_id
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise GenerateError(f"{tokenizer_path}: cannot load tokenizer ({exc})") from exc


class TextStream:
    """Prints the text of the new tokens as they come. Decoding the whole sequence and printing the new suffix
    (rather than decoding tokens one by one) keeps multi-token characters and merges right; a suffix that ends
    inside a UTF-8 character (U+FFFD) waits for the next token."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], out: TextIO) -> None:
        self.tokenizer, self.prompt_ids, self.out = tokenizer, prompt_ids, out
        self.base = tokenizer.decode(prompt_ids)
        self.ids: list[int] = []
        self.emitted = ""

    def _continuation(self) -> str:
        full = self.tokenizer.decode(self.prompt_ids + self.ids)
        return full[len(self.base) :] if full.startswith(self.base) else self.tokenizer.decode(self.ids)

    def __call__(self, token: int) -> None:
        self.ids.append(token)
        text = self._continuation()
        if not text.endswith("\ufffd"):
            self._emit(text)

    def close(self) -> None:
        self._emit(self._continuation())
        self.out.write("\n")
        self.out.flush()

    def _emit(self, text: str) -> None:
        new = text[len(self.emitted) :] if text.startswith(self.emitted) else text
        if new:
            self.out.write(new)
            self.out.flush()
        self.emitted = text
