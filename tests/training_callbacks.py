"""Callbacks that tests inject through the CLI (--trainer.callbacks+=tests.training_callbacks.X)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch


class StopAtStep(L.Callback):
    """Stop fit after `step` optimizer steps, as an interrupted run would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


class PoisonAtStep(L.Callback):
    """Make the weights non-finite once `step` optimizer steps are done, so the next loss is NaN."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.model.head.weight.fill_(float("nan"))


# What AtStep calls, by name: a test puts its own functions here (stop a server, look into a run...).
ACTIONS: dict[str, Callable[[L.Trainer], None]] = {}


class AtStep(L.Callback):
    """Call ACTIONS[action](trainer) once, when `step` optimizer steps are done."""

    def __init__(self, step: int, action: str) -> None:
        self.step, self.action = step, action

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            ACTIONS[self.action](trainer)
