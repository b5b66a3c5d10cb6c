"""python -m lightning_modules study-worker --run-id ID --checkpoint-dir DIR --every N [--resume CKPT]
[--runner-pid PID] -- ARGS: one study run in its own process (lightning_modules/study/worker.py). The study
runner starts it; ARGS are main.py's, without the subcommand."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightning_modules.study.worker import PROG, WorkerOptions, run


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog=PROG)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--checkpoint-dir", required=True, type=Path)
    parser.add_argument("--every", type=int, required=True, help="optimizer steps between checkpoints")
    parser.add_argument("--resume", type=Path, default=None, help="checkpoint to resume from")
    parser.add_argument("--runner-pid", type=int, default=None, help="die with this process (the runner)")
    args = parser.parse_args(argv[:split])
    options = WorkerOptions(args.run_id, args.checkpoint_dir, args.every, args.resume, args.runner_pid)
    return run(options, argv[split + 1 :])
