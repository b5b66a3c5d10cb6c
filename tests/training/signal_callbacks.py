"""A callback tests/training/test_signals.py injects through the CLI (--trainer.callbacks+=...MarkSteps): a
file per finished step, so a test can signal a fit once it has trained a few steps, without a checkpoint of
its own to watch for."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import lightning as L


class MarkSteps(L.Callback):
    """Write `<folder>/<global step>` (empty) at the end of each optimizer step."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / str(trainer.global_step)).touch()


class TermAtFirstTestBatch(L.Callback):
    """Send this process SIGTERM when the first test batch starts, as a scheduler would during a long test."""

    def on_test_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
