"""The study runner under faults: a runner killed with SIGKILL takes its worker with it and the rerun resumes
the run with one worker (lock.py, store.py), a run another worker holds is never trained twice, and bad
protocols and options end in one line before anything is claimed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from lightning_modules.commands.run_study import main as study_main
from lightning_modules.study import claims as store_module
from lightning_modules.study import lock
from lightning_modules.study import protocol as protocols
from lightning_modules.study.claims import CHECKPOINT_DIR, CLAIM, HEARTBEAT, WORKER, Store, here
from lightning_modules.tracking.runs import git_commit
from tests.one_line import Case, assert_each_ends_in_one_line
from tests.study.helpers import MICRO_FLOPS, micro_protocol

ROOT = Path(__file__).resolve().parents[2]
STUDY = ["-m", "lightning_modules", "study"]


def one_run_protocol(folder: Path, shards: Path, budget: float = MICRO_FLOPS) -> Path:
    """The micro protocol with one arm and one seed: a single run (45 steps at MICRO_FLOPS)."""
    path = micro_protocol(folder, shards, arms="[{kind: mha}]", budget=budget)
    path.write_text(path.read_text().replace("seeds: [1, 2]", "seeds: [1]"))
    return path


def dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ----- one line, before anything is claimed ----------------------------------------------------------------
@pytest.mark.slow
def test_bad_protocols_and_options_end_in_one_line_before_any_claim(
    tiny_shards: Path, tmp_path: Path, mlflow_uri: str
) -> None:
    good = one_run_protocol(tmp_path, tiny_shards)
    text = good.read_text()

    def variant(name: str, old: str, new: str) -> str:
        assert old in text
        path = tmp_path / f"{name}.yaml"
        path.write_text(text.replace(old, new))
        return str(path)

    syntax = variant("syntax", "arms: [{kind: mha}]", "arms: [{kind: mha}")
    description = text.splitlines()[0]
    assert description.startswith("description: ")
    tagged = variant(
        "tagged", description, 'description: !!python/object/apply:os.system ["echo unsafe-code-ran"]'
    )
    seeds = variant("seeds", "seeds: [1]", "seeds: 3")
    p = str(good)
    cases: list[Case] = [
        ("protocol YAML syntax error", [*STUDY, syntax], {}, [syntax, "YAML syntax error", "line ", "fix"]),
        ("protocol !!python tag", [*STUDY, tagged], {}, [tagged, "!!python/object/apply", "refused"]),
        ("protocol seeds: 3", [*STUDY, seeds], {}, [seeds, "`seeds` must be a list", "seeds: [1, 2, 3]"]),
        ("--settle-s -1", [*STUDY, p, "--settle-s", "-1"], {}, ["--settle-s", "-1", ">= 0"]),
        ("--settle-s nan", [*STUDY, p, "--settle-s", "nan"], {}, ["--settle-s", "nan", ">= 0"]),
        ("--settle-s text", [*STUDY, p, "--settle-s", "soon"], {}, ["--settle-s", "soon", ">= 0"]),
        ("--stale-after-s -5", [*STUDY, p, "--stale-after-s", "-5"], {}, ["--stale-after-s", ">= 0"]),
        ("--stale-after-s 10", [*STUDY, p, "--stale-after-s", "10"], {}, ["--stale-after-s", ">= 60"]),
        ("--workers 0", [*STUDY, p, "--workers", "0"], {}, ["--workers", "0", ">= 1"]),
        ("--max-runs 0", [*STUDY, p, "--max-runs", "0"], {}, ["--max-runs", "0", ">= 1"]),
    ]
    assert_each_ends_in_one_line(cases, tmp_path)
    # Nothing was claimed: the store holds no run of the protocol (not even its experiment).
    from mlflow import MlflowClient  # the store's own client, only to look

    experiment = MlflowClient(mlflow_uri).get_experiment_by_name("micro")
    assert experiment is None or not MlflowClient(mlflow_uri).search_runs([experiment.experiment_id])
    assert not (tmp_path / "checkpoints").exists()


# ----- the claim rule: stale at once only when the runner and its worker are both gone ----------------------
def test_a_claim_whose_runner_died_stays_live_while_its_worker_lives(
    tiny_shards: Path, tmp_path: Path, mlflow_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "ORPHAN_GRACE_S", 0.5)  # how long a live worker is waited for
    spec = protocols.load(one_run_protocol(tmp_path, tiny_shards)).runs[0]
    store = Store(mlflow_uri, "micro", settle_s=0)
    run = store.claim(spec, store.classify(store.runs_of(spec.identity)))
    assert run is not None
    run_id = run.info.run_id
    gone = here(dead_pid())
    store.client.set_tag(run_id, CLAIM, f"{gone}:deadbeef")  # its runner was SIGKILLed

    def state() -> str:
        return store.classify(store.runs_of(spec.identity)).state

    store.client.set_tag(run_id, WORKER, here(os.getpid()))  # ... but its worker still trains
    assert state() == "claimed"
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # ended, never reaped: a zombie
    try:
        deadline = time.monotonic() + 60
        while Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        store.client.set_tag(run_id, WORKER, here(zombie.pid))
        assert state() == "free"  # a zombie trains nothing
    finally:
        zombie.wait()
    store.client.set_tag(run_id, WORKER, here(dead_pid()))
    assert state() == "free"
    store.client.set_tag(run_id, WORKER, f"elsewhere:{os.getpid()}")  # another machine's: cannot be seen
    assert state() == "claimed"


# ----- the run's lock ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_second_worker_on_a_locked_run_trains_nothing(tmp_path: Path, mlflow_uri: str) -> None:
    folder = tmp_path / "run"
    assert lock.holder(folder) is None
    with lock.hold(folder, "abc"):
        assert lock.holder(folder) == os.getpid()
        with pytest.raises(lock.RunLockedError, match=f"pid {os.getpid()}"):
            lock.hold(folder, "abc")
        worker = [sys.executable, "-m", "lightning_modules", "study-worker", "--run-id", "abc"]
        worker += ["--checkpoint-dir", str(folder), "--every", "1", "--", "--never-parsed"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(worker, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == lock.LOCKED_EXIT, done.stderr
        (line,) = [ln for ln in done.stderr.splitlines() if ": error: " in ln]
        assert f"another worker (pid {os.getpid()}) is training it" in line and str(folder) in line
        assert "Traceback" not in done.stderr
        # A worker whose runner is not its parent (the runner died before the worker started) trains nothing.
        orphan = subprocess.run(
            [*worker[:6], "--runner-pid", str(dead_pid()), *worker[6:]],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert orphan.returncode == 2 and "runner pid" in orphan.stderr and "is gone" in orphan.stderr
    assert lock.holder(folder) is None  # the lock ends with its holder


def _released_run(tmp_path: Path, shards: Path, mlflow_uri: str) -> tuple[Path, Store, Any, Path]:
    """The one-run protocol's run, claimed, given a checkpoint folder ("orphan") and released again."""
    path = one_run_protocol(tmp_path, shards)
    spec = protocols.load(path).runs[0]
    store = Store(mlflow_uri, "micro", settle_s=0)
    run = store.claim(spec, store.classify(store.runs_of(spec.identity)))
    assert run is not None
    folder = tmp_path / "orphan"
    store.client.set_tag(run.info.run_id, CHECKPOINT_DIR, str(folder))
    store.release(run.info.run_id)
    return path, store, run, folder


