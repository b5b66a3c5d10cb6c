"""Every fit validates at its last step (lightning_modules/training/final_validation.py), once, also when the
last step is a regular validation step, and a run without validation is left without one."""

from __future__ import annotations

from pathlib import Path

import pytest

from main import main
from tests.training.helpers import args, only_run


def val_steps(uri: str) -> list[int]:
    client, run = only_run(uri)
    return [m.step for m in client.get_metric_history(run.info.run_id, "val/loss")]


@pytest.mark.slow
@pytest.mark.parametrize(("max_steps", "expected"), [(7, [2, 5, 6]), (6, [2, 5])])
def test_the_last_step_is_validated_once(
    max_steps: int, expected: list[int], tiny_shards: Path, mlflow_uri: str, tmp_path: Path
) -> None:
    # val_check_interval 3 (args): regular validations after steps 3 and 6 (logged at steps 2 and 5)
    cli = main(
        args("fit", tiny_shards, "mha", "--trainer.max_steps", str(max_steps),
             "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.dirpath", str(tmp_path))
    )  # fmt: skip
    assert cli.trainer.global_step == max_steps  # the request to stop ends nothing early
    assert val_steps(mlflow_uri) == expected


@pytest.mark.slow
def test_a_fit_without_validation_gets_none(tiny_shards: Path, mlflow_uri: str, tmp_path: Path) -> None:
    main(
        args("fit", tiny_shards, "mha", "--trainer.max_steps", "4", "--trainer.limit_val_batches", "0",
             "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.dirpath", str(tmp_path))
    )  # fmt: skip
    assert val_steps(mlflow_uri) == []
