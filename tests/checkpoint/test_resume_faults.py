"""Through the real CLI with loader workers (scripts/fault_injection.py drives main.py fit):
- the same command twice gives bitwise the same train/loss at every step and the same final weights (fp32 CPU);
- SIGKILLed at K = 2 moments (one during a checkpoint write) and resumed each time, a fit ends with the
  uninterrupted run's weights and per-step losses;
- resuming with another model, attention or optimizer is refused naming each field; a new budget is
  applied, printed and tagged (lightning_modules/checkpoint/resume_policy.py)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import TINY_SEQ_LEN
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6


def _script() -> ModuleType:
    return load_script("scripts/fault_injection.py", "fault_injection")


@pytest.fixture(scope="module")
def fi() -> ModuleType:
    return _script()


@pytest.fixture(scope="module")
def reference(
    fi: ModuleType,
    tiny_shards: Path,
    tmp_path_factory: pytest.TempPathFactory,
    store_at: Callable[[Path], str],
) -> Path:
    workdir = tmp_path_factory.mktemp("reference")
    store_at(workdir / "mlruns" / "mlflow.db")  # where scripts/fault_injection.py's runs log
    fi.run_uninterrupted(workdir, tiny_shards, STEPS, TINY_SEQ_LEN)
    return workdir


@pytest.mark.slow
def test_same_command_twice_gives_the_same_loss_at_every_step(
    fi: ModuleType, reference: Path, tiny_shards: Path, tmp_path: Path, store_at: Callable[[Path], str]
) -> None:
    store_at(tmp_path / "mlruns" / "mlflow.db")
    fi.run_uninterrupted(tmp_path, tiny_shards, STEPS, TINY_SEQ_LEN)
    first, second = fi.loss_history(reference), fi.loss_history(tmp_path)
    assert len(first) == STEPS and first == second  # every step logged once, bitwise equal
    a, b = fi.final_state(reference / "ck"), fi.final_state(tmp_path / "ck")
    assert all(a[k].equal(b[k]) for k in a)


@pytest.mark.slow
def test_killed_twice_and_resumed_ends_like_the_uninterrupted_run(
    fi: ModuleType, reference: Path, tiny_shards: Path, tmp_path: Path, store_at: Callable[[Path], str]
) -> None:
    store_at(tmp_path / "mlruns" / "mlflow.db")
    ckpt, kills, during_write, processes = fi.run_with_kills(
        tmp_path, tiny_shards, STEPS, TINY_SEQ_LEN, 2, random.Random(0)
    )
    assert kills == 2 and during_write == 1 and processes == 3
    outcome = fi.Outcome()
    fi.compare(reference, tmp_path, reference / "ck", ckpt, outcome)
    assert outcome.weights_identical and outcome.max_abs_weight_diff == 0.0
    assert outcome.losses_identical, outcome.loss_mismatches
    assert outcome.steps == STEPS


@pytest.mark.slow
def test_killed_between_a_checkpoint_and_its_log_the_resume_logs_that_step_once(
    fi: ModuleType, reference: Path, tiny_shards: Path, tmp_path: Path, store_at: Callable[[Path], str]
) -> None:
    """Killed right after step 3's checkpoint, before Lightning logged step 3 (logged as step 2): the resumed
    fit logs it from the checkpoint, so the run's curve equals the uninterrupted one, every step once."""
    store_at(tmp_path / "mlruns" / "mlflow.db")
    ckpt, env = tmp_path / "ck", fi._env(tmp_path, fi.process_tmpdir("kill-after-save"))
    kill = ["--trainer.callbacks.kill_step", "3"]
    cmd = fi.fit_command(
        tiny_shards, STEPS, TINY_SEQ_LEN, ckpt, kill, "tests.training_callbacks.KillAfterSave"
    )
    try:
        killed = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        assert sorted(fi.loss_history(tmp_path)) == [0, 1]  # the hole: step 2 was checkpointed, never logged
        resume = ["--ckpt_path", str(ckpt / "last.ckpt")]
        done = subprocess.run(
            fi.fit_command(tiny_shards, STEPS, TINY_SEQ_LEN, ckpt, resume), cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    finally:
        shutil.rmtree(env["TMPDIR"], ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resume: logged step 2's train/loss" in done.stderr
    assert fi.loss_history(tmp_path) == fi.loss_history(reference)


def _resume(reference: Path, tiny_shards: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, str(ROOT / "main.py"), "fit", "--config", str(ROOT / "conf/base.yaml"),
        "--config", str(ROOT / "conf/model/nano.yaml"), "--config", str(ROOT / "conf/attention/lrkv.yaml"),
        "--model.arch.seq_len", str(TINY_SEQ_LEN), "--data.data_dir", str(tiny_shards),
        "--data.batch_size", "4", "--data.num_workers", "2", "--trainer.precision", "32-true",
        "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
        "--ckpt_path", str(reference / "ck" / "last.ckpt"), *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{cwd / 'mlruns' / 'mlflow.db'}"
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_resume_refuses_another_model_naming_every_field(
    reference: Path, tiny_shards: Path, tmp_path: Path
) -> None:
    run = _resume(
        reference, tiny_shards, tmp_path, "--config", str(ROOT / "conf/model/20m.yaml"),
        "--config", str(ROOT / "conf/attention/gqa.yaml"), "--model.optimizer.lr", "0.01",
        "--model.arch.seq_len", str(TINY_SEQ_LEN),
    )  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    line = next(line for line in run.stderr.splitlines() if "main.py: error:" in line)
    for field in (
        "model.arch.name: checkpoint 'nano', given '20m'",
        "model.arch.n_layer:",
        "model.arch.d_model:",
    ):
        assert field in line, line
    assert "model.attention.kind: checkpoint 'lrkv', given 'gqa'" in line
    assert "model.optimizer.lr: checkpoint 0.003, given 0.01" in line
    assert not (tmp_path / "mlruns").exists() or "Epoch" not in run.stderr  # refused before training


@pytest.mark.slow
def test_resume_applies_a_new_budget_prints_and_tags_it(
    fi: ModuleType, reference: Path, tiny_shards: Path, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    shutil.copytree(reference / "mlruns", tmp_path / "mlruns")  # the run the checkpoint continues
    tokens = (STEPS + 2) * 4 * TINY_SEQ_LEN  # two more steps
    run = _resume(reference, tiny_shards, tmp_path, "--model.budget.tokens", str(tokens))
    assert run.returncode == 0, run.stderr[-3000:]
    applied = [line for line in run.stderr.splitlines() if line.startswith("resume: applied")]
    assert applied and "model.budget" in applied[0] and str(tokens) in applied[0], run.stderr[-2000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (only,) = client.search_runs([client.get_experiment_by_name("lrkv-lab").experiment_id])
    assert "model.budget" in only.data.tags["resume.applied"]
    steps = [m.step for m in client.get_metric_history(only.info.run_id, "train/loss")]
    assert max(steps) >= STEPS + 1  # it trained on, in the same run
    assert sorted(steps) == list(range(max(steps) + 1))  # the checkpoint's own step was not logged again
