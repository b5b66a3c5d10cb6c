"""Two real DDP processes (gloo, CPU) with two DataLoader workers each: the DataModule takes its rank and
world size from the trainer, every rank trains on the same number of batches (else DDP would hang in the
gradient all-reduce), and an epoch covers each train sample at most once across ranks."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from data.datamodule import ShardDataModule


class _RankRecorder(L.LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.out = out
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[torch.Tensor] = []
        self.val_rows = 0

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch.clone())
        return (self.weight - batch.float().mean()).pow(2)

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.val_rows += batch.shape[0]
        # a per-step collective: it would hang if the ranks ran different numbers of val batches
        self.log("rows", float(batch.shape[0]), sync_dist=True, on_step=True)

    def on_train_end(self) -> None:
        datamodule = self.trainer.datamodule
        torch.save(
            {
                "seen": self.seen,
                "val_rows": self.val_rows,
                "rank": datamodule.rank,
                "world": datamodule.world_size,
                "per_epoch": len(datamodule.train_dataloader()),
            },
            Path(self.out) / f"rank{self.global_rank}.pt",
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_two_ddp_ranks_get_equal_disjoint_batches(prepared: Path, tmp_path: Path) -> None:
    dm = ShardDataModule(str(prepared), batch_size=8, num_workers=2, seed=3, val_batch_size=5)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(_RankRecorder(str(tmp_path)), datamodule=dm)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert [(r["rank"], r["world"]) for r in results] == [(0, 2), (1, 2)]
    per_epoch = results[0]["per_epoch"]
    assert [len(r["seen"]) for r in results] == [per_epoch, per_epoch]
    rows = [tuple(row.tolist()) for r in results for batch in r["seen"] for row in batch]
    assert len(rows) == len(set(rows)) == 2 * per_epoch * 8
    assert sum(r["val_rows"] for r in results) == dm.samples("val")  # each val sample once
