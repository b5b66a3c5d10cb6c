"""Check every shard against manifest.json: present, sha256, readable tar, sample/token counts, ids < vocab.

The library behind `python -m lightning_modules verify` (lightning_modules/commands/verify.py), the DataModule's check before training
(data/datamodule.py) and prepare's check of what it built. A full check decodes every sample; a quick one
checks presence, sha256 and the tar's member count without decoding the samples. Both read every byte of
every shard; verify_sizes reads none (one stat per shard), which is what a fit does by default: the shards'
bytes are checked as they are streamed (data/streaming.py).
"""

from __future__ import annotations

import os
import sys
import tarfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.manifest import SPLITS, Manifest, ShardInfo
from data.shards import SAMPLE_FIELD, decode_npy, sample_key, sha256_file, size_problem


@dataclass(frozen=True)
class ShardProblem:
    split: str
    path: str  # as listed in the manifest, relative to its folder
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def verify(
    directory: str | Path, manifest: Manifest, splits: Sequence[str] = SPLITS, full: bool = True
) -> list[ShardProblem]:
    """All problems of the listed splits' shards (empty list: all good). Shards are checked in parallel."""
    directory = Path(directory)
    jobs = [(split, shard) for split in splits for shard in manifest.split(split).shards]
    threads = min(8, os.cpu_count() or 1)  # sha256 and file reads release the GIL
    with ThreadPoolExecutor(threads) as pool:
        results = pool.map(lambda job: check_shard(directory, manifest, job[1], full), jobs)
        return [
            ShardProblem(split, shard.path, "; ".join(messages))
            for (split, shard), messages in zip(jobs, results, strict=True)
            if messages
        ]


def verify_sizes(
    directory: str | Path, manifest: Manifest, split: str, shards: Sequence[ShardInfo]
) -> list[ShardProblem]:
    """Problems of the listed shards of `split` that a stat can see: missing, or not the size the manifest's
    sample count makes (data/shards.py shard_bytes). Reads no shard's bytes."""
    directory = Path(directory)
    return [
        ShardProblem(split, shard.path, problem)
        for shard in shards
        if (problem := size_problem(directory / shard.path, shard.samples, manifest.seq_len, manifest.dtype))
    ]


def check_shard(directory: Path, manifest: Manifest, shard: ShardInfo, full: bool) -> list[str]:
    """What is wrong with one shard (empty list: nothing)."""
    path = directory / shard.path
    if not path.is_file():
        return ["missing"]
    problems = []
    actual = sha256_file(path)
    if actual != shard.sha256:
        problems.append(f"sha256 {actual[:16]}... differs from the manifest's {shard.sha256[:16]}...")
    count, first_key = 0, None
    try:
        with tarfile.open(path, mode="r:") as tar:
            for member in tar:
                if first_key is None:
                    first_key = _key_of(member.name)
                if full and (problem := _check_member(tar, member, (first_key or 0) + count, manifest)):
                    problems.append(problem)
                    break
                count += 1  # samples read whole (or, with full=False, headers seen)
            else:
                # tarfile ends quietly at a bad header after the first one: what follows the last member
                # must be the end-of-archive marker (zero blocks), else the tar is corrupt there.
                end = tar.offset
                with open(path, "rb") as raw:
                    raw.seek(end)
                    if raw.read(tarfile.BLOCKSIZE).strip(b"\0"):
                        problems.append(f"corrupt tar: bad member header at byte {end} after {count} samples")
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        return [*problems, f"unreadable tar after {count} samples ({type(exc).__name__}: {exc})"]
    if count != shard.samples:
        problems.append(f"holds {count} samples, the manifest says {shard.samples}")
    return problems


def _key_of(name: str) -> int | None:
    stem = name.removesuffix(f".{SAMPLE_FIELD}")
    return int(stem) if stem.isdigit() else None


def _check_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, index: int, manifest: Manifest
) -> str | None:
    # Members are numbered consecutively (their position in the split) from the shard's first one.
    expected = f"{sample_key(index)}.{SAMPLE_FIELD}"
    if member.name != expected:
        return f"member {member.name!r} where {expected!r} belongs"
    handle = tar.extractfile(member)
    if handle is None:
        return f"member {member.name!r} is not a file"
    try:
        sample = decode_npy(handle.read())
    except ValueError as exc:
        return f"sample {member.name} is not a valid .npy array ({exc})"
    if sample.dtype != np.dtype(manifest.dtype) or sample.shape != (manifest.seq_len + 1,):
        return (
            f"sample {member.name} is {sample.dtype}{list(sample.shape)}, "
            f"the manifest says {manifest.dtype}[{manifest.seq_len + 1}]"
        )
    top = int(sample.max())
    if top >= manifest.vocab_size:
        return f"sample {member.name} holds token id {top} >= vocab_size {manifest.vocab_size}"
    return None


def check_tokenizer(directory: Path, manifest: Manifest) -> str | None:
    from tokenizers import Tokenizer  # late: the DataModule and --quick never load a tokenizer

    path = directory / manifest.tokenizer
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception
        return f"{path}: cannot load ({exc})"
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    eot = tokenizer.token_to_id(manifest.eot_token)
    if size != manifest.vocab_size or eot != manifest.eot_id:
        return (
            f"{path}: vocab {size}, {manifest.eot_token} = {eot}; "
            f"the manifest says vocab {manifest.vocab_size}, eot_id {manifest.eot_id}"
        )
    return None


def verify_folder(directory: Path, quick: bool) -> int:
    """lightning_modules.commands.verify's check of one folder: 0 when everything agrees; otherwise 1, after one line per bad shard
    ("<path>: <what is wrong>") on stderr. A manifest that cannot be read (or names files outside the folder)
    is a ManifestError, which lightning_modules.commands.verify reports in one line."""
    manifest = Manifest.load(directory)
    problems = [f"{directory / p.path}: {p.message}" for p in verify(directory, manifest, full=not quick)]
    if not quick and (tokenizer_problem := check_tokenizer(directory, manifest)):
        problems.append(tokenizer_problem)
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        return 1
    shards = sum(len(s.shards) for s in manifest.splits.values())
    counts = ", ".join(f"{n} {s.samples} samples / {s.tokens} tokens" for n, s in manifest.splits.items())
    print(f"OK {directory}: {shards} shards ({counts})")
    return 0
