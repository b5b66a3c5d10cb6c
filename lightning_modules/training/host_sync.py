"""Which training steps read a value back from the device, and the non-finite loss watch that reads on them.

Reading a device value on the host (`bool(tensor)`, `.item()`, torch.cuda.synchronize) waits for every kernel
queued before it. Done every step, that keeps the host from queueing step n + 1 while the device still runs
step n, so eager CUDA training pays each step's launch latency in full. Lightning itself reads the logged
metrics back only on the steps it logs (every trainer.log_every_n_steps, and the last): those are the steps
where reading ours costs nothing more, so they are the default cadence of the checks here and of
throughput.ThroughputMonitor.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor

from lightning_modules.core import lightning_api


def every(trainer: L.Trainer, every_n_steps: int | None = None) -> int:
    """The cadence in optimizer steps: `every_n_steps`, else log_every_n_steps (1 where logging is off)."""
    return every_n_steps or trainer.log_every_n_steps or 1


def due(trainer: L.Trainer, every_n_steps: int | None = None) -> bool:
    """Whether this training batch belongs to an optimizer step that ends a window: its log step
    (lightning_api.log_step, counted from 0) + 1 is a multiple of the cadence, or it is the fit's last or
    stopping step. Lightning's rule for the steps it logs (its logger connector's should_update_logs), so with
    the default cadence the windows end exactly on the logged steps. Under gradient accumulation every
    micro-batch of that step is due (the log step moves on only after the step)."""
    step = lightning_api.log_step(trainer)  # this step's, in training_step and in on_train_batch_end alike
    last = trainer.max_steps is not None and 0 <= trainer.max_steps <= step + 1
    return (step + 1) % every(trainer, every_n_steps) == 0 or trainer.should_stop or last


class LossWatch:
    """Remembers, on the device, the first training step whose loss was not finite, so the host asks only
    when it syncs anyway (`first_bad`) instead of at every step."""

    def __init__(self) -> None:
        self._where: Tensor | None = None  # int64 [step, batch index]; -1 while every loss was finite
        self._loss: Tensor | None = None  # float32: that loss

    def observe(self, loss: Tensor, step: int, batch_idx: int) -> None:
        """Record `loss` of (step, batch_idx) if it is the first non-finite one; no host sync (scalars go to
        the device as kernel arguments, not as copies)."""
        loss = loss.detach().float()
        if self._where is None or self._loss is None:
            self._where = torch.full((2,), -1, dtype=torch.int64, device=loss.device)
            self._loss = torch.zeros((), device=loss.device)
        first = torch.logical_and(torch.logical_not(torch.isfinite(loss)), self._where[0] < 0)
        self._where[0].masked_fill_(first, step)
        self._where[1].masked_fill_(first, batch_idx)
        self._loss.copy_(torch.where(first, loss, self._loss))

    def first_bad(self) -> tuple[int, int, float] | None:
        """(step, batch index, loss) of the first non-finite loss observed, or None: one host sync."""
        if self._where is None or self._loss is None:
            return None
        step, batch_idx = self._where.tolist()
        return None if step < 0 else (step, batch_idx, self._loss.item())
