"""Send the MLflow calls a run could not send (its tracking store was away at the end) into the run.

    python -m lightning_modules replay checkpoints/<run>/mlflow-pending-<run id>.jsonl
        [--tracking-uri URI]   # default: the store the run logged to (the file's header)
        [--run-id ID]          # default: the run each call was for

The calls go in their original order and the file (and its kept artifacts) is removed once all are in. A
call sent twice is stored once (lightning_modules/tracking/buffer.py), so a replay cut short can simply be
run again, with the same options: it resumes from the first call not yet sent. The options redirect this
replay only; the file is never rewritten with them. The file is checked whole first: a damaged line, or an
artifact path outside the file's own artifacts folder, is refused with nothing sent or deleted. A last
line cut short (the run died while writing it) is reported on one warning line and the calls before it are
sent (exit 0). Exit 1: refused or not all sent (the error line says why and what to do).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightning_modules.core.errors import run_entry
from lightning_modules.tracking.replay import replay

PROG = "tracking_replay"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_modules replay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", type=Path, help="the mlflow-pending-<run id>.jsonl file a run saved")
    parser.add_argument("--tracking-uri", help="send to this store instead (this replay only)")
    parser.add_argument("--run-id", help="send every call to this run instead (this replay only)")
    args = parser.parse_args(argv)
    return run_entry(lambda: _replay(args), PROG, code=1)


def _replay(args: argparse.Namespace) -> int:
    result = replay(args.file, args.tracking_uri, args.run_id)
    if result.warning:
        print(f"{PROG}: warning: {result.warning}", file=sys.stderr)
    print(f"sent {result.sent} MLflow calls from {args.file}")
    return 0
