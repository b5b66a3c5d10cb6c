"""The non-finite loss check reads the loss back only on the logged steps (host_sync.py), still names the
first bad step, and still never lets a checkpoint of the bad state be written."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lightning_modules.training import host_sync
from lightning_modules.training.language_model import LanguageModel, NonFiniteLossError
from main import main
from tests.host_reads import HostReads
from tests.training.helpers import args

POISON_AT_5 = ("--trainer.callbacks+=tests.training_callbacks.PoisonAtStep", "--trainer.callbacks.step", "5")


def fake_trainer(every: int, max_steps: int, step: int = 0, stop: bool = False) -> SimpleNamespace:
    loop = SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=step))
    return SimpleNamespace(log_every_n_steps=every, max_steps=max_steps, should_stop=stop, fit_loop=loop)


def test_due_on_lightnings_logged_steps_the_last_and_a_stopping_one() -> None:
    assert [s for s in range(10) if host_sync.due(fake_trainer(4, 10, s))] == [3, 7, 9]
    assert [s for s in range(6) if host_sync.due(fake_trainer(4, 10, s), every_n_steps=2)] == [1, 3, 5]
    assert [s for s in range(3) if host_sync.due(fake_trainer(0, 10, s))] == [0, 1, 2]  # logging off: each
    assert host_sync.due(fake_trainer(4, 10, 1, stop=True))


def test_the_watch_keeps_the_first_bad_loss_without_reading_anything_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watch = host_sync.LossWatch()
    assert watch.first_bad() is None
    losses = [1.0, 2.0, float("nan"), 3.0, float("inf"), float("nan")]

    def no_read_back(*_: Any) -> None:
        raise AssertionError("observe read a device value back")

    with monkeypatch.context() as patch:
        for name in ("__bool__", "item", "tolist", "cpu", "numpy"):
            patch.setattr(torch.Tensor, name, no_read_back)
        for step, value in enumerate(losses):
            watch.observe(torch.tensor(value, dtype=torch.bfloat16), step, batch_idx=10 + step)
    step, rank, batch_idx, value = watch.first_bad() or (None, None, None, None)
    assert (step, rank, batch_idx) == (2, 0, 12) and value is not None and math.isnan(value)
    clean = host_sync.LossWatch()
    for step in range(3):
        clean.observe(torch.tensor(0.5), step, step)
    assert clean.first_bad() is None


@pytest.mark.slow
def test_checked_every_log_step_a_nan_is_named_at_its_step_at_the_next_check(
    tiny_shards: Path, mlflow_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks: list[int | None] = []
    original = LanguageModel._stop_if_non_finite

    def spy(self: LanguageModel, now: int | None = None, found: str = "") -> None:
        checks.append(now)
        original(self, now, found)

    monkeypatch.setattr(LanguageModel, "_stop_if_non_finite", spy)
    extra = ("--trainer.max_steps", "10", "--trainer.limit_val_batches", "0",
             "--trainer.log_every_n_steps", "4", *POISON_AT_5)  # fmt: skip
    with pytest.raises(NonFiniteLossError) as err:
        main(args("fit", tiny_shards, "mha", *extra))
    assert checks == [3, 7]  # the training steps that read the loss back: Lightning's logged ones
    assert str(err.value).startswith(
        "non-finite training loss (nan) at step 5 (batch 5); found at step 7, before its update (the loss is "
        "read back every 4 steps: trainer.log_every_n_steps): steps 5 to 6 updated the weights"
    )


@pytest.mark.slow
def test_a_checkpoint_between_checks_is_refused_once_a_loss_was_bad(
    tiny_shards: Path, mlflow_uri: str, tmp_path: Path
) -> None:
    extra = ("--trainer.max_steps", "10", "--trainer.limit_val_batches", "0",
             "--trainer.log_every_n_steps", "4",
             "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps", "2",
             "--trainer.callbacks.dirpath", str(tmp_path / "ck"), *POISON_AT_5)  # fmt: skip
    with pytest.raises(NonFiniteLossError, match=r"at step 5 \(batch 5\); found when saving step 6's") as err:
        main(args("fit", tiny_shards, "mha", *extra))
    good = tmp_path / "ck" / "epoch=0-step=4.ckpt"
    assert str(err.value).endswith(f"Last good checkpoint: {good}")
    assert not list((tmp_path / "ck").glob("*step=6*"))
    state = torch.load(good, weights_only=False)["state_dict"]
    assert all(torch.isfinite(t).all() for t in state.values())


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_steps_that_do_not_log_read_nothing_back(tiny_shards: Path, mlflow_uri: str, optimizer: str) -> None:
    """A fit with the progress bar on logs every 4 steps: steps 3, 7, 11 read back (the loss check, the
    logger, the bar), and no other step makes a host sync (tests/host_reads.py says what counts as one)."""
    extra = ("--trainer.max_steps", "12", "--trainer.limit_val_batches", "0",
             "--trainer.log_every_n_steps", "4", "--trainer.enable_progress_bar", "true",
             "--model.optimizer.name", optimizer,
             "--trainer.callbacks+=tests.host_reads.StepMarker")  # fmt: skip
    with HostReads() as reads:
        main(args("fit", tiny_shards, "lrkv", *extra))
    logged = {3, 7, 11}
    assert logged <= set(reads.syncs), dict(reads.syncs)  # the check can see a sync
    quiet = {step: found for step, found in reads.syncs.items() if step not in logged}
    assert not quiet, "\n".join(f"step {s}: {w}" for s, found in quiet.items() for w in found)
