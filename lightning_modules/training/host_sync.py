"""Which training steps read a value back from the device, and the non-finite loss watch that reads on them.

Reading a device value on the host (`bool(tensor)`, `.item()`, torch.cuda.synchronize) waits for every kernel
queued before it. Done every step, that keeps the host from queueing step n + 1 while the device still runs
step n, so eager CUDA training pays each step's launch latency in full. Lightning itself reads the logged
metrics back only on the steps it logs (every trainer.log_every_n_steps, and the last): those are the steps
where reading ours costs nothing more, so they are the default cadence of the checks here and of
throughput.ThroughputMonitor.

Under several ranks the check is a collective on those steps: each rank's first bad loss is gathered, so every
rank stops at the same step with the same error. A rank that stopped alone would leave the others waiting in
the next gradient all-reduce until the process group's timeout.
"""

from __future__ import annotations

from collections.abc import Callable

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

    def record(self, device: torch.device) -> Tensor:
        """This rank's (step, batch index, loss) of its first non-finite loss as one float64 (3,) tensor on
        `device`, step -1 when there was none; no host sync. float64 holds the int steps and the float32
        loss exactly, so one collective carries all three."""
        if self._where is None or self._loss is None:
            return torch.tensor([-1.0, -1.0, 0.0], dtype=torch.float64, device=device)
        return torch.cat([self._where.double(), self._loss.double().reshape(1)]).to(device)

    def first_bad(
        self, device: torch.device | None = None, gather: Callable[[Tensor], Tensor] | None = None
    ) -> tuple[int, int, int, float] | None:
        """(step, rank, batch index, loss) of the first non-finite loss observed, or None: one host sync.
        With `gather` (one rank's (3,) record -> every rank's, (world, 3), in rank order: a collective every
        rank must enter) the answer is the earliest bad step of any rank, the lowest such rank on a tie, and
        the same on every rank."""
        if device is None:
            device = self._where.device if self._where is not None else torch.device("cpu")
        local = self.record(device)
        rows = (gather(local) if gather is not None else local).reshape(-1, 3).tolist()
        bad = [
            (int(step), rank, int(batch), loss) for rank, (step, batch, loss) in enumerate(rows) if step >= 0
        ]
        return min(bad) if bad else None
