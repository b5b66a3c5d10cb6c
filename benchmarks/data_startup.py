"""A fit's data set-up time on a generated dataset of many shards, per `verify` level and world size.

    python benchmarks/data_startup.py --shards 1024 --samples 128 --seq-len 2048 --json

Generates --shards train shards of --samples samples (random uint16 tokens, written by data/shards.py's
write_shard, as prepare writes them), one val and one test shard, and their manifest. Then, for each level
and world size, a fresh process builds the ShardDataModule as rank 0 of that world, runs setup("fit")
(the check before training) and takes the first train batch (num_workers 0, so the reading is in the
timed process); it reports both times and the bytes the process read (/proc/self/io rchar). "default" is
whatever `verify` the code at hand defaults to, so the same command measures the code before a change
(PYTHONPATH=<an export of the older tree>). --cold evicts the shards from the page cache before each
measurement (posix_fadvise DONTNEED, no root needed), so the reads come from the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def generate(directory: Path, shards: int, samples: int, seq_len: int, vocab: int = 50_000) -> int:
    """A dataset of `shards` train shards of `samples` samples each (one val and one test shard of as many),
    with its manifest; returns the bytes of all shards. Tokens are random: the checks do not care."""
    from data.manifest import Manifest, SplitInfo, dtype_for_vocab
    from data.shards import shard_name, write_shard

    directory.mkdir(parents=True, exist_ok=True)
    dtype = dtype_for_vocab(vocab)
    rng = np.random.default_rng(0)
    splits, total = {}, 0
    for split, count in (("train", shards), ("val", 1), ("test", 1)):
        info = SplitInfo()
        for number in range(count):
            tokens = rng.integers(0, vocab, size=(samples, seq_len + 1), dtype=np.int64).astype(dtype)
            name = shard_name(split, number)
            digest = write_shard(directory / name, number * samples, list(tokens))
            info.shards.append(_shard_info(name, samples, seq_len, digest))
            total += (directory / name).stat().st_size
        info.samples, info.tokens = count * samples, count * samples * seq_len
        info.stream_tokens, info.documents, info.text_bytes = info.tokens + 1, count, info.tokens * 4
        splits[split] = info
    manifest = Manifest(
        vocab_size=vocab,
        dtype=dtype,
        seq_len=seq_len,
        tokenizer="tokenizer.json",  # never loaded by the DataModule
        eot_token="<|endoftext|>",
        eot_id=0,
        splits=splits,
        source={"generated": "benchmarks/data_startup.py"},
    )
    manifest.save(directory)
    return total


def _shard_info(name: str, samples: int, seq_len: int, digest: str) -> Any:
    from data.manifest import ShardInfo

    return ShardInfo(path=name, samples=samples, tokens=samples * seq_len, sha256=digest)


def evict(directory: Path) -> None:
    """Drop the folder's files from the page cache (clean pages only, which these are after write_shard's fsync)."""
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def measure(directory: str, level: str, world: int, batch_size: int) -> dict[str, Any]:
    """One measurement, in this process: construction + setup("fit"), then the first train batch."""
    import torch  # noqa: F401  (imported before the clock starts: a fit has it already)

    from data.datamodule import ShardDataModule

    options: dict[str, Any] = {} if level == "default" else {"verify": level}
    read_before, start = _rchar(), time.perf_counter()
    dm = ShardDataModule(directory, batch_size=batch_size, num_workers=0, shuffle_buffer=1, **options)
    dm.set_rank(0, world)
    dm.setup("fit")
    set_up, read_set_up = time.perf_counter() - start, _rchar() - read_before
    next(iter(dm.train_dataloader()))
    first = time.perf_counter() - start
    return {
        "level": level,
        "verify": dm.verify_mode,
        "world": world,
        "setup_s": set_up,
        "first_batch_s": first,
        "setup_bytes_read": read_set_up,
        "first_batch_bytes_read": _rchar() - read_before,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=1024, help="train shards generated")
    parser.add_argument("--samples", type=int, default=128, help="samples per shard")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8, help="each rank's batch")
    parser.add_argument("--levels", nargs="+", default=["default", "sizes", "quick", "full"])
    parser.add_argument("--worlds", nargs="+", type=int, default=[1, 8], help="world sizes (timed as rank 0)")
    parser.add_argument("--cold", action="store_true", help="evict the shards from the page cache first")
    parser.add_argument("--data-dir", type=Path, help="reuse (or create) the dataset here")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--one", nargs=4, metavar=("DIR", "LEVEL", "WORLD", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        directory, level, world, batch = args.one
        print(json.dumps(measure(directory, level, int(world), int(batch))))
        return

    with tempfile.TemporaryDirectory() as tmp:
        directory = args.data_dir or Path(tmp) / "generated"
        start = time.perf_counter()
        if not (directory / "manifest.json").is_file():
            generate(directory, args.shards, args.samples, args.seq_len)
        generated_s = time.perf_counter() - start
        shard_bytes = sum(p.stat().st_size for p in directory.glob("*.tar"))
        rows = []
        for world in args.worlds:
            for level in args.levels:
                if args.cold:
                    evict(directory)
                one = [
                    sys.executable,
                    __file__,
                    "--one",
                    str(directory),
                    level,
                    str(world),
                    str(args.batch_size),
                ]
                out = subprocess.run(one, check=True, capture_output=True, text=True, env=_env()).stdout
                rows.append(json.loads(out.strip().splitlines()[-1]))
    result = {
        "shards": args.shards + 2,
        "train_shards": args.shards,
        "shard_bytes": shard_bytes,
        "seq_len": args.seq_len,
        "samples_per_shard": args.samples,
        "cold": args.cold,
        "generate_s": generated_s,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{args.shards} train shards, {shard_bytes / 1e9:.2f} GB, {'cold' if args.cold else 'warm'} page cache"
    )
    for row in rows:
        print(
            f"world {row['world']:>2}, verify {row['level']} ({row['verify']}): set-up {row['setup_s']:.3f} s "
            f"reading {row['setup_bytes_read'] / 1e6:,.1f} MB; first batch at {row['first_batch_s']:.3f} s"
        )


def _env() -> dict[str, str]:
    # the code measured is the one on PYTHONPATH when given (an older tree), else this checkout's
    path = os.environ.get("PYTHONPATH") or str(ROOT)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


if __name__ == "__main__":
    main()
