"""python -m lightning_modules score-documents results/<protocol> --checkpoints DIR [--out DIR] [--batch-size N]:
every document's loss under every run's final checkpoint, and each pair's document standard error beside its
seed standard error (lightning_modules/scoring/documents_report.py says what is read and written)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightning_modules.core import errors
from lightning_modules.scoring.documents_report import PROG, score_ledger


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument(
        "ledger", type=Path, help="a results folder with runs.csv and pairs.csv (results/<protocol>)"
    )
    parser.add_argument(
        "--checkpoints", type=Path, required=True, help="the runner's checkpoint folder of the study"
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for the outputs (default: the ledger)")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per forward pass (default 16)")
    args = parser.parse_args(argv)
    try:
        text = score_ledger(
            args.ledger, args.checkpoints, args.out, args.batch_size, sys.argv[1:] if argv is None else argv
        )
    except (errors.UserError, ValueError, OSError) as e:
        errors.report(e, PROG)
        return 2
    print(text, end="")
    return 0
