"""lightning_modules/checkpoint/step_log.py: a step's metrics carried by its checkpoint are logged on resume only where
the run lacks them, and a store that cannot be read is a warning, not a crash or a second copy."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest

from lightning_modules.checkpoint import step_log
from lightning_modules.core import lightning_api
from lightning_modules.tracking.logger import BufferedMLFlowLogger


def _logger(uri: str) -> BufferedMLFlowLogger:
    logger = BufferedMLFlowLogger(experiment_name="step-log", tracking_uri=uri)
    logger.log_metrics({"train/loss": 2.5}, step=3)
    return logger


def _history(logger: BufferedMLFlowLogger, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in logger.experiment.get_metric_history(logger.run_id, key)]


def test_logs_only_what_the_run_lacks_at_that_step(mlflow_uri: str) -> None:
    logger = _logger(mlflow_uri)
    record = {"step": 3, "metrics": {"train/loss": 2.5, "train/tokens": 512.0}}
    assert step_log.log_missing(logger, record) == {"train/tokens": 512.0}
    assert _history(logger, "train/loss") == [(3, 2.5)]  # not a second copy
    assert _history(logger, "train/tokens") == [(3, 512.0)]
    assert step_log.log_missing(logger, record) == {}  # a second resume adds nothing


def test_an_unreadable_store_warns_and_logs_nothing(mlflow_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    logger = _logger(mlflow_uri)

    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("store away")

    monkeypatch.setattr(logger.experiment, "get_metric_history", unreachable)
    with pytest.warns(UserWarning, match="may lack step 4"):
        assert step_log.log_missing(logger, {"step": 4, "metrics": {"train/loss": 1.0}}) == {}


def test_no_record_outside_a_training_step() -> None:
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert lightning_api.log_step(trainer) == 0
    last = step_log.StepMetrics(0, {"train/loss": 1.0})
    assert step_log.pending_record(trainer, last) is None  # not training: nothing is about to be logged
    assert step_log.pending_record(trainer, None) is None
