"""Helpers that several test modules of this folder share (fixtures stay in conftest.py)."""

from __future__ import annotations

from pathlib import Path

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from tests.conftest import TINY_SEQ_LEN

ROOT = Path(__file__).resolve().parents[2]

BATCH = 4


def args(subcommand: str, shards: Path, kind: str, *extra: str) -> list[str]:
    return [
        subcommand,
        "--config", str(ROOT / "conf/base.yaml"),
        "--config", str(ROOT / "conf/model/nano.yaml"),
        "--config", str(ROOT / f"conf/attention/{kind}.yaml"),
        "--model.arch.seq_len", str(TINY_SEQ_LEN),
        "--data.data_dir", str(shards),
        "--data.batch_size", str(BATCH),
        "--data.num_workers", "0",
        "--trainer.limit_val_batches", "2",
        "--trainer.val_check_interval", "3",
        "--trainer.log_every_n_steps", "1",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        *extra,
    ]  # fmt: skip


def only_run(uri: str) -> tuple[MlflowClient, Run]:
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("lrkv-lab").experiment_id])
    assert len(runs) == 1
    return client, runs[0]


def losses(client: MlflowClient, run_id: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, "train/loss")}
