"""`python -m lightning_modules.consolidate <dir.ckpt> [out.ckpt]`: a one-file checkpoint from a sharded one.

What is kept and why: lightning_modules/checkpoint/consolidate.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lightning_modules.checkpoint.consolidate import consolidate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path, help="a checkpoint directory written by an FSDP run")
    parser.add_argument("output", type=Path, nargs="?", help="default: <folder>.consolidated.ckpt")
    args = parser.parse_args(argv)
    output = args.output or args.folder.with_name(
        args.folder.name.removesuffix(".ckpt") + ".consolidated.ckpt"
    )
    torch.save(consolidate(args.folder), output)
    print(output)


if __name__ == "__main__":
    main()