@pytest.mark.slow
def test_the_runner_leaves_a_run_alone_while_another_worker_holds_it(
    tiny_shards: Path, tmp_path: Path, mlflow_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, store, run, folder = _released_run(tmp_path, tiny_shards, mlflow_uri)  # its claim is gone ...
    with lock.hold(folder, run.info.run_id):  # ... but a worker still trains it (an orphan)
        assert study_main([str(path), "--settle-s", "0"]) == 0
    out = capsys.readouterr().out
    assert f"a worker (pid {os.getpid()}) still trains it" in out and "[start" not in out
    assert store.client.get_run(run.info.run_id).data.tags[CLAIM] == store.me  # not even claimed


def _lock_holder(folder: Path, runner_pid: int, seconds: float) -> subprocess.Popen[str]:
    """A stand-in worker started for `runner_pid`: it holds the run's lock for `seconds` once it prints."""
    code = (
        "import sys, time; from pathlib import Path; from lightning_modules.study import lock; "
        f"held = lock.hold(Path({str(folder)!r}), 'abc'); print('held', flush=True); time.sleep({seconds})"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code, "--runner-pid", str(runner_pid)], env=env,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_a_worker_whose_runner_is_gone_is_orphaned_and_one_of_a_live_runner_is_not(tmp_path: Path) -> None:
    alive = _lock_holder(tmp_path / "a", os.getpid(), 30)  # this process started it: its runner lives
    orphan = _lock_holder(tmp_path / "b", dead_pid(), 30)  # its runner is gone: it is on its way out
    try:
        assert not lock.orphaned(alive.pid) and lock.orphaned(orphan.pid)
        assert not lock.orphaned(os.getpid())  # not a worker at all
        assert not lock.orphaned(dead_pid())  # no such process
        assert lock.exiting(dead_pid()) and not lock.exiting(alive.pid) and not lock.exiting(os.getpid())
    finally:
        for proc in (alive, orphan):
            proc.kill()
            proc.wait()


def test_a_zombie_lock_holder_counts_as_exiting() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while not lock.exiting(proc.pid):  # exited, not yet reaped: a zombie
            assert time.monotonic() < deadline, "the child never became a zombie"
            time.sleep(0.05)
        assert Path(f"/proc/{proc.pid}").exists()
    finally:
        proc.wait()


@pytest.mark.slow
def test_a_rerun_waits_for_an_orphaned_worker_to_exit_and_then_restarts_the_run_retagged(
    tiny_shards: Path, tmp_path: Path, mlflow_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, store, run, folder = _released_run(tmp_path, tiny_shards, mlflow_uri)
    store.client.set_tag(run.info.run_id, "git_commit", "0000000-dirty")  # the tree of the first claim
    orphan = _lock_holder(folder, dead_pid(), 3)  # a killed runner's worker, still going for 3 s
    try:
        assert study_main([str(path), "--settle-s", "0"]) == 0
    finally:
        orphan.kill()
        orphan.wait()
    out = capsys.readouterr().out
    assert f"waiting for the worker (pid {orphan.pid}) of a killed runner to exit" in out, out
    assert "[start 1/1]" in out and "still trains it" not in out, out
    assert f"restarting: no checkpoint in {folder} on this machine" in out, out
    done = store.client.get_run(run.info.run_id)
    assert "test/loss" in done.data.metrics
    # No checkpoint, so nothing of the first claim trained it: this tree's commit, and its wall time (from the
    # first claim) marked as holding a pause, as a resumed run's is (timing.py plans with its last attempt instead).
    # (The sha only: another test may write into the tree meanwhile and flip "-dirty".)
    assert done.data.tags["git_commit"].partition("-")[0] == git_commit().partition("-")[0] != "0000000"
    assert done.data.tags["study.resumed_from_step"] == "0"
    first_claim = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(done.info.start_time / 1000))
    assert done.data.tags["study.resumed_utc"] >= first_claim  # when the restart began, after the first claim


@pytest.mark.slow
def test_max_runs_starts_only_that_many_and_a_later_run_takes_the_rest(
    tiny_shards: Path, tmp_path: Path, mlflow_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = micro_protocol(tmp_path, tiny_shards, arms="[{kind: mha}]")  # seeds 1 and 2: two runs
    args = [str(path), "--settle-s", "0"]
    assert study_main([*args, "--max-runs", "1", "--hours", "5"]) == 0
    out = capsys.readouterr().out
    assert "--max-runs 1: 1 left for a later run, from nano mha seed 2" in out, out
    # Nothing timed on this machine yet (tests/study/test_timing.py has the timed case): it starts, with a word.
    assert "--hours: no nano run has finished on a machine like this one" in out, out
    assert "[start 1/2] nano mha seed 1" in out and "seed 2 (" not in out, out
    assert "study micro: 1/2 runs done" in out, out
    assert study_main(args) == 0  # the rest, as the next machine would
    out = capsys.readouterr().out
    assert "[start 2/2] nano mha seed 2" in out and "study micro: 2/2 runs done" in out, out


# ----- the must-show fault: SIGKILL the runner, not its worker ---------------------------------------------
class _Workers:
    """Every study worker process on this machine, by run id, sampled until stopped: the most at once."""

    def __init__(self) -> None:
        self.most: Counter[str] = Counter()
        self.seen: dict[str, set[int]] = {}
        self.crowds: list[str] = []  # what two workers on one run looked like, for the failure message
        self.first: dict[int, float] = {}  # when each worker was first and last seen (monotonic)
        self.last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def now(self) -> dict[str, set[int]]:
        parents: dict[str, dict[int, int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if b"study-worker" in argv and b"--run-id" in argv:  # python -m lightning_modules study-worker
                run_id = argv[argv.index(b"--run-id") + 1].decode()
                parents.setdefault(run_id, {})[int(entry.name)] = parent
        # A worker's own fork (a subprocess between fork and exec) carries its command line: part of it.
        return {run: {p for p, parent in pids.items() if parent not in pids} for run, pids in parents.items()}

    def _watch(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            for run_id, pids in self.now().items():
                for pid in pids:
                    self.first.setdefault(pid, now)
                    self.last[pid] = now
                self.most[run_id] = max(self.most[run_id], len(pids))
                if len(pids) > 1:
                    self.crowds.append(" | ".join(_describe(pid) for pid in sorted(pids)))
                self.seen.setdefault(run_id, set()).update(pids)
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _describe(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} state {stat[0]} parent {stat[1]}: {argv[:300]}"


@pytest.mark.slow
def test_a_runner_killed_with_sigkill_takes_its_worker_and_the_rerun_trains_each_step_once(
    tiny_shards: Path, tmp_path: Path, mlflow_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Twice the micro budget: the killed runner's worker, were it left alone, would still train when the
    # rerun's worker starts.
    path = one_run_protocol(tmp_path, tiny_shards, budget=2 * MICRO_FLOPS)
    (spec,) = protocols.load(path).runs
    args = [str(path), "--settle-s", "0"]
    store = Store(mlflow_uri, "micro")
    workers = _Workers()
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        runner = subprocess.Popen([sys.executable, *STUDY, *args], cwd=tmp_path, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 300
            while True:  # until the worker trains: its first checkpoint is written
                runs = store.runs_of(spec.identity)
                folder = runs[0].data.tags.get(CHECKPOINT_DIR) if runs else None
                if folder and (Path(folder) / "last.ckpt").exists():
                    break
                assert runner.poll() is None, "the study exited before its first checkpoint"
                assert time.monotonic() < deadline, "no checkpoint within 300 s"
                time.sleep(0.05)
        finally:
            runner.kill()  # SIGKILL, the runner alone: no one signals its worker
            runner.wait()
            killed_at = time.monotonic()
        (run,) = store.runs_of(spec.identity)
        assert study_main(args) == 0  # at once, as a user's rerun would
    finally:
        workers.stop()
    # Only this run's workers: other tests and people may train on this machine at the same time.
    assert workers.most[run.info.run_id] == 1, workers.crowds[:3]  # one worker on the run at any time
    first, *later = sorted(workers.seen[run.info.run_id], key=workers.first.__getitem__)
    assert workers.last[first] - killed_at < 15, "the killed runner's worker trained on without it"
    out = capsys.readouterr().out
    assert re.search(r"\[start 1/1\] nano mha seed 1 \(resuming from its last checkpoint", out), out
    assert len(later) == 1  # the killed runner's worker, then the rerun's
    (done,) = store.runs_of(spec.identity)
    assert done.info.run_id == run.info.run_id and done.info.status == "FINISHED"
    assert "test/loss" in done.data.metrics and int(done.data.tags["study.resumed_from_step"]) >= 1
    history = store.client.get_metric_history(done.info.run_id, "train/loss")
    twice = sorted(step for step, n in Counter(m.step for m in history).items() if n > 1)
    assert history and twice == [], f"steps logged more than once: {twice}"
    assert {m.step for m in history} == set(range(len(history)))  # every step, once


def test_a_worker_exits_when_its_runner_pipe_ends_and_not_before(tmp_path: Path) -> None:
    """The portable half of dying with the runner (systems without prctl): the end of the stdin pipe."""
    child = (
        "import os, sys, time; from lightning_modules.study import lock; lock.die_with_runner(os.getppid())"
    )
    child += "; time.sleep(float(sys.argv[1])); print('finished')"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def start(seconds: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", child, seconds], stdin=subprocess.PIPE, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip

    slow = start("600")
    assert slow.stdout is not None and slow.stdin is not None
    time.sleep(0.5)  # the watcher is up once the child has imported lock.py; either way it reads the end
    slow.stdin.close()
    assert slow.wait(timeout=120) == 1
    assert "the runner is gone" in slow.stdout.read()
    normal = start("0.2")
    assert normal.stdout is not None
    assert normal.wait(timeout=120) == 0 and "finished" in normal.stdout.read()  # exits cleanly: no abort
    assert normal.stdin is not None
    normal.stdin.close()


@pytest.mark.slow
def test_a_run_whose_last_checkpoint_is_truncated_restarts_and_finishes(
    tiny_shards: Path, tmp_path: Path, mlflow_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An interrupted run whose only checkpoint was torn (a kill mid-save): the rerun sets it aside in one line,
    trains the run from step 0 and finishes it, instead of failing it on every rerun."""
    path = micro_protocol(tmp_path, tiny_shards, arms="[{kind: mha}]", budget=MICRO_FLOPS / 4)
    args = [str(path), "--settle-s", "0", "--max-runs", "1", "--ledger", str(tmp_path / "no-ledger")]
    assert study_main(args) == 0
    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("micro").experiment_id])
    folder = Path(run.data.tags[CHECKPOINT_DIR])
    last = folder / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # torn
    client.set_terminated(run.info.run_id, "KILLED")  # interrupted, as far as the store knows,
    client.set_tag(run.info.run_id, HEARTBEAT, "0")  # by a runner gone long ago (its claim is stale)
    capsys.readouterr()
    assert study_main(args) == 0
    out = capsys.readouterr().out
    assert "last.ckpt" in out and "kept as last.ckpt.unreadable-" in out, out
    assert f"restarting: no readable checkpoint in {folder}" in out, out
    done = client.get_run(run.info.run_id)
    assert done.info.status == "FINISHED" and "test/loss" in done.data.metrics
    assert len(list(folder.glob("last.ckpt.unreadable-*"))) == 1  # the torn file kept, not deleted
