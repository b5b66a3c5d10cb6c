"""The metrics of a training step that a checkpoint saved inside that step carries, logged on resume.

Lightning saves a step's checkpoint in on_train_batch_end, before its logger connector logs that step's
metrics. A process killed between the two leaves a checkpoint that resumes after a step whose `train/loss`
never reached the run: the run's curve has a hole there (scripts/fault_injection.py found one in 20 kills).
So a checkpoint written before its step is logged carries that step's metrics, and a fit resumed from it
logs those the run lacks at that step. It checks first: MLflow keeps every (key, step, timestamp, value) it
is sent, so logging blindly would show the step twice whenever the process had logged it before dying.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning as L
from lightning.pytorch.loggers import Logger, MLFlowLogger
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from lightning_modules.core import lightning_api

CHECKPOINT_KEY = "unlogged_step"


@dataclass
class StepMetrics:
    """What one training step gave its logger, and the step Lightning logs it under."""

    step: int
    values: dict[str, Tensor | float]


def _logs(trainer: L.Trainer, step: int) -> bool:
    """Whether Lightning logs this step at all (its own rule: every n-th step, and a stopping one)."""
    every = trainer.log_every_n_steps
    return every > 0 and ((step + 1) % every == 0 or trainer.should_stop)


def pending_record(trainer: L.Trainer, last: StepMetrics | None) -> dict[str, Any] | None:
    """What a checkpoint saved now must carry: the last step's metrics while Lightning has not logged them
    (the save is inside that step: still training, and Lightning's log step has not moved on), else None.
    Plain ints and floats, so the checkpoint still loads with torch.load(weights_only=True)."""
    if last is None or not trainer.training or last.step != lightning_api.log_step(trainer):
        return None
    if not _logs(trainer, last.step):
        return None
    metrics = {key: float(value) for key, value in last.values.items()}
    metrics.setdefault("epoch", float(trainer.current_epoch))  # Lightning adds it to every step it logs
    return {"step": last.step, "metrics": metrics}


def log_missing(logger: Logger | None, record: dict[str, Any]) -> dict[str, float]:
    """Log the record's metrics that the MLflow run lacks at the record's step; returns what was logged.
    A store that cannot be read now is a warning naming the step (nothing is logged, so nothing doubles)."""
    if not isinstance(logger, MLFlowLogger):
        return {}
    step, metrics = int(record["step"]), dict(record["metrics"])
    try:
        client = logger.experiment
        missing = {
            key: value
            for key, value in metrics.items()
            if all(m.step != step for m in client.get_metric_history(logger.run_id, key))
        }
    except Exception as error:  # any store failure: the run goes on, the hole is named
        rank_zero_warn(
            f"could not read run {logger.run_id} to check step {step}'s metrics, saved in the checkpoint "
            f"({type(error).__name__}); not logged again, so that run may lack step {step}"
        )
        return {}
    if missing:
        logger.log_metrics(missing, step)
    return missing
