"""A one-file checkpoint from a sharded one (the command: python -m lightning_modules.consolidate <dir.ckpt> [out.ckpt]).

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

from pathlib import Path
from typing import Any

from lightning_modules.core.lightning_api import load_sharded_checkpoint


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
