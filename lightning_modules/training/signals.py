"""A fit stopped by a signal ends resumable, marked in MLflow and with a non-zero exit code.

Lightning's own SIGTERM handling (its signal connector) sets `trainer.received_sigterm` and, at the end of the
step, raises a SystemExit without a code: the process exited 0, so a SLURM preemption or a `kill` looked like
success to the scheduler, while the MLflow run said FAILED and no checkpoint was written at the signal. Ctrl-C
raised KeyboardInterrupt wherever the process was: nothing was saved, and the resumed fit logged the steps
since the last checkpoint a second time.

Here main.py runs under `run_stoppable`, and while a fit trains, SIGTERM, SIGINT (Ctrl-C) and SIGUSR1 only ask
for a stop. At the end of the step that is running (after its optimiser update, the moment the checkpoint
callback saves at), every checkpoint callback saves that step: the same files, `last.ckpt` among them, that a
checkpoint every step would have written, so a rerun with `--ckpt_path .../last.ckpt` resumes exactly. That step
is logged as usual; the fit stops at the start of the next one; the MLflow run ends KILLED with the tags
`stopped_by` and `stopped_at_step` (docs/tracking.md); the process prints one line naming the checkpoint to
resume from and exits 128 + the signal's number: 143 (SIGTERM), 130 (SIGINT), 138 (SIGUSR1).

- A second Ctrl-C stops at once (exit 130), without waiting for the step's checkpoint; the one line names the
  newest checkpoint in place. Like a SIGKILL, it gives up the first Ctrl-C's guarantee: a fit resumed from an
  older checkpoint logs again the steps after it.
  A second SIGTERM or SIGUSR1 is ignored: a scheduler or a launcher may deliver one signal more than once.
- Before training starts (parsing, building the model, restoring a checkpoint) a signal stops at once: there is
  no newer state to save. After the last step the fit has done its work: a signal is noted and the run ends
  FINISHED, exit 0. validate and test stop at once, exit 128 + the signal's number.
- SIGUSR1 is this module's under SLURM too: it is the warning scripts/slurm/train.sbatch asks SLURM for
  before the time limit, and the script requeues the job when the fit it forwarded the warning to has stopped
  (exit 138). Lightning's own requeue on SIGUSR1 (SLURMEnvironment's auto_requeue) would save in the middle of
  a step, from inside the handler, after ending the loggers' runs FINISHED, and go on training until killed; it
  installs its handler only where none is installed, so with this one in place it never runs.
- Lightning installs its SIGTERM handler when the fit starts, wrapping the one installed here; at the start of
  training the one here takes SIGTERM back (until then it stops at once, so Lightning's end-of-step SystemExit
  never runs), and Lightning's teardown puts the one here back.
- Data loader workers are forked after these handlers are installed and inherit them, which ignore a signal in
  any process but the one that installed them: Ctrl-C reaches the whole foreground process group, and a worker
  that died of it would end the fit with a loader error instead of a checkpoint.
- Several ranks agree at every step (the largest signal number any rank received), so all of them save and stop
  at the same step whichever rank got the signal.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info

from lightning_modules.core import errors
from lightning_modules.core.lightning_api import last_saved_step, save_now
from lightning_modules.tracking.logger import BufferedMLFlowLogger


def exit_code(signum: int) -> int:
    """The shell's convention for a process ended by a signal: 143 for SIGTERM, 130 for SIGINT, 138 for SIGUSR1."""
    return 128 + signum


class Stopped(BaseException):
    """The process was asked to stop by a signal. A BaseException, as KeyboardInterrupt is, so that no
    `except Exception` on the way (a store retry, a loader) swallows it."""

    def __init__(
        self, signum: int, step: int | None = None, checkpoint: str | None = None, at_once: bool = False
    ) -> None:
        self.signum, self.step, self.checkpoint, self.at_once = signum, step, checkpoint, at_once
        super().__init__(self.message())

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    def message(self) -> str:
        if self.at_once:
            after = f" after step {self.step}" if self.step is not None else ""
            newest = (
                f"the newest checkpoint is {self.checkpoint}: resume with --ckpt_path {self.checkpoint}"
                if self.checkpoint
                else "resume from the newest checkpoint, if any"
            )
            return f"stopped at once by a second Ctrl-C{after}, without waiting for a checkpoint; {newest}"
        if self.step is None:
            return (
                f"stopped by {self.name} outside a training step: nothing new to save; run the command again"
            )
        if self.checkpoint is None:
            return f"stopped by {self.name} after step {self.step}: no checkpoint callback, nothing saved"
        return (
            f"stopped by {self.name} after step {self.step}: saved {self.checkpoint}; resume with "
            f"--ckpt_path {self.checkpoint}"
        )


