"""Fixtures: MLflow stores in temporary directories, filled the way the training module fills ./mlruns."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.analysis.synthetic import log_synthetic_runs


@pytest.fixture(scope="session")
def new_store(
    store_at: Callable[[Path], str], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], str]:
    """new_store(name) -> the tracking URI of a fresh empty SQLite store in its own session folder."""
    return lambda name: store_at(tmp_path_factory.mktemp(name) / "mlflow.db")


@pytest.fixture(scope="session")
def synthetic_store(new_store: Callable[[str], str]) -> str:
    """Tracking URI of a SQLite store holding the synthetic runs of tests/analysis/synthetic.py: 2 sizes x 5
    attentions x 2 seeds, 6 validation evaluations and a test evaluation each, plus a one-seed rank / latent
    sweep at nano. Session-scoped: tests only read it."""
    uri = new_store("synthetic_store")
    log_synthetic_runs(uri)
    return uri


@pytest.fixture(scope="session")
def tiny_run_store(
    new_store: Callable[[str], str], tiny_shards: Path, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """Tracking URI of a store written by real training: `python -m lightning_modules compare` over the five
    attentions at nano on tiny shards and one small FLOPs budget (a handful of steps, validation every 2)."""
    import os

    from lightning_modules.commands import compare
    from tests.conftest import TINY_SEQ_LEN

    uri = new_store("tiny_run_store")
    work = tmp_path_factory.mktemp("tiny_run")
    data = work / "data.yaml"
    data.write_text(f"data:\n  data_dir: {tiny_shards}\n  batch_size: 4\n  num_workers: 0\n")
    budget = work / "budget.yaml"
    budget.write_text("model:\n  budget:\n    flops: 6.0e9\n")
    extra = ["--model.arch.seq_len", str(TINY_SEQ_LEN), "--trainer.val_check_interval", "2",
             "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2",
             "--trainer.enable_progress_bar", "false"]  # fmt: skip
    saved_env, saved_cwd = os.environ.get("MLFLOW_TRACKING_URI"), Path.cwd()
    os.environ["MLFLOW_TRACKING_URI"] = uri
    os.chdir(work)  # checkpoints/ land here
    try:
        assert compare.main(["--data", str(data), "--budget", str(budget), "--", *extra]) == 0
    finally:
        os.chdir(saved_cwd)
        if saved_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved_env
    return uri
