"""Lightning's ModelCheckpoint, plus a checkpoint at the end of fit.

With `every_n_train_steps`, Lightning saves only on multiples of N: a run whose budget ends between two of
them would lose its final state (its `last.ckpt` would be the step-N one). This subclass also saves when
fit ends normally on a step not yet saved. Runs stopped by an exception (a non-finite loss) save nothing,
so the last good checkpoint stays the newest. A fit stopped by a signal (SIGTERM, Ctrl-C) saves the step it
was in through the same save as here, `save_now` (lightning_modules/training/signals.py).
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_modules.core.lightning_api import last_saved_step, save_now


class EndOfFitModelCheckpoint(ModelCheckpoint):
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step > 0 and last_saved_step(self) != trainer.global_step:
            save_now(self, trainer)
        super().on_train_end(trainer, pl_module)
