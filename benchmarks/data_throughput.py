"""Data pipeline speed on this machine: prepare's MB/s of text, and the train loader's tokens/s.

    python benchmarks/data_throughput.py                       # Shakespeare, 2 workers, batch 16
    python benchmarks/data_throughput.py --json --model-tokens-per-s 4000

prepare is timed twice on the embedded Shakespeare corpus: once training the BPE tokenizer (what `make data`
runs) and once loading that tokenizer (encoding, packing and writing only). The loader is the
ShardDataModule's train loader with --num-workers workers, as training would use it: tokens/s counts target
tokens (batch x seq_len) delivered to the caller after a warm-up, across epoch boundaries (whose worker
restarts are included). The ratio to --model-tokens-per-s (the nano model's training speed here) says how
far data is from limiting training; the target is >= 20x.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from data.build import prepare
from data.datamodule import ShardDataModule
from data.prepare_config import PrepareConfig


def time_prepare(out: Path, tokenizer: str | None) -> tuple[float, int]:
    config = PrepareConfig(out=out, source="shakespeare", tokenizer=tokenizer, progress=False)
    start = time.perf_counter()
    manifest = prepare(config)
    seconds = time.perf_counter() - start
    return seconds, sum(split.text_bytes for split in manifest.splits.values())


def time_loader(
    directory: Path, batch_size: int, workers: int, warmup: int, batches: int
) -> dict[str, float]:
    dm = ShardDataModule(str(directory), batch_size=batch_size, num_workers=workers, seed=0)
    start = time.perf_counter()
    dm.setup("fit")  # the check before a real run, at data.verify's default level
    verify_seconds = time.perf_counter() - start
    loader = dm.train_dataloader()
    seen, timed_from = 0, None
    while seen < warmup + batches:
        for _ in loader:
            seen += 1
            if seen == warmup:
                timed_from = time.perf_counter()
            if seen == warmup + batches:
                break
    assert timed_from is not None
    seconds = time.perf_counter() - timed_from
    return {
        "verify_s": verify_seconds,
        "batches": batches,
        "seconds": seconds,
        "tokens_per_s": batches * batch_size * dm.seq_len / seconds,
        "batches_per_epoch": len(loader),
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-tokens-per-s", type=float, default=4000.0, help="nano model training speed")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=50, help="batches before timing starts")
    parser.add_argument("--batches", type=int, default=2000, help="batches timed (spans several epochs)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        trained_s, text_bytes = time_prepare(Path(tmp) / "trained", None)
        loaded_s, _ = time_prepare(Path(tmp) / "loaded", str(Path(tmp) / "trained" / "tokenizer.json"))
        loader = time_loader(
            Path(tmp) / "trained", args.batch_size, args.num_workers, args.warmup, args.batches
        )
    result = {
        "cpu": cpu_name(),
        "prepare_text_mb": text_bytes / 1e6,
        "prepare_train_tokenizer_s": trained_s,
        "prepare_train_tokenizer_mb_per_s": text_bytes / 1e6 / trained_s,
        "prepare_loaded_tokenizer_s": loaded_s,
        "prepare_loaded_tokenizer_mb_per_s": text_bytes / 1e6 / loaded_s,
        "loader_batch_size": args.batch_size,
        "loader_workers": args.num_workers,
        "loader_verify_s": loader["verify_s"],
        "loader_tokens_per_s": loader["tokens_per_s"],
        "model_tokens_per_s": args.model_tokens_per_s,
        "loader_vs_model": loader["tokens_per_s"] / args.model_tokens_per_s,
        "loader_batches_timed": loader["batches"],
        "loader_batches_per_epoch": loader["batches_per_epoch"],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"machine: {result['cpu']}")
    print(
        f"prepare, Shakespeare ({result['prepare_text_mb']:.2f} MB of text): "
        f"{result['prepare_train_tokenizer_mb_per_s']:.2f} MB/s training the tokenizer "
        f"({trained_s:.1f} s), {result['prepare_loaded_tokenizer_mb_per_s']:.2f} MB/s with it loaded ({loaded_s:.1f} s)"
    )
    print(
        f"train loader, batch {args.batch_size}, {args.num_workers} workers: "
        f"{result['loader_tokens_per_s']:,.0f} tokens/s over {args.batches} batches "
        f"= {result['loader_vs_model']:.0f}x the model's {args.model_tokens_per_s:,.0f} tokens/s "
        f"(target >= 20x); shard verification before training {loader['verify_s']:.2f} s"
    )


if __name__ == "__main__":
    main()
