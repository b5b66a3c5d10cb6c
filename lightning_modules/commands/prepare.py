"""Text / JSONL / Parquet (or the embedded Shakespeare) -> tokenizer + WebDataset shards + manifest.json.

    python -m lightning_modules prepare --source shakespeare --out artifacts/shakespeare
    python -m lightning_modules prepare corpus/ extra.jsonl --vocab-size 8192 --seq-len 1024 --out artifacts/mine
    python -m lightning_modules prepare fineweb/*.parquet --tokenizer tokenizer.json --out artifacts/fineweb

The command line only: the preparation itself is data/build.py (one process) or, with --tasks N,
data/distributed_prepare.py (datatrove); its options are data/prepare_config.py's PrepareConfig.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from data.build import run
from data.parallel_options import add_arguments, options_from
from data.prepare_config import DEFAULT_VOCAB, PrepareConfig
from data.tokenizer import EOT_TOKEN
from lightning_modules.core.errors import run_entry


def parse_args(argv: Sequence[str] | None) -> PrepareConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    return config_from(parser, args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lightning_modules prepare", description=__doc__.split("\n")[0]
    )
    _add_input_arguments(p)
    _add_dataset_arguments(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="build into an --out that holds other files (they are kept; only a previous dataset's files are replaced)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_arguments(p)
    return p


def _add_input_arguments(p: argparse.ArgumentParser) -> None:
    """What to read: inputs, the output folder, the tokenizer."""
    p.add_argument("inputs", nargs="*", help="files or folders of .txt / .jsonl / .parquet")
    p.add_argument("--source", choices=["shakespeare"], help="embedded corpus instead of input files")
    p.add_argument("--out", required=True, type=Path, help="output folder (shards, tokenizer, manifest)")
    p.add_argument(
        "--vocab-size", type=int, help=f"train a byte-level BPE of this size (default {DEFAULT_VOCAB})"
    )
    p.add_argument("--tokenizer", help="load this tokenizer.json instead of training one")
    p.add_argument("--eot-token", default=EOT_TOKEN, help="end-of-text token (default %(default)s)")


def _add_dataset_arguments(p: argparse.ArgumentParser) -> None:
    """How to cut it: sample length, split fractions, shard size, and how to read each kind of file."""
    p.add_argument(
        "--seq-len", type=int, default=256, help="tokens per sample are seq-len + 1 (default %(default)s)"
    )
    p.add_argument(
        "--val-frac", type=float, default=0.03, help="fraction of documents for val (default %(default)s)"
    )
    p.add_argument(
        "--test-frac", type=float, default=0.03, help="fraction of documents for test (default %(default)s)"
    )
    p.add_argument(
        "--shard-samples",
        type=int,
        default=1024,
        help="samples per shard, bounds its size (default %(default)s)",
    )
    p.add_argument("--text-field", default="text", help="JSONL field holding the text")
    p.add_argument("--text-column", default="text", help="Parquet column holding the text")
    p.add_argument(
        "--errors",
        choices=["strict", "replace"],
        default="strict",
        help="non-UTF-8 input: stop (default) or substitute U+FFFD",
    )
    p.add_argument(
        "--txt-doc-chars",
        type=int,
        help="split .txt files at blank lines into ~N-char documents (default: 0, one document per file; 8192 for shakespeare)",
    )


def config_from(parser: argparse.ArgumentParser, a: argparse.Namespace) -> PrepareConfig:
    return PrepareConfig(
        out=a.out,
        inputs=a.inputs,
        source=a.source,
        vocab_size=a.vocab_size,
        tokenizer=a.tokenizer,
        eot_token=a.eot_token,
        seq_len=a.seq_len,
        val_frac=a.val_frac,
        test_frac=a.test_frac,
        shard_samples=a.shard_samples,
        text_field=a.text_field,
        text_column=a.text_column,
        errors=a.errors,
        txt_doc_chars=a.txt_doc_chars,
        force=a.force,
        progress=not a.no_progress,
        parallel=options_from(parser, a),
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    if cfg.parallel is not None:  # the datatrove path
        # late: datatrove is heavy and needed only with --tasks
        from data.distributed_prepare import run_distributed

        return run_entry(lambda: run_distributed(cfg, cfg.parallel), "lightning_modules prepare", code=1)
    return run_entry(lambda: run(cfg), "lightning_modules prepare", code=1)
