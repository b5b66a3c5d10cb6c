"""Resume: a fresh DataModule loading state_dict() continues with exactly the batches an uninterrupted run reads."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from data.data_errors import DataError
from data.datamodule import ShardDataModule


def _module(
    directory: Path, workers: int, rank: int = 0, world: int = 1, **kwargs: object
) -> ShardDataModule:
    options: dict = dict(batch_size=4, num_workers=workers, seed=5, shuffle_buffer=32)
    options.update(kwargs)
    dm = ShardDataModule(str(directory), **options)
    dm.set_rank(rank, world)
    return dm


def _take(dm: ShardDataModule, count: int) -> list[torch.Tensor]:
    """The next `count` batches, starting a new epoch (a new iteration) whenever one ends."""
    out: list[torch.Tensor] = []
    loader = dm.train_dataloader()
    while len(out) < count:
        before = len(out)
        for batch in loader:
            out.append(batch)
            if len(out) == count:
                break
        assert len(out) > before, "an epoch without batches"
    return out


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("world", [1, 2])
def test_resume_continues_exactly(prepared: Path, workers: int, world: int) -> None:
    rank = world - 1
    per_epoch = len(_module(prepared, workers, rank, world).train_dataloader())
    total = 2 * per_epoch + 3
    uninterrupted = _take(_module(prepared, workers, rank, world), total)
    for k in (0, 5, per_epoch, per_epoch + 2):  # start, mid-epoch, end of epoch, into the next
        first = _module(prepared, workers, rank, world)
        consumed = _take(first, k)
        state = first.state_dict()
        assert state["batches_consumed"] == k - per_epoch * state["epoch"]
        fresh = _module(prepared, workers, rank, world)
        fresh.load_state_dict(state)
        rest = _take(fresh, total - k)
        assert all(torch.equal(a, b) for a, b in zip(consumed + rest, uninterrupted, strict=True)), f"k={k}"


def test_state_survives_a_second_save_before_iterating(prepared: Path) -> None:
    dm = _module(prepared, 0)
    _take(dm, 3)
    fresh = _module(prepared, 0)
    fresh.load_state_dict(dm.state_dict())
    assert fresh.state_dict()["batches_consumed"] == 3  # e.g. a checkpoint written right after restoring


def test_resume_with_other_settings_is_refused(prepared: Path) -> None:
    dm = _module(prepared, 0)
    _take(dm, 3)
    fresh = _module(prepared, 2)  # two workers: two streams, another batch order
    fresh.load_state_dict(dm.state_dict())
    with pytest.raises(DataError, match="streams: checkpoint 1, now 2"):
        next(iter(fresh.train_dataloader()))


class _Recorder(L.LightningModule):
    """Trains nothing useful; remembers every batch handed to training_step."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch.clone())
        return (self.weight - batch.float().mean()).pow(2)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _trainer(tmp_path: Path, steps: int, callbacks: list, limit: int | None) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_epochs=-1,
        limit_train_batches=limit,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        default_root_dir=tmp_path,
    )


@pytest.mark.slow
@pytest.mark.parametrize("limit", [None, 4])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_lightning_checkpoint_resumes_exactly(prepared: Path, tmp_path: Path, limit: int | None) -> None:
    """Through the Trainer: the position is saved by Lightning, counted as batches trained on; with
    limit_train_batches an epoch ends early, and the resumed run starts the next one as the first run did."""
    per_epoch = limit or len(_module(prepared, 2, batch_size=16).train_dataloader())
    every = max(1, per_epoch // 2)
    total = 2 * per_epoch + 1
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=every, save_top_k=-1)
    model = _Recorder()
    _trainer(tmp_path, total, [saver], limit).fit(model, datamodule=_module(prepared, 2, batch_size=16))
    assert len(model.seen) == total
    checkpoints = sorted((tmp_path / "ckpt").glob("*.ckpt"), key=lambda p: int(p.stem.split("step=")[1]))
    assert len(checkpoints) >= 2
    # a mid-epoch checkpoint and one at the end of the first epoch (when every divides per_epoch)
    for checkpoint in checkpoints[:2]:
        step = int(checkpoint.stem.split("step=")[1])
        saved = torch.load(checkpoint, weights_only=False)["ShardDataModule"]
        assert saved["epoch"] * per_epoch + saved["batches_consumed"] == step
        resumed = _Recorder()
        trainer = _trainer(tmp_path, total, [], limit)
        trainer.fit(resumed, datamodule=_module(prepared, 2, batch_size=16), ckpt_path=checkpoint)
        assert len(resumed.seen) == total - step
        assert all(torch.equal(a, b) for a, b in zip(resumed.seen, model.seen[step:], strict=True))
