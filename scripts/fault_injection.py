"""Fault injection: SIGKILL (or SIGTERM) a fit at K random moments (some during a checkpoint write), resume it
from its last.ckpt each time, and compare with one uninterrupted run of the same command.

    python scripts/fault_injection.py --kills 20 --steps 30 --data-dir artifacts/shakespeare-32 --json
    python scripts/fault_injection.py --kills 4 --steps 10 --signal mixed --data-dir ... --json

`--signal kill` (the default) sends SIGKILL: the process dies where it is. `--signal term` sends SIGTERM, which
a fit answers by saving the step it is in and exiting 143 (lightning_modules/training/signals.py): the script
checks that exit code, and that last.ckpt is then at the step the fit names, past the one it resumed from.
`--signal mixed` sends SIGKILL, SIGKILL, SIGTERM, SIGTERM, ... so each signal meets both kinds of moment.

Both runs use the real CLI (`main.py fit`), loader workers and a checkpoint every step; each gets its own
folder (SQLite MLflow store, checkpoints). Compared: every tensor of the final checkpoint's state_dict
(bitwise) and every logged `train/loss` (each step, including steps logged twice because the process died
after logging but before its checkpoint: all values of a step must equal the uninterrupted run's).

Kill moments: odd kills at a uniformly random time after the run has made progress past its resume point,
even kills as soon as a checkpoint write has begun: when its temporary file appears beside the checkpoint
(lightning_modules/checkpoint/local_io.py). Each process gets its own TMPDIR; `--tmpdir-root /dev/shm` puts
them on another filesystem than the checkpoints, the layout where a write through TMPDIR would tear.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lightning_modules.tracking.store import EXPERIMENT  # the experiment main.py fit logs to

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Outcome:
    kills: int = 0
    kills_during_write: int = 0
    sigterms: int = 0  # of the kills, those sent as SIGTERM (each answered by exit 143 and a checkpoint)
    processes: int = 0
    steps: int = 0
    weights_identical: bool = False
    max_abs_weight_diff: float = 0.0
    losses_identical: bool = False
    steps_logged_twice: int = 0
    loss_mismatches: list[str] = field(default_factory=list)
    seconds: float = 0.0


CHECKPOINT_CALLBACK = "lightning_modules.checkpoint.callback.EndOfFitModelCheckpoint"


def fit_command(
    data_dir: Path,
    steps: int,
    seq_len: int,
    ckpt_dir: Path,
    extra: list[str],
    callback: str = CHECKPOINT_CALLBACK,
    every: int = 1,
) -> list[str]:
    """The fit both runs make; `callback` is the checkpoint callback's class (a test swaps in one that kills),
    `every` the steps between two checkpoints."""
    return [
        sys.executable, str(ROOT / "main.py"), "fit",
        "--config", str(ROOT / "conf/base.yaml"), "--config", str(ROOT / "conf/model/nano.yaml"),
        "--config", str(ROOT / "conf/attention/lrkv.yaml"),
        "--model.arch.seq_len", str(seq_len), "--data.data_dir", str(data_dir),
        "--data.batch_size", "4", "--data.num_workers", "2", "--trainer.max_steps", str(steps),
        "--trainer.precision", "32-true", "--trainer.limit_val_batches", "0",
        "--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "1",
        f"--trainer.callbacks+={callback}",
        "--trainer.callbacks.every_n_train_steps", str(every), "--trainer.callbacks.save_top_k", "-1",
        "--trainer.callbacks.save_last", "true", "--trainer.callbacks.dirpath", str(ckpt_dir), *extra,
    ]  # fmt: skip


# --tmpdir-root: where each fit's TMPDIR is made (default: the system's temp folder). On another filesystem than
# the work folder (e.g. /dev/shm) it is the cluster's layout, local /tmp beside shared checkpoints, where a
# checkpoint written through TMPDIR and moved into place would be a copy, not a rename.
TMPDIR_ROOT: Path | None = None


def process_tmpdir(name: str) -> Path:
    """A new TMPDIR for one fit, under the system's temp folder (or TMPDIR_ROOT) rather than inside the work
    folder: loader workers hand batches over sockets named under TMPDIR, and a deep one makes that path too long
    for the kernel (data/worker_tempdir.py). Remove it with shutil.rmtree when the process is gone."""
    return Path(tempfile.mkdtemp(prefix=f"fault-injection-{name}-", dir=TMPDIR_ROOT))


def _env(workdir: Path, tmpdir: Path) -> dict[str, str]:
    tmpdir.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlruns' / 'mlflow.db'}",
        "TMPDIR": str(tmpdir),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def _saved_steps(ckpt_dir: Path) -> int:
    """Highest step among the checkpoints (names like epoch=0-step=12.ckpt)."""
    best = 0
    for path in ckpt_dir.glob("*step=*.ckpt"):
        stem = path.stem.rsplit("step=", 1)[-1].split("-")[0].split("v")[0]
        if stem.isdigit():
            best = max(best, int(stem))
    return best


def run_uninterrupted(workdir: Path, data_dir: Path, steps: int, seq_len: int) -> Path:
    """One fit to the end; returns its checkpoint folder."""
    ckpt_dir, tmpdir = workdir / "ck", process_tmpdir("reference")
    cmd = fit_command(data_dir, steps, seq_len, ckpt_dir, [])
    try:
        subprocess.run(cmd, cwd=workdir, env=_env(workdir, tmpdir), check=True, capture_output=True)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return ckpt_dir


SIGNALS = {"kill": "K", "term": "T", "mixed": "KKTT"}  # the signal of kill i: pattern[i % len(pattern)]


def kill_signal(mode: str, index: int) -> signal.Signals:
    pattern = SIGNALS[mode]
    return signal.SIGTERM if pattern[index % len(pattern)] == "T" else signal.SIGKILL


def run_with_kills(
    workdir: Path,
    data_dir: Path,
    steps: int,
    seq_len: int,
    kills: int,
    rng: random.Random,
    mode: str = "kill",
) -> tuple[Path, int, int, int]:
    """Fit with `kills` SIGKILLs (or SIGTERMs, `mode`) and a resume after each; returns the checkpoint folder,
    the kills done, those during a write, and the processes started."""
    ckpt_dir = workdir / "ck"
    done = during_write = processes = 0
    while True:
        resume = ckpt_dir / "last.ckpt"
        extra = ["--ckpt_path", str(resume)] if resume.exists() else []
        tmpdir = process_tmpdir(f"process{processes}")
        proc = subprocess.Popen(
            fit_command(data_dir, steps, seq_len, ckpt_dir, extra),
            cwd=workdir,
            env=_env(workdir, tmpdir),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        processes += 1
        start_step = _saved_steps(ckpt_dir)
        # Not start_step: a SIGKILL between a step's file and last.ckpt leaves last.ckpt a step behind.
        resumed_at = _global_step(resume) if resume.exists() else 0
        try:
            killed = False
            if done < kills:
                in_write, sig = done % 2 == 0, kill_signal(mode, done)
                killed = _wait_and_kill(proc, ckpt_dir, start_step, steps, in_write, rng, kills - done, sig)
            _, err = proc.communicate()  # reads the pipe too: a SIGTERMed fit still writes as it ends
            if killed:
                done += 1
                during_write += in_write
                if sig == signal.SIGKILL or _check_stopped(proc, err.decode(), ckpt_dir, resumed_at, steps):
                    continue
        finally:
            if proc.poll() is None:  # an error in this script: leave no fit running
                proc.kill()
            proc.wait()
            shutil.rmtree(tmpdir, ignore_errors=True)
        if proc.returncode != 0:
            raise RuntimeError(f"fit exited {proc.returncode}: {err.decode()[-2000:]}")
        if _saved_steps(ckpt_dir) >= steps:
            return ckpt_dir, done, during_write, processes


def _global_step(path: Path) -> int:
    import torch  # the script's own imports stay light; only these checks and the comparison need torch

    return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])


def _check_stopped(proc: subprocess.Popen, err: str, ckpt_dir: Path, resumed_at: int, steps: int) -> bool:
    """A SIGTERMed fit exits 143 after saving the step it was in: last.ckpt is at the step its one line names,
    past the step it resumed from. True; False when the signal came in the last step and the fit finished
    (exit 0, every step saved)."""
    if proc.returncode == 0 and _saved_steps(ckpt_dir) >= steps:
        return False
    stopped = re.search(r"stopped by SIGTERM after step (\d+): saved", err)
    if proc.returncode != 128 + signal.SIGTERM or stopped is None:
        raise RuntimeError(f"SIGTERM: fit exited {proc.returncode}, not 143 naming its step: {err[-2000:]}")
    step, last = int(stopped.group(1)), _global_step(ckpt_dir / "last.ckpt")
    if not resumed_at < step == last:
        raise RuntimeError(
            f"SIGTERM: stopped after step {step}, resumed at {resumed_at}, last.ckpt at {last}"
        )
    return True


def _wait_and_kill(
    proc: subprocess.Popen,
    ckpt_dir: Path,
    start_step: int,
    steps: int,
    in_write: bool,
    rng: random.Random,
    kills_left: int = 1,
    sig: signal.Signals = signal.SIGKILL,
) -> bool:
    """Kill `proc` as soon as its first checkpoint write begins (in_write), or a random moment after it saved
    a randomly chosen step before the last. The moments follow the run's own checkpoints rather than the
    clock, so the kills land the same way on a fast and on a loaded machine. The random step is drawn from
    the remaining steps' share per kill left, so that all K kills fit in the run. False when it finished
    first. The caller waits for the process (a SIGTERMed fit saves the step it is in, then exits 143)."""
    if in_write:  # a new temporary file beside the checkpoint (lightning_modules/checkpoint/local_io.py);
        left = set(ckpt_dir.glob(".*.ckpt.*.partial"))  # a killed save's is no sign: the next save removes it
        while not set(ckpt_dir.glob(".*.ckpt.*.partial")) - left:
            if proc.poll() is not None:
                return False
            time.sleep(0.0005)
    else:
        share = (steps - start_step - 1) // max(1, kills_left)
        target = start_step + rng.randint(1, max(1, share))
        while _saved_steps(ckpt_dir) < target:
            if proc.poll() is not None:
                return False
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.02))  # inside the next step: it trains and saves for longer than this
    if proc.poll() is not None:
        return False
    os.kill(proc.pid, sig)
    return True


def loss_history(workdir: Path) -> dict[int, list[float]]:
    """train/loss values by step, over every run of the store (a resumed fit continues its run)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None, f"no {EXPERIMENT} experiment in {workdir}"
    history: dict[int, list[float]] = {}
    for run in client.search_runs([experiment.experiment_id]):
        for metric in client.get_metric_history(run.info.run_id, "train/loss"):
            history.setdefault(metric.step, []).append(metric.value)
    return history


