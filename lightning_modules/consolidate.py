"""A one-file checkpoint from a sharded one: python -m lightning_modules.consolidate <dir.ckpt> [out.ckpt]

FSDP runs (conf/strategy/fsdp.yaml, hybrid-fsdp.yaml) save each checkpoint as a directory of per-rank shards
plus Lightning's meta.pt (docs/architecture.md, "Scale"); they resume from it on any world size that
divides the data slices (README "Elastic resume"); this reads shards written by any world size. Everything that
reads a checkpoint file on one device (test / validate without FSDP, lightning_modules.generate, the
analysis) takes the consolidated file: full weights, hyper-parameters, compute counters, the MLflow run id.
Optimiser states are left out: they are keyed by parameter name for FSDP and would not restore into a
single-device optimiser; a training run resumes from the directory. Lightning's own
`lightning.pytorch.utilities.consolidate_checkpoint` reads FSDPStrategy's layout, not ModelParallelStrategy's.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from lightning_modules.lightning_api import load_sharded_checkpoint


def consolidate(folder: str | Path) -> dict[str, Any]:
    """The checkpoint dict of a sharded checkpoint directory, gathered in CPU memory, without optimiser
    states."""
    folder = Path(folder)
    if not (folder.is_dir() and (folder / ".metadata").is_file()):
        raise FileNotFoundError(f"{folder}: not a sharded checkpoint directory (no .metadata inside)")
    checkpoint = load_sharded_checkpoint(folder)
    for key in [k for k in checkpoint if k.startswith("optimizer_")]:
        del checkpoint[key]
    return checkpoint


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
