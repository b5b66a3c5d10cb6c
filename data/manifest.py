"""manifest.json: what prepare wrote, and what every reader checks the shards against.

Sample layout (the contract between prepare, verify and the DataModule): each split is one token stream
(documents in input order, each preceded by the end-of-text token) cut into samples of seq_len + 1 tokens.
Consecutive samples overlap by one token (sample i = stream[i*seq_len : i*seq_len + seq_len + 1]), so the
targets (sample[1:]) of all samples cover every token of the stream after the first exactly once; the
trailing partial sample is dropped and counted in `dropped_tokens`. Hence, per shard and per split,
`tokens` = samples * seq_len = the number of target tokens a full pass trains or evaluates on.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from data.data_errors import ManifestError

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SPLITS = ("train", "val", "test")
LAYOUT = "samples of seq_len+1 tokens overlapping by one token; trailing partial sample dropped"


@dataclass(frozen=True)
class ShardInfo:
    path: str  # relative to the manifest's directory
    samples: int
    tokens: int
    sha256: str


@dataclass
class SplitInfo:
    shards: list[ShardInfo] = field(default_factory=list)
    samples: int = 0
    tokens: int = 0
    text_bytes: int = (
        0  # UTF-8 bytes of the split's documents (separators excluded): bits-per-byte denominator
    )
    documents: int = 0
    stream_tokens: int = 0  # documents' tokens + one end-of-text token per document, before packing
    dropped_tokens: int = 0  # tail of the stream that did not fill a sample


@dataclass
class Manifest:
    vocab_size: int
    dtype: str
    seq_len: int
    tokenizer: str
    eot_token: str
    eot_id: int
    splits: dict[str, SplitInfo]
    source: dict[str, Any] = field(default_factory=dict)
    layout: str = LAYOUT
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        # sort_keys + fixed indent: identical inputs give a byte-identical manifest too.
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    def save(self, directory: Path) -> Path:
        path = Path(directory) / MANIFEST_NAME
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.to_json(), encoding="utf-8")
        tmp.replace(path)  # written last and atomically: a manifest means the shards are complete
        return path

    @classmethod
    def load(cls, directory: str | Path) -> Manifest:
        path = Path(directory) / MANIFEST_NAME
        if not path.is_file():
            raise ManifestError(
                f"{path}: no manifest; build the shards first, e.g. "
                f"`python -m lightning_modules prepare --source shakespeare --out {directory}` (or `make data`)"
            )
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestError(f"{path}: unreadable manifest ({exc})") from exc
        return cls.from_dict(raw, where=str(path))

    @classmethod
    def from_dict(cls, raw: Any, where: str = MANIFEST_NAME) -> Manifest:
        try:
            splits = {
                name: SplitInfo(
                    shards=[ShardInfo(**shard) for shard in split["shards"]],
                    **{k: int(v) for k, v in split.items() if k != "shards"},
                )
                for name, split in sorted(raw["splits"].items(), key=lambda item: _split_rank(item[0]))
            }
            manifest = cls(
                vocab_size=int(raw["vocab_size"]),
                dtype=str(raw["dtype"]),
                seq_len=int(raw["seq_len"]),
                tokenizer=str(raw["tokenizer"]),
                eot_token=str(raw["eot_token"]),
                eot_id=int(raw["eot_id"]),
                splits=splits,
                source=dict(raw.get("source", {})),
                layout=str(raw.get("layout", LAYOUT)),
                format_version=int(raw.get("format_version", FORMAT_VERSION)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"{where}: malformed manifest ({type(exc).__name__}: {exc})") from exc
        manifest.check_consistent(where)
        return manifest

    def check_consistent(self, where: str = MANIFEST_NAME) -> None:
        """Internal arithmetic only (the shards themselves are checked by lightning_modules.commands.verify)."""
        problems = []
        if self.format_version != FORMAT_VERSION:
            problems.append(f"format_version {self.format_version}, this code reads {FORMAT_VERSION}")
        if self.dtype != dtype_for_vocab(self.vocab_size):
            problems.append(
                f"dtype {self.dtype} but vocab_size {self.vocab_size} needs {dtype_for_vocab(self.vocab_size)}"
            )
        if not 0 <= self.eot_id < self.vocab_size:
            problems.append(f"eot_id {self.eot_id} outside the vocabulary of {self.vocab_size}")
        if self.seq_len < 1:
            problems.append(f"seq_len {self.seq_len} < 1")
        if not is_plain_name(self.tokenizer):
            problems.append(f"tokenizer {self.tokenizer!r} is not a plain file name in the data folder")
        for name in SPLITS:
            if name not in self.splits:
                problems.append(f"split {name!r} missing")
        for name, split in self.splits.items():
            if sum(s.samples for s in split.shards) != split.samples:
                problems.append(
                    f"{name}: shard samples sum to {sum(s.samples for s in split.shards)}, not {split.samples}"
                )
            if sum(s.tokens for s in split.shards) != split.tokens:
                problems.append(
                    f"{name}: shard tokens sum to {sum(s.tokens for s in split.shards)}, not {split.tokens}"
                )
            for shard in split.shards:
                if not is_plain_name(shard.path):
                    problems.append(
                        f"{name} shard {shard.path!r} is not a plain file name in the data folder (a manifest "
                        "names only files beside it; this one was edited or not written by lightning_modules.commands.prepare)"
                    )
                    continue
                if shard.tokens != shard.samples * self.seq_len:
                    problems.append(
                        f"{shard.path}: tokens {shard.tokens} != samples {shard.samples} x seq_len"
                    )
        if problems:
            raise ManifestError(f"{where}: " + "; ".join(problems))

    def split(self, name: str) -> SplitInfo:
        if name not in self.splits:
            raise ManifestError(f"no split {name!r} in the manifest (has {sorted(self.splits)})")
        return self.splits[name]


def is_plain_name(name: object) -> bool:
    """A file name with no folder part: readers open <data folder>/<name> and nothing outside it."""
    return (
        isinstance(name, str)
        and bool(name)
        and name not in (".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
    )


def _split_rank(name: str) -> tuple[int, str]:
    return (SPLITS.index(name) if name in SPLITS else len(SPLITS), name)


def dtype_for_vocab(vocab_size: int) -> str:
    """uint16 halves the shards whenever every id fits; int32 otherwise (torch has no uint32 indexing)."""
    return "uint16" if vocab_size <= 2**16 else "int32"


def samples_for_stream(stream_tokens: int, seq_len: int) -> tuple[int, int]:
    """(samples, dropped tokens) when a stream is cut into samples overlapping by one token."""
    if stream_tokens <= seq_len:
        return 0, stream_tokens
    samples = (stream_tokens - 1) // seq_len
    return samples, stream_tokens - 1 - samples * seq_len


def bits_per_byte(mean_loss_nats: float, tokens: int, text_bytes: int) -> float:
    """Mean per-token cross-entropy (nats) over a split -> bits per UTF-8 byte of its text."""
    return mean_loss_nats / math.log(2) * tokens / text_bytes
