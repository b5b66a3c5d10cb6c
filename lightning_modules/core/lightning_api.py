"""The Lightning internals the project relies on, in one place (docs/architecture.md).

Lightning offers no public API for these, and each has a reason:
- a ModelCheckpoint that also saves at the end of fit must ask for a save the way the callback does itself
  (lightning_modules/checkpoint/callback.py): `_monitor_candidates`, `_save_topk_checkpoint`, `_save_last_checkpoint`, and
  `_last_global_step_saved` to know whether this step is already saved;
- the step number Lightning gives a training step's metrics when it logs them
  (`fit_loop.epoch_loop._batches_that_stepped`): a checkpoint saved inside a step is written before that step's
  metrics are logged, so the checkpoint carries them under that number (lightning_modules/training/language_model.py);
- a sharded (ModelParallelStrategy) checkpoint is a directory; its non-tensor state (the MLflow run id) sits
  in Lightning's metadata file (`_METADATA_FILENAME`, lightning_modules/training/cli.py), and gathering the shards into one file uses
  Lightning's own loader (`_load_distributed_checkpoint`, consolidate.py).

Choice: these are gathered here, and tests/core/test_lightning_api.py checks each one's existence, signature and
behaviour against the installed Lightning, so an upgrade that changes them fails that test, naming the API,
instead of failing mid-run. The dependency stays `lightning>=2.5,<3` rather than pinned to one minor
release: a pin would block Lightning's fixes for everyone, while the test tells exactly which internal moved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.utilities.load import _METADATA_FILENAME, _load_distributed_checkpoint
from lightning.pytorch.callbacks import ModelCheckpoint

METADATA_FILENAME: str = _METADATA_FILENAME  # the non-tensor state of a sharded checkpoint directory


def last_saved_step(callback: ModelCheckpoint) -> int:
    """The global step of the callback's latest save."""
    return callback._last_global_step_saved


def save_now(callback: ModelCheckpoint, trainer: L.Trainer) -> None:
    """Save as the callback does at a save point: its top-k checkpoint and, if configured, last.ckpt."""
    candidates = callback._monitor_candidates(trainer)
    callback._save_topk_checkpoint(trainer, candidates)
    callback._save_last_checkpoint(trainer, candidates)


def log_step(trainer: L.Trainer) -> int:
    """The step under which Lightning logs the current training step's metrics; it moves on only after
    they are logged (and after any validation of that step)."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def load_sharded_checkpoint(folder: Path) -> dict[str, Any]:
    """A sharded checkpoint directory gathered into one checkpoint dict in CPU memory."""
    return _load_distributed_checkpoint(folder)