def final_state(ckpt_dir: Path) -> dict:
    import torch

    return torch.load(ckpt_dir / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def compare(reference: Path, killed: Path, ref_ckpt: Path, killed_ckpt: Path, outcome: Outcome) -> None:
    a, b = final_state(ref_ckpt), final_state(killed_ckpt)
    assert a.keys() == b.keys()
    outcome.max_abs_weight_diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    outcome.weights_identical = all(a[k].equal(b[k]) for k in a)
    ref, got = loss_history(reference), loss_history(killed)
    outcome.steps = len(ref)
    outcome.steps_logged_twice = sum(len(v) > 1 for v in got.values())
    for step in sorted(set(ref) | set(got)):
        if len(ref.get(step, [])) != 1 or set(got.get(step, [])) != set(ref[step]):
            outcome.loss_mismatches.append(
                f"step {step}: uninterrupted {ref.get(step)}, killed {got.get(step)}"
            )
    outcome.losses_identical = not outcome.loss_mismatches


def run(
    workdir: Path, data_dir: Path, steps: int, seq_len: int, kills: int, seed: int, mode: str = "kill"
) -> Outcome:
    start = time.perf_counter()
    outcome = Outcome()
    (workdir / "reference").mkdir(parents=True, exist_ok=True)
    (workdir / "killed").mkdir(parents=True, exist_ok=True)
    ref_ckpt = run_uninterrupted(workdir / "reference", data_dir, steps, seq_len)
    killed_ckpt, outcome.kills, outcome.kills_during_write, outcome.processes = run_with_kills(
        workdir / "killed", data_dir, steps, seq_len, kills, random.Random(seed), mode
    )
    outcome.sigterms = sum(kill_signal(mode, i) == signal.SIGTERM for i in range(outcome.kills))
    compare(workdir / "reference", workdir / "killed", ref_ckpt, killed_ckpt, outcome)
    outcome.seconds = time.perf_counter() - start
    return outcome


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seq-len", type=int, default=32, help="the shards' seq_len")
    p.add_argument("--data-dir", type=Path, required=True, help="shards prepared with this --seq-len")
    p.add_argument("--workdir", type=Path, default=None, help="default: a new temporary folder")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    p.add_argument(
        "--signal", choices=sorted(SIGNALS), default="kill", help="SIGKILL, SIGTERM, or both in turn (mixed)"
    )
    p.add_argument(
        "--tmpdir-root", type=Path, default=None, help="make each fit's TMPDIR here (another filesystem)"
    )
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    global TMPDIR_ROOT
    TMPDIR_ROOT = a.tmpdir_root

    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="fault-injection-"))
    outcome = run(workdir, a.data_dir.resolve(), a.steps, a.seq_len, a.kills, a.seed, a.signal)
    print(json.dumps(asdict(outcome), indent=2) if a.json else outcome)
    return 0 if outcome.weights_identical and outcome.losses_identical else 1


if __name__ == "__main__":
    sys.exit(main())
