"""A fit asked to stop by a signal (lightning_modules/training/signals.py), through the real `main.py fit`
with loader workers: SIGTERM to its whole process group, as SLURM's scancel and preemption send it, or Ctrl-C
(SIGINT to the process group too, as a terminal sends it; data/datamodule.py's workers leave both to the fit),
after a few steps. The fit saves the step it is in (the only checkpoint before the end here), ends its MLflow
run KILLED with `stopped_by` and `stopped_at_step`, prints one line naming the checkpoint, and exits 128 + the
signal's number; resumed from that checkpoint it ends with the uninterrupted run's weights (bitwise) and
per-step losses, each step logged once. Outside training a signal stops at once; SIGUSR1 stops a fit under
SLURM too."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from lightning_modules.training import signals
from tests.conftest import TINY_SEQ_LEN
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
# No checkpoint of the fit's own before the end, so the one at the signal is the stop's; not 100, which
# conf/base.yaml's checkpoint callback has (two callbacks alike cannot share a checkpoint).
EVERY = 50
MARKS = "tests.training.signal_callbacks.MarkSteps"


@pytest.fixture(scope="module")
def fi() -> ModuleType:
    return load_script("scripts/fault_injection.py", "fault_injection")


def _fit(fi: ModuleType, shards: Path, workdir: Path, extra: list[str]) -> list[str]:
    return fi.fit_command(shards, STEPS, TINY_SEQ_LEN, workdir / "ck", extra, every=EVERY)


def _run(fi: ModuleType, cmd: list[str], workdir: Path) -> subprocess.CompletedProcess[str]:
    tmpdir = fi.process_tmpdir(workdir.name)
    try:
        return subprocess.run(
            cmd, cwd=workdir, env=fi._env(workdir, tmpdir), capture_output=True, text=True, timeout=600
        )
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


@pytest.fixture(scope="module")
def reference(fi: ModuleType, tiny_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("uninterrupted")
    done = _run(fi, _fit(fi, tiny_shards, workdir, []), workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir


def _the_run(workdir: Path) -> Run:
    client = MlflowClient(f"sqlite:///{workdir / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return run


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "group"), [(signal.SIGTERM, True), (signal.SIGINT, True)], ids=["sigterm-to-the-group", "ctrl-c"]
)
def test_signal_saves_the_step_marks_the_run_and_resumes_exactly(
    fi: ModuleType, reference: Path, tiny_shards: Path, tmp_path: Path, sig: signal.Signals, group: bool
) -> None:
    marks, ckpt = tmp_path / "marks", tmp_path / "ck"
    tmpdir = fi.process_tmpdir("signalled")
    cmd = _fit(
        fi, tiny_shards, tmp_path, [f"--trainer.callbacks+={MARKS}", "--trainer.callbacks.folder", str(marks)]
    )
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=fi._env(tmp_path, tmpdir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=group,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (marks / "2").exists():  # two steps trained: stop in the third (or at the second's end)
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no second step within 300 s"
            time.sleep(0.01)
        if group:  # a scheduler or a terminal: the whole process group, loader workers too
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        shutil.rmtree(tmpdir, ignore_errors=True)

    assert proc.returncode == 128 + sig, err[-3000:]
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    found = re.search(rf"main.py: error: stopped by {sig.name} after step (\d+): saved (\S+);", lines[0])
    assert found, lines[0]
    step, saved = int(found.group(1)), found.group(2)
    assert 2 <= step < STEPS and saved == str(ckpt / "last.ckpt"), lines[0]
    assert f"--ckpt_path {saved}" in lines[0]
    assert torch.load(saved, map_location="cpu", weights_only=True)["global_step"] == step
    assert (ckpt / f"epoch=0-step={step}.ckpt").is_file()
    run = _the_run(tmp_path)
    assert run.info.status == "KILLED"
    assert run.data.tags["stopped_by"] == sig.name and run.data.tags["stopped_at_step"] == str(step)
    history = fi.loss_history(tmp_path)
    assert sorted(history) == list(range(step)) and all(len(v) == 1 for v in history.values())

    done = _run(fi, _fit(fi, tiny_shards, tmp_path, ["--ckpt_path", saved]), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = fi.final_state(reference / "ck"), fi.final_state(ckpt)
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)  # bitwise
    assert fi.loss_history(tmp_path) == fi.loss_history(reference)  # every step once, bitwise equal
    run = _the_run(tmp_path)
    assert run.info.status == "FINISHED" and "stopped_by" not in run.data.tags
    assert run.data.tags["stop_history"] == f"{sig.name} at step {step}"


def test_a_signal_outside_training_stops_at_once_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def body() -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler raises in here
        return 0

    before, started = signal.getsignal(signal.SIGTERM), time.monotonic()
    assert signals.run_stoppable(body, "prog") == 143
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "prog: error: stopped by SIGTERM outside a training step: nothing new to save; run the command again"
    ]
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back
    assert [signals.exit_code(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)] == [143, 130, 138]


def test_sigusr1_stops_the_fit_under_slurm_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """SLURM's warning before the time limit (scripts/slurm/train.sbatch) is ours, not Lightning's requeue."""
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    assert signals.stop_signals() == (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "lrkv-lab")
    assert signals.stop_signals() == (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


@pytest.mark.slow
def test_a_test_stopped_by_sigterm_ends_its_run_killed_and_exits_143(
    tiny_shards: Path, mlflow_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`main.py test` stopped by a signal: one line, 128 + SIGTERM, and its MLflow run KILLED (not FAILED)."""
    import main as entry  # the repository root is on sys.path (pyproject.toml's pytest pythonpath)
    from tests.training.helpers import args

    assert entry.run(args("fit", tiny_shards, "mha", "--trainer.max_steps", "2")) == 0
    (ckpt,) = Path.cwd().glob("checkpoints/**/last.ckpt")  # mlflow_uri runs this test in tmp_path
    code = entry.run(args("test", tiny_shards, "mha", "--ckpt_path", str(ckpt), "--trainer.callbacks+="
                          "tests.training.signal_callbacks.TermAtFirstTestBatch"))  # fmt: skip
    err = capsys.readouterr().err
    assert code == 128 + signal.SIGTERM and err.count(": error: ") == 1, err[-2000:]
    client = MlflowClient(mlflow_uri)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], order_by=["start_time DESC"]
    )
    assert runs[0].info.status == "KILLED" and runs[0].data.tags["stopped_by"] == "SIGTERM"