@dataclass
class _State:
    """The handlers of one run_stoppable, in the process that installed them."""

    pid: int
    signals: tuple[int, ...]
    previous: dict[int, Any] = field(default_factory=dict)
    # "before" training: stop at once; "training": at the step's end; "after" the last step: note only
    phase: str = "before"
    received: int | None = None


_STATE: _State | None = None


def _handle(signum: int, frame: FrameType | None) -> None:
    state = _STATE
    if state is None or os.getpid() != state.pid:
        return  # a loader worker forked from the fit: the process that installed this decides
    if state.phase == "before":
        raise Stopped(signum)
    if state.received is None:
        state.received = signum  # acted on at the step's end (StopOnSignal); nothing is printed here, since
        return  # a write to stderr from a handler can land inside another and fail as a reentrant call
    if signum == signal.SIGINT:  # a second Ctrl-C: a person who will not wait for the step's end
        raise Stopped(signum, at_once=True)


def stop_signals() -> tuple[int, ...]:
    """SIGTERM, SIGINT and SIGUSR1, under SLURM too (the module docstring says why not Lightning's requeue)."""
    return (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


@contextmanager
def handling(signals: tuple[int, ...] | None = None) -> Iterator[_State]:
    """Install the handlers for the duration of the block (main thread only; the previous ones come back)."""
    global _STATE
    state = _State(os.getpid(), signals if signals is not None else stop_signals())
    state.previous = {s: signal.signal(s, _handle) for s in state.signals}
    _STATE = state
    try:
        yield state
    finally:
        for signum, handler in state.previous.items():
            signal.signal(signum, handler)
        _STATE = None


def run_stoppable(fn: Callable[[], int], prog: str) -> int:
    """Run an entry point's body with the handlers installed; a stop by signal ends in one line on stderr and
    128 + the signal's number."""
    with handling():
        try:
            return fn()
        except Stopped as stop:
            sys.stdout.flush()
            errors.report(stop, prog)
            return exit_code(stop.signum)


class StopOnSignal(L.Callback):
    """The fit's side of run_stoppable (the CLI adds it to every fit): save at the step's end, stop before the
    next, mark the MLflow run. Without run_stoppable's handlers (a fit started from Python) it does nothing."""

    def __init__(self) -> None:
        self._stop: Stopped | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = _STATE
        if state is None or os.getpid() != state.pid:
            return
        for signum in state.signals:  # take them back from Lightning's signal connector (module docstring)
            signal.signal(signum, _handle)
        state.phase = "training"

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self._stop is not None or _STATE is None or _STATE.phase != "training":
            return
        signum = _agreed(trainer, _STATE.received)
        if not signum:
            return
        saved = []
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint):
                if last_saved_step(callback) != trainer.global_step:
                    save_now(callback, trainer)
                saved.append(callback.last_model_path or callback.best_model_path)
        saved = [path for path in saved if path]
        # Named last: the callback a user adds (--trainer.callbacks+=) comes after conf/base.yaml's.
        self._stop = Stopped(signum, trainer.global_step, saved[-1] if saved else None)
        where = ", ".join(saved) or "no checkpoint callback"
        rank_zero_info(f"{self._stop.name} received: step {trainer.global_step} saved ({where}); stopping")

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self._stop is not None:
            raise self._stop

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if _STATE is not None and _STATE.phase == "training":
            _STATE.phase = "after"
            if self._stop is not None:
                rank_zero_info(f"{self._stop.name} arrived in the last step: the fit has done all its steps")

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Before Lightning ends the loggers' runs as failed: a stop by signal ends them KILLED."""
        if not isinstance(exception, Stopped):
            return
        step = exception.step if exception.step is not None else trainer.global_step
        if exception.at_once and self._stop is not None:  # the step's checkpoint was saved already
            exception.at_once, exception.step, exception.checkpoint = (
                False,
                self._stop.step,
                self._stop.checkpoint,
            )
        elif exception.at_once:
            exception.step, exception.checkpoint = step, _newest_checkpoint(trainer)
        exception.args = (exception.message(),)
        for logger in trainer.loggers:
            if isinstance(logger, BufferedMLFlowLogger):
                logger.mark_stopped(exception.name, step)


def _agreed(trainer: L.Trainer, received: int | None) -> int:
    """The signal to stop for, the same on every rank: the largest number any rank received (0: none)."""
    if trainer.world_size == 1:
        return received or 0
    local = torch.tensor(received or 0, device=trainer.strategy.root_device)
    return int(trainer.strategy.reduce(local, reduce_op="max").item())


def _newest_checkpoint(trainer: L.Trainer) -> str | None:
    """The newest checkpoint file any checkpoint callback has in place (a file under its name is whole: Lightning
    writes to a temporary file and renames it), whichever step it holds."""
    paths = set()
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint):
            paths.update([callback.last_model_path, callback.best_model_path, *callback.best_k_models])
    written = [Path(p) for p in paths if p and Path(p).exists()]
    return str(max(written, key=lambda p: p.stat().st_mtime_ns)) if written else None
