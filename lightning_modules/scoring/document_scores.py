"""The loss of every document of a split under one decoder (lightning_modules/analysis/documents.py uses them).

The split is read in order through the training DataModule (data/datamodule.py) and every target token's
cross-entropy is kept (in fp32, as the study's protocols train and evaluate): summed per document, the sums over
all documents divided by the split's tokens is the run's logged test or validation loss. The command
(lightning_modules/scoring/documents_report.py) loads each decoder from its checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from data.datamodule import ShardDataModule
from lightning_modules.analysis.documents import document_ids, per_document
from lightning_modules.core.errors import UserError

LOADERS = {"test": ("test", "test_dataloader"), "val": ("validate", "val_dataloader")}


class ScoreError(UserError):
    """A checkpoint or data folder that cannot be scored; the message names it."""


def data_dir_of(checkpoint: dict[str, Any], path: Path) -> str:
    """The shards a training checkpoint's run read (its DataModule's hyper-parameters)."""
    try:
        return str(checkpoint["datamodule_hyper_parameters"]["data_dir"])
    except (KeyError, TypeError):
        raise ScoreError(
            f"{path}: no datamodule data_dir in the checkpoint; score a checkpoint written by fit"
        ) from None


@torch.no_grad()
def score_documents(
    model: torch.nn.Module, data_dir: str, splits: tuple[str, ...] = ("test", "val"), batch_size: int = 16,
    progress: Callable[[int], None] | None = None,
) -> pd.DataFrame:  # fmt: skip
    """Per document of each split: `split`, `document`, `tokens`, `loss_sum` (nats). `progress` is called with
    the number of samples of each batch scored."""
    dm = ShardDataModule(data_dir, batch_size=batch_size, num_workers=0, verify="quick")
    frames = []
    for split in splits:
        if split not in LOADERS:
            raise ScoreError(f"split {split!r}: allowed are {', '.join(LOADERS)}")
        stage, loader = LOADERS[split]
        dm.setup(stage)
        samples, losses = [], []
        for batch in getattr(dm, loader)():
            logits = model(batch[:, :-1])
            nats = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten(), reduction="none")
            samples.append(batch.numpy())
            losses.append(nats.view(batch.shape[0], -1).numpy())
            if progress is not None:
                progress(len(batch))
        if not samples:
            raise ScoreError(f"{data_dir}: the {split} split is empty; nothing to score")
        table = per_document(
            np.concatenate(losses), document_ids(np.concatenate(samples), dm.manifest.eot_id)
        )
        frames.append(table.assign(split=split))
    return pd.concat(frames, ignore_index=True)[["split", "document", "tokens", "loss_sum"]]
