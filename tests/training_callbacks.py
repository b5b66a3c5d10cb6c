"""Callbacks that tests inject through the CLI (--trainer.callbacks+=tests.training_callbacks.X)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch

from lightning_modules.checkpoint.callback import EndOfFitModelCheckpoint


class StopAtStep(L.Callback):
    """Stop fit after `step` optimizer steps, as an interrupted run would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


class PoisonAtStep(L.Callback):
    """Make the weights non-finite once `step` optimizer steps are done, so the next loss is NaN: on every
    rank, or on `rank` alone."""

    def __init__(self, step: int, rank: int | None = None) -> None:
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            with torch.no_grad():
                pl_module.model.head.weight.fill_(float("nan"))


class RecordException(L.Callback):
    """Write the exception that ended the fit, its type, message and the step it stopped at, to
    `folder`/rank<r>.json on each rank."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_exception(self, trainer: L.Trainer, pl_module: Any, exception: BaseException) -> None:
        record = {"type": type(exception).__name__, "message": str(exception), "step": trainer.global_step}
        (Path(self.folder) / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


# What AtStep calls, by name: a test puts its own functions here (stop a server, look into a run...).
ACTIONS: dict[str, Callable[[L.Trainer], None]] = {}


class AtStep(L.Callback):
    """Call ACTIONS[action](trainer) once, when `step` optimizer steps are done."""

    def __init__(self, step: int, action: str) -> None:
        self.step, self.action = step, action

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            ACTIONS[self.action](trainer)


class RecordGlobalBatches(L.Callback):
    """Write, for every optimizer step, the loss of the whole global batch (mean over ranks of equal
    shares) and a digest of each of its samples in rank order, to `path` (JSON, by rank 0): what elastic
    resume must keep equal to an uninterrupted run."""

    def __init__(self, path: str) -> None:
        self.path, self.steps = path, {}

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, *args: Any
    ) -> None:
        import hashlib

        loss = outputs["loss"].detach().float().clone()
        batches = trainer.strategy.all_gather(batch)  # (world, b, T + 1), or (b, T + 1) on one rank
        loss = trainer.strategy.reduce(loss, reduce_op="mean")
        rows = batches.reshape(-1, batch.shape[-1]).cpu()
        digests = [hashlib.sha1(r.numpy().tobytes()).hexdigest()[:16] for r in rows]
        self.steps[trainer.global_step - 1] = {"loss": float(loss), "samples": digests}

    def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
        import json

        if trainer.global_rank == 0:
            with open(self.path, "w") as f:
                json.dump(self.steps, f)


class RecordEnvironment(L.Callback):
    """Write what the launch gave this rank to `path`/rank<r>.json: Lightning's cluster environment, the
    ranks, the device mesh the decoder was sharded on, and the steps trained."""

    def __init__(self, path: str) -> None:
        self.path, self.seen = path, {}

    def on_fit_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        weight = pl_module.model.blocks[0].attn_norm.weight
        self.seen = {
            "environment": type(trainer.strategy.cluster_environment).__name__,
            "global_rank": trainer.global_rank,
            "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank,
            "world_size": trainer.world_size,
            "mesh": str(getattr(weight, "device_mesh", None)),
            "placements": [str(p) for p in getattr(weight, "placements", ())],
        }

    def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
        import json
        from pathlib import Path

        self.seen["global_step"] = trainer.global_step
        Path(self.path).mkdir(parents=True, exist_ok=True)
        (Path(self.path) / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.seen))


class KillAfterSave(EndOfFitModelCheckpoint):
    """The project's checkpoint callback, which SIGKILLs its own process right after it saved step
    `kill_step`: between a step's checkpoint and the logging of that step's metrics (Lightning runs the
    checkpoint callbacks' on_train_batch_end before it logs), the moment lightning_modules/checkpoint/step_log.py covers."""

    def __init__(
        self,
        kill_step: int,
        dirpath: str,
        every_n_train_steps: int = 1,
        save_last: bool = True,
        save_top_k: int = -1,
    ) -> None:
        super().__init__(
            dirpath=dirpath,
            every_n_train_steps=every_n_train_steps,
            save_last=save_last,
            save_top_k=save_top_k,
        )
        self.kill_step = kill_step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_batch_end(trainer, *args)
        if trainer.global_step == self.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
