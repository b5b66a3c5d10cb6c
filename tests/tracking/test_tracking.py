"""Tracking where runs meet the world, through main(): a real `mlflow server`, the server killed mid-fit
(and away until the end, then the replay command), runs ending FINISHED or FAILED, three fits started
together on a fresh SQLite store, and a resume into another store."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from lightning_modules.commands import replay_pending as tracking_replay
from lightning_modules.tracking.buffer import BufferedClient
from lightning_modules.tracking.logger import TrackingRunNotFoundError
from lightning_modules.training.language_model import NonFiniteLossError
from main import main
from tests import training_callbacks
from tests.conftest import TINY_SEQ_LEN
from tests.mlflow_server import MlflowServer
from tests.training.helpers import BATCH, args, losses, only_run

ROOT = Path(__file__).resolve().parents[2]
NO_VAL = ("--trainer.limit_val_batches", "0")


def at(step: int, action: str) -> list[str]:
    return ["--trainer.callbacks+=tests.training_callbacks.AtStep", "--trainer.callbacks.step", str(step),
            "--trainer.callbacks.action", action]  # fmt: skip


def steps_logged(client: MlflowClient, run_id: str, key: str = "train/loss") -> list[int]:
    """Every step a metric holds, repeats included (sorted): equal to range(n) means each exactly once."""
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_fit_against_a_server_logs_params_tags_metrics_by_step_and_config(
    tiny_shards: Path, mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    cli = main(args("fit", tiny_shards, "mqa", "--trainer.max_steps", "4", *NO_VAL))
    client = MlflowClient(mlflow_server.uri)
    run = client.get_run(cli.trainer.logger.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "nano-mqa-seed7"
    tags = run.data.tags
    assert (tags["size"], tags["attention"], tags["seed"], tags["budget"]) == ("nano", "mqa", "7", "steps")
    folder = Path(tags["checkpoint_dir"])
    assert folder == Path(cli.trainer.checkpoint_callback.dirpath).resolve()
    assert folder.name.startswith("nano-mqa-seed7-") and (folder / "last.ckpt").is_file()
    params = run.data.params
    assert params["seed_everything"] == "7" and params["model.attention.kind"] == "mqa"
    assert params["model.arch.seq_len"] == str(TINY_SEQ_LEN) and params["data.batch_size"] == str(BATCH)
    assert int(params["cost.params"]) == sum(p.numel() for p in cli.model.model.parameters())
    for key in ("train/loss", "train/tokens", "train/flops"):
        assert steps_logged(client, run.info.run_id, key) == [0, 1, 2, 3], key
    tokens = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/tokens")}
    assert tokens[3] == cli.model.tokens_seen == 4 * BATCH * TINY_SEQ_LEN
    config = yaml.safe_load(
        Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))).read_text()
    )
    assert config["model"]["attention"]["kind"] == "mqa" and config["seed_everything"] == 7
    assert config["model"]["arch"]["vocab_size"] == 512  # the merged config, manifest link applied


@pytest.mark.slow
def test_server_killed_mid_fit_and_restarted_loses_no_step(
    tiny_shards: Path, mlflow_server: MlflowServer, caplog: pytest.LogCaptureFixture
) -> None:
    seen: dict[str, list[int]] = {}
    training_callbacks.ACTIONS.update(
        kill=lambda trainer: mlflow_server.kill(),
        restart=lambda trainer: mlflow_server.start(),  # same port, same SQLite file
        look=lambda trainer: seen.update(
            steps=steps_logged(MlflowClient(mlflow_server.uri), trainer.logger.run_id)
        ),
    )
    with caplog.at_level(logging.WARNING, logger="lightning_modules.tracking.buffer"):
        # Retries at least every 0.2 s, so the first write after the restart (which takes seconds) sends.
        cli = main(args("fit", tiny_shards, "mha", "--trainer.max_steps", "12", *NO_VAL,
                        "--trainer.logger.init_args.max_retry_interval", "0.2",
                        *at(3, "kill"), *at(6, "restart"), *at(9, "look")))  # fmt: skip
    assert cli.trainer.global_step == 12
    client = MlflowClient(mlflow_server.uri)
    run_id = cli.trainer.logger.run_id
    assert steps_logged(client, run_id) == list(range(12))  # every step, each exactly once
    assert {3, 4, 5} <= set(seen["steps"])  # the calls held in the outage went in once the server was back
    assert client.get_run(run_id).info.status == "FINISHED"
    assert "is not answering" in caplog.text and "answers again" in caplog.text
    assert not list(Path(cli.trainer.checkpoint_callback.dirpath).glob("mlflow-pending*"))


@pytest.mark.slow
def test_server_away_at_the_end_saves_the_calls_beside_the_checkpoints_and_replay_sends_them(
    tiny_shards: Path, mlflow_server: MlflowServer, caplog: pytest.LogCaptureFixture
) -> None:
    training_callbacks.ACTIONS["kill"] = lambda trainer: mlflow_server.kill()
    extra = (
        "--trainer.max_steps",
        "8",
        *NO_VAL,
        *at(3, "kill"),
        "--trainer.logger.init_args.flush_timeout",
        "0",
    )
    with caplog.at_level(logging.WARNING, logger="lightning_modules.tracking.logger"):
        cli = main(args("fit", tiny_shards, "mha", *extra))
    run_id = cli.trainer.logger.run_id
    folder = Path(cli.trainer.checkpoint_callback.dirpath)
    pending = folder / f"mlflow-pending-{run_id}.jsonl"
    assert pending.is_file() and (folder / "last.ckpt").is_file()  # training finished and checkpointed
    assert f"python -m lightning_modules replay {pending}" in caplog.text

    assert tracking_replay.main([str(pending)]) == 1  # still away: refused, nothing lost
    assert pending.is_file()
    mlflow_server.start()
    client = MlflowClient(mlflow_server.uri)
    assert client.get_run(run_id).info.status == "RUNNING"  # its end is among the saved calls
    assert tracking_replay.main([str(pending)]) == 0
    assert steps_logged(client, run_id) == list(range(8))
    assert client.get_run(run_id).info.status == "FINISHED"
    assert not pending.exists()


@pytest.mark.slow
def test_run_ends_failed_when_training_raises(tiny_shards: Path, mlflow_uri: str) -> None:
    poison = ("--trainer.callbacks+=tests.training_callbacks.PoisonAtStep", "--trainer.callbacks.step", "2")
    with pytest.raises(NonFiniteLossError):
        main(args("fit", tiny_shards, "mha", "--trainer.max_steps", "6", *NO_VAL, *poison))
    _, run = only_run(mlflow_uri)
    assert run.info.status == "FAILED"


def test_held_calls_past_the_memory_bound_keep_their_order_and_replay_into_another_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    store_at: Callable[[Path], str],
) -> None:
    dead = "http://127.0.0.1:9"  # the discard port: nothing answers
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    pending = tmp_path / "ck" / "mlflow-pending-old.jsonl"
    held = BufferedClient(MlflowClient(dead), dead, pending, max_pending=4)
    note = tmp_path / "note.txt"
    note.write_text("kept")
    held.set_tag("old", "order", "first")
    for step in range(10):
        held.log_metric("old", "loss", float(step), timestamp=1000 + step, step=step)
    held.log_artifact("old", str(note))
    note.unlink()  # the caller's file may be temporary: the held call has its own copy
    held.set_tag("old", "order", "last")
    held.set_terminated("old", "FAILED")
    assert pending.is_file() and held.pending == 14  # past 4 in memory, the oldest went to the file
    assert held.save() == pending

    assert tracking_replay.main([str(pending)]) == 1  # the run's own store is still away
    assert "still pending there" in capsys.readouterr().err and pending.is_file()

    store = store_at(tmp_path / "other" / "mlflow.db")
    client = MlflowClient(store)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    assert tracking_replay.main([str(pending), "--tracking-uri", store, "--run-id", run_id]) == 0
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [
        (s, float(s)) for s in range(10)
    ]
    run = client.get_run(run_id)
    assert run.data.tags["order"] == "last" and run.info.status == "FAILED"  # sent in order
    assert Path(client.download_artifacts(run_id, "note.txt", str(tmp_path))).read_text() == "kept"
    assert not pending.exists() and not (tmp_path / "ck" / "mlflow-pending-old-artifacts").exists()


@pytest.mark.slow
def test_three_fits_started_together_on_a_fresh_store_all_finish_in_their_own_run_and_folder(
    tiny_shards: Path, tmp_path: Path
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": uri, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        str(ROOT / "main.py"),
        *args("fit", tiny_shards, "mqa", "--trainer.max_steps", "3", *NO_VAL),
    ]
    fits = [subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for _ in range(3)]  # fmt: skip
    outputs = [fit.communicate(timeout=900)[0].decode(errors="replace") for fit in fits]
    assert [fit.returncode for fit in fits] == [0, 0, 0], [out[-2000:] for out in outputs]

    client, experiment = MlflowClient(uri), MlflowClient(uri).get_experiment_by_name("lrkv-lab")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED"}
    folders = {Path(r.data.tags["checkpoint_dir"]) for r in runs}
    assert len(folders) == 3 and folders == set((tmp_path / "checkpoints").iterdir())
    for run in runs:
        last = Path(run.data.tags["checkpoint_dir"]) / "last.ckpt"
        assert torch.load(last, weights_only=True)["mlflow_run_id"] == run.info.run_id
        assert steps_logged(client, run.info.run_id) == [0, 1, 2]


@pytest.mark.slow
def test_resume_into_another_store_is_refused_then_continues_in_a_new_run(
    tiny_shards: Path,
    mlflow_uri: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    store_at: Callable[[Path], str],
) -> None:
    first = main(args("fit", tiny_shards, "mha", "--trainer.max_steps", "2", *NO_VAL))
    old = first.trainer.logger.run_id
    ckpt = Path(first.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    other = store_at(tmp_path / "other" / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", other)
    resume = args("fit", tiny_shards, "mha", "--trainer.max_steps", "4", *NO_VAL, "--ckpt_path", str(ckpt))
    with pytest.raises(TrackingRunNotFoundError) as err:
        main(resume)
    message = str(err.value)
    assert f"MLflow run {old}" in message and f"tracking store {other}" in message and "\n" not in message
    assert "--trainer.logger.init_args.missing_run new_run" in message

    cli = main([*resume, "--trainer.logger.init_args.missing_run", "new_run"])
    assert cli.trainer.global_step == 4
    client = MlflowClient(other)
    run = client.get_run(cli.trainer.logger.run_id)
    assert run.info.run_id != old and run.data.tags["resumed_from_run"] == old
    assert run.info.status == "FINISHED" and sorted(losses(client, run.info.run_id)) == [2, 3]
