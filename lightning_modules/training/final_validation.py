"""A validation at the last optimizer step of every fit.

Lightning validates every `trainer.val_check_interval` steps, so a run whose length is not a multiple of the
interval (every budget-derived length: each attention costs different FLOPs per token) ends without a
validation at its last step, and its validation curve stops short of its final state. Analyses that compare
curves at the end (tokens to a baseline's final loss, loss at equal tokens: lightning_modules/analysis/) then
read a "final" validation loss that is not final.

Lightning runs a validation after a step at which `trainer.should_stop` is set (the early-stopping path of its
training epoch loop), once, also when that step is a regular validation step. Setting it at the last step
asks for exactly that validation and changes nothing else: the fit ends at that step anyway.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback


class ValidateLastStep(Callback):
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        last = trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step
        if last and trainer.enable_validation:
            trainer.should_stop = True
