"""Lightning's ModelCheckpoint, plus a checkpoint at the end of fit.

With `every_n_train_steps`, Lightning saves only on multiples of N: a run whose budget ends between two of
them would lose its final state (its `last.ckpt` would be the step-N one). This subclass also saves when
fit ends normally on a step not yet saved. Runs stopped by an exception (a non-finite loss) save nothing,
so the last good checkpoint stays the newest.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint as _LightningModelCheckpoint


class EndOfFitModelCheckpoint(_LightningModelCheckpoint):
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step > 0 and self._last_global_step_saved != trainer.global_step:
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
        super().on_train_end(trainer, pl_module)
