"""Helpers that several test modules of this folder share (fixtures stay in conftest.py)."""

from __future__ import annotations

import json
import os
import random
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from data.manifest import Manifest
from data.prepare_config import PrepareConfig
from data.shards import decode_npy
from data.sources import shakespeare_files
from tests.conftest import TINY_SEQ_LEN

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "been",
    "one",
    "all",
    "we",
    "their",
    "has",
    "would",
    "when",
    "if",
    "so",
    "no",
    "will",
    "more",
    "can",
    "river",
    "mountain",
    "lantern",
    "quiet",
    "harbour",
    "copper",
    "thistle",
    "meadow",
    "falcon",
    "ember",
    "winter",
    "saffron",
    "orchard",
]
SEQ_LEN = 16
VOCAB = 300


def make_documents(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for i in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(15, 90))]
        # a number per document keeps every document (and so every sample) distinct
        docs.append(f"Doc {i}: " + " ".join(words) + rng.choice([".", "!", "?\n"]))
    return docs


def write_corpus(root: Path, docs: list[str]) -> list[str]:
    """docs[:20] as .txt files, the next 20 as JSONL, the rest as Parquet; returns docs in reading order."""
    (root / "txt").mkdir(parents=True)
    for i, doc in enumerate(docs[:20]):
        (root / "txt" / f"doc{i:03d}.txt").write_text(doc, encoding="utf-8")
    with open(root / "b.jsonl", "w", encoding="utf-8") as handle:
        for doc in docs[20:40]:
            handle.write(json.dumps({"text": doc, "id": 1}) + "\n")
    pq.write_table(pa.table({"text": docs[40:], "n": list(range(len(docs) - 40))}), root / "c.parquet")
    return docs  # expand_inputs order: b.jsonl, c.parquet, txt/... (sorted within the folder)


def corpus_order(docs: list[str]) -> list[str]:
    """The order prepare reads write_corpus's files when given [root/b.jsonl, root/c.parquet, root/txt]."""
    return docs[20:40] + docs[40:] + docs[:20]


def corpus_inputs(root: Path) -> list[str]:
    return [str(root / "b.jsonl"), str(root / "c.parquet"), str(root / "txt")]


def tiny_config(out: Path, inputs: list[str], **overrides: object) -> PrepareConfig:
    options: dict = dict(
        out=out,
        inputs=inputs,
        vocab_size=VOCAB,
        seq_len=SEQ_LEN,
        val_frac=0.15,
        test_frac=0.15,
        shard_samples=23,
        progress=False,
    )
    options.update(overrides)
    return PrepareConfig(**options)


def read_split(directory: Path, split: str, skip: tuple[str, ...] = ()) -> list[np.ndarray]:
    """All samples of a split (but the shards in skip) straight from the tars, not via the DataModule."""
    manifest = Manifest.load(directory)
    samples = []
    for shard in manifest.split(split).shards:
        if shard.path in skip:
            continue
        with tarfile.open(directory / shard.path) as tar:
            for member in tar:
                samples.append(decode_npy(tar.extractfile(member).read()))
    return samples


def edit_manifest(directory: Path, change: Callable[[dict], None]) -> None:
    path = directory / "manifest.json"
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw, indent=2))


ROOT = Path(__file__).resolve().parents[2]

# The options of tests/conftest.py's tiny_shards (the one-process reference)
OPTIONS = ["--vocab-size", "512", "--seq-len", str(TINY_SEQ_LEN), "--no-progress", "--shard-samples", "256",
           "--val-frac", "0.1", "--test-frac", "0.1"]  # fmt: skip


def files() -> list[str]:
    return [str(p) for p in shakespeare_files()[:6]]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
