"""Check every shard against manifest.json: present, sha256, readable tar, sample/token counts, ids < vocab.

    python -m lightning_modules verify artifacts/shakespeare [--quick]

Exit 0 when everything agrees; otherwise 1 with one line per bad shard ("<path>: <what is wrong>"), or one
`lightning_modules.commands.verify: error: ...` line when manifest.json itself cannot be read.
--quick checks presence, sha256 and the tar's member count without decoding the samples.
The checks are in data/verification.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from data.verification import verify_folder
from lightning_modules.core.errors import run_entry


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_modules verify", description=__doc__.split("\n")[0]
    )
    parser.add_argument("directory", type=Path, help="folder holding manifest.json")
    parser.add_argument("--quick", action="store_true", help="sha256 and sample counts only")
    args = parser.parse_args(argv)
    return run_entry(lambda: verify_folder(args.directory, args.quick), "lightning_modules verify", code=1)
