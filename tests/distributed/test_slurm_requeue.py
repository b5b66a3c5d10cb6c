"""Preemption as a cycle, without SLURM: scripts/slurm/train.sbatch itself runs with the environment SLURM gives
a one-task job, `srun` and `scontrol` replaced by stand-ins on PATH (srun runs the task's command in place,
scontrol writes down what it was asked). The script gets SIGUSR1, as `--signal=B:USR1@300` sends it before the
time limit, after two steps: the fit saves the step it is in, the script requeues the job, and the same script
with the same arguments (what a requeued job runs) resumes through `--ckpt_path auto` into the same MLflow run
and the same checkpoint folder under `--trainer.default_root_dir`. It ends with the weights of an uninterrupted
run of the same command (bitwise, fp32 on the CPU) and every step's loss logged once, equal to that run's."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.conftest import TINY_SEQ_LEN
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]
STEPS = 8
JOB_ID = "4242"
SRUN = """#!/bin/bash
# srun's stand-in: its options dropped, the task's command run in place (so the script signals the fit itself)
while [[ $1 == -* ]]; do shift; done
exec "$@"
"""
SCONTROL = """#!/bin/bash
echo "$@" >> "$SCONTROL_LOG"
"""


@pytest.fixture(scope="module")
def fi() -> ModuleType:
    return load_script("scripts/fault_injection.py", "fault_injection")


def _extra(shards: Path, workdir: Path) -> list[str]:
    return [
        "--model.arch.seq_len", str(TINY_SEQ_LEN),
        "--data.data_dir", str(shards),
        "--data.batch_size", "4",
        "--data.num_workers", "0",
        "--trainer.precision", "32-true",
        "--trainer.max_steps", str(STEPS),
        "--trainer.limit_val_batches", "0",
        "--trainer.log_every_n_steps", "1",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.default_root_dir", str(workdir / "root"),
        "--trainer.callbacks+=tests.training.signal_callbacks.MarkSteps",
        "--trainer.callbacks.folder", str(workdir / "marks"),
    ]  # fmt: skip


def _job(fi: ModuleType, workdir: Path, tmpdir: Path, restarts: int) -> dict[str, str]:
    """The environment of the batch script of a one-node, one-task job (its restart count as SLURM sets it)."""
    bin_dir = workdir / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    base = {k: v for k, v in fi._env(workdir, tmpdir).items() if not k.startswith(("MASTER_", "SLURM_"))}
    return {
        **base,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SCONTROL_LOG": str(workdir / "scontrol.log"),
        "SIZE": "nano", "ATTENTION": "mha", "STRATEGY": "single", "DATA": "shakespeare",
        "PYTHON": sys.executable, "ACCELERATOR": "cpu",
        "SLURM_JOB_ID": JOB_ID, "SLURM_JOB_NAME": "lrkv-lab", "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_TASKS_PER_NODE": "1", "SLURM_NODELIST": "127.0.0.1", "SLURM_PROCID": "0", "SLURM_NODEID": "0",
        "SLURM_LOCALID": "0", "SLURM_CPUS_PER_TASK": "1", "SLURM_RESTART_COUNT": str(restarts),
        "PYTHONUNBUFFERED": "1",
    }  # fmt: skip


def _sbatch(workdir: Path, shards: Path) -> list[str]:
    return ["bash", str(ROOT / "scripts/slurm/train.sbatch"), *_extra(shards, workdir)]


def _the_folder(workdir: Path) -> Path:
    (folder,) = (workdir / "root" / "checkpoints").iterdir()  # one run, one folder, requeues included
    return folder


def test_a_job_warned_before_its_time_limit_is_requeued_and_resumes_exactly(
    fi: ModuleType, tiny_shards: Path, tmp_path: Path, store_at: Callable[[Path], str]
) -> None:
    reference, cycled = tmp_path / "reference", tmp_path / "cycled"
    tmpdir = fi.process_tmpdir("requeue")
    try:
        for workdir in (reference, cycled):
            store_at(workdir / "mlruns" / "mlflow.db")
        done = subprocess.run(
            _sbatch(reference, tiny_shards), cwd=reference, env=_job(fi, reference, tmpdir, 0),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]

        proc = subprocess.Popen(
            _sbatch(cycled, tiny_shards), cwd=cycled, env=_job(fi, cycled, tmpdir, 0),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 300
            while not (cycled / "marks" / "2").exists():  # two steps trained
                assert proc.poll() is None, proc.communicate()[1][-3000:]
                assert time.monotonic() < deadline, "no second step within 300 s"
                time.sleep(0.01)
            os.kill(proc.pid, signal.SIGUSR1)  # --signal=B:USR1@300: the batch script alone gets it
            _, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        assert proc.returncode == 128 + signal.SIGUSR1, err[-3000:]
        assert "--ckpt_path auto: no readable checkpoint in" in err and "starting fresh" in err, err[-3000:]
        found = re.search(r"main.py: error: stopped by SIGUSR1 after step (\d+): saved (\S+);", err)
        assert found, err[-3000:]
        step = int(found.group(1))
        assert 2 <= step < STEPS and Path(found.group(2)) == _the_folder(cycled) / "last.ckpt"
        assert (cycled / "scontrol.log").read_text().split() == ["requeue", JOB_ID]
        assert f"requeueing job {JOB_ID}" in err

        requeued = subprocess.run(
            _sbatch(cycled, tiny_shards), cwd=cycled, env=_job(fi, cycled, tmpdir, 1),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert requeued.returncode == 0, requeued.stderr[-3000:]
        resumed = f"--ckpt_path auto: resuming from {_the_folder(cycled) / 'last.ckpt'} (step {step})"
        assert resumed in requeued.stderr, requeued.stderr[-3000:]
        assert (cycled / "scontrol.log").read_text().split() == ["requeue", JOB_ID]  # not requeued again
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)

    a, b = fi.final_state(_the_folder(reference)), fi.final_state(_the_folder(cycled))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)  # bitwise
    assert torch.load(_the_folder(cycled) / "last.ckpt", weights_only=True)["global_step"] == STEPS
    history = fi.loss_history(cycled)
    assert sorted(history) == list(range(STEPS)) and all(len(v) == 1 for v in history.values())
    assert history == fi.loss_history(reference)  # every step once, bitwise equal
    client = MlflowClient(f"sqlite:///{cycled / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED" and run.data.tags["stop_history"] == f"SIGUSR1 at step {step}"
