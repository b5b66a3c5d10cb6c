"""Send the MLflow calls a run could not send (its tracking store was away at the end) into the run.

    python -m lightning_modules.tracking_replay checkpoints/<run>/mlflow-pending-<run id>.jsonl
        [--tracking-uri URI]   # default: the store the run logged to (the file's header)
        [--run-id ID]          # default: the run each call was for

The calls go in their original order and the file (and its kept artifacts) is removed once all are in. A
call sent twice is stored once (lightning_modules/tracking/buffer.py), so a replay cut short can simply be
run again: it resumes from the first call not yet sent.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightning_modules.tracking.buffer import PendingFileError
from lightning_modules.tracking.replay import replay


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_modules.tracking_replay", description=__doc__)
    parser.add_argument("file", type=Path, help="the mlflow-pending-<run id>.jsonl file a run saved")
    parser.add_argument("--tracking-uri", help="the store to send to (default: the one in the file)")
    parser.add_argument("--run-id", help="send every call to this run instead")
    args = parser.parse_args(argv)
    try:
        sent = replay(args.file, args.tracking_uri, args.run_id)
    except PendingFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"sent {sent} MLflow calls from {args.file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
