"""`python -m lightning_modules consolidate <dir.ckpt> [out.ckpt]`: a one-file checkpoint from a sharded one.

What is kept and why: lightning_modules/checkpoint/consolidation.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning_modules.checkpoint.consolidation import write_consolidated
from lightning_modules.core.errors import run_entry

PROG = "python -m lightning_modules consolidate"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path, help="a checkpoint directory written by an FSDP run")
    parser.add_argument("output", type=Path, nargs="?", help="default: <folder>.consolidated.ckpt")
    args = parser.parse_args(argv)
    return run_entry(lambda: print(write_consolidated(args.folder, args.output)), "consolidate")
