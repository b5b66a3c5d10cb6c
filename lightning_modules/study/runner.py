"""Run a protocol's runs that are not done yet, N at a time, each in its own worker process (worker.py).

Before a run starts it is claimed in the tracking store (store.py); a run found free with a checkpoint resumes
from it, so the study can be stopped (Ctrl-C, a kill, a reboot) and restarted at any time with the same
command. Progress: one line when a run starts and one when it ends, with how many are left and an estimate
of the time that takes; each worker's own output goes to train.log in its checkpoint folder.

A worker dies with its runner (lock.py), so a runner killed even with SIGKILL leaves nothing training, and
the claim names the worker too (store.py): a run is never taken over while a worker of this machine still
trains it. The worker also locks its run (lock.py), so a second worker on one run never trains.

A run the committed results ledger records as done (results/<protocol>/runs.csv, ledger.py) is done wherever
it ran: a fresh machine with an empty store trains only the rest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lightning_modules.checkpoint.newest import LAST, newest_readable
from lightning_modules.core import precision
from lightning_modules.core.errors import ConfigError
from lightning_modules.study import ledger as ledgers
from lightning_modules.study import lock, settings, timing
from lightning_modules.study.claims import CHECKPOINT_DIR, HEARTBEAT_S, WORKER, Found, Store, here
from lightning_modules.study.protocol import RESUMED_UTC, ROOT, TAG, UTC_FORMAT, Protocol, RunSpec
from lightning_modules.tracking.runs import git_commit

POLL_S = 1.0
# How long a rerun waits for an orphaned worker (lock.orphaned) to go before it leaves the run for later.
ORPHAN_WAIT_S = 60.0


@dataclass
class Active:
    spec: RunSpec
    number: int
    run_id: str
    proc: subprocess.Popen[bytes]
    log: Path
    started: float
    beat: float


def machine() -> str:
    """The CPU model and core count (and the GPU, added by the worker's device tag), for results/."""
    return f"{precision.cpu_name()}, {os.cpu_count()} cores"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Runner:
    def __init__(
        self,
        protocol: Protocol,
        store: Store,
        workers: int = 1,
        checkpoints: Path = Path("checkpoints"),
        command: str = "",
        ledger: Path | None = None,
        max_runs: int | None = None,
        hours: float | None = None,
    ) -> None:
        if workers < 1:
            raise ConfigError(f"--workers {workers}: must be >= 1 (runs trained at once)")
        if max_runs is not None and max_runs < 1:
            raise ConfigError(f"--max-runs {max_runs}: must be >= 1 (runs started this time)")
        if hours is not None and not (0 < hours < float("inf")):
            raise ConfigError(f"--hours {hours}: must be a number of hours > 0 (how long this machine stays)")
        self.max_runs, self.hours = max_runs, hours
        self.protocol, self.store, self.workers = protocol, store, workers
        self.checkpoints = checkpoints.resolve() / "study" / protocol.name
        self.threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // workers))
        self.command = command or f"python -m lightning_modules study {protocol.path} --workers {workers}"
        self.durations: list[float] = []
        self.failed: list[tuple[RunSpec, Path]] = []
        self.ledger = ledger if ledger is not None else ledgers.default_folder(protocol.name)
        rows = ledgers.done_rows(self.ledger)
        specs = {spec.identity: spec.identity_fields() for spec in protocol.runs}
        ledgers.check_identities(self.ledger / ledgers.RUNS, rows, specs)
        self.in_ledger = ledgers.settings_of(rows)
        # --hours: runs end by this time (set when run() starts), timed by the done runs of machines like this one.
        self.deadline: float | None = None
        self.here = timing.Machine(machine(), precision.detect().capability, workers)
        self.timed: list[timing.Done] = []

    def say(self, text: str) -> None:
        print(text, flush=True)

    # ----- the plan ----------------------------------------------------------------------------------
    def survey(self) -> list[tuple[RunSpec, Found]]:
        """Every run of the protocol with its state; ConfigError when a done run was trained with other
        settings than the protocol gives now (settings.py)."""
        by_identity = self.store.protocol_runs(self.protocol.name)
        plan = [(s, self._classify(s, by_identity.get(s.identity, []))) for s in self.protocol.runs]
        settings.check(
            self.protocol, [(s, self._recorded(s, f)) for s, f in plan if f.state in ("done", "ledger")]
        )
        return plan

    def _recorded(self, spec: RunSpec, found: Found) -> str:
        """The settings recorded with a done run: its tag in the store, else its ledger row."""
        if found.state == "done" and found.run is not None:
            return found.run.data.tags.get(TAG + "settings", "")
        return self.in_ledger.get(spec.identity, "")

    def _classify(self, spec: RunSpec, runs: list) -> Found:
        """The store's state of a run, except that a run the committed ledger records as done is done (on
        another machine) unless this store holds it done itself."""
        found = self.store.classify(runs)
        if found.state != "done" and spec.identity in self.in_ledger:
            return Found("ledger", found.run)
        return found

    def describe(self, plan: list[tuple[RunSpec, Found]]) -> str:
        p = self.protocol
        states = ("done", "ledger", "claimed", "free", "missing")
        counts = {state: sum(f.state == state for _, f in plan) for state in states}
        head = (
            f"study {p.name}: {len(plan)} runs ({len(p.sizes)} size(s) x {len(p.labels)} arms x {len(p.seeds)} "
            f"seeds), experiment {p.experiment!r} in {self.store.uri}"
        )
        body = (
            f"  done {counts['done'] + counts['ledger']} ({counts['ledger']} of them on other machines: in the "
            f"ledger {_rel(self.ledger)}), running elsewhere {counts['claimed']}, to run "
            f"{counts['free'] + counts['missing']} ({counts['free']} of them interrupted before: resumed)"
        )
        return head + "\n" + body

    # ----- running -----------------------------------------------------------------------------------
    def run(self) -> int:
        plan = self.survey()
        self.say(self.describe(plan))
        todo = [(s, f) for s, f in plan if f.state in ("missing", "free")]
        total, done_before = len(plan), sum(f.state in ("done", "ledger") for _, f in plan)
        if self.max_runs is not None and len(todo) > self.max_runs:
            later = todo[self.max_runs :]
            todo = todo[: self.max_runs]
            self.say(f"  --max-runs {self.max_runs}: {len(later)} left for a later run, from "
                     f"{later[0][0].size} {later[0][0].label} seed {later[0][0].seed}")  # fmt: skip
        if not todo:
            self.say("  nothing to run" + ("" if done_before < total else ": every run is done"))
            return 0
        self.say(
            f"  {self.workers} worker(s), {self.threads} thread(s) each; checkpoints in {self.checkpoints}"
        )
        active: list[Active] = []
        finished = 0
        queue = list(todo)
        if self.hours is not None:
            self.deadline = time.time() + self.hours * 3600
            self.timed = timing.from_ledger(self.ledger)
        try:
            while queue or active:
                while queue and len(active) < self.workers:
                    if not self._fits(queue[0][0], len(queue)):
                        queue.clear()
                        break
                    spec, _ = queue.pop(0)
                    started = self._start(spec, done_before + finished + len(active) + 1, total)
                    if started is not None:
                        active.append(started)
                time.sleep(POLL_S)
                for job in list(active):
                    code = job.proc.poll()
                    if code is None:
                        if time.time() - job.beat > HEARTBEAT_S:
                            self.store.heartbeat(job.run_id)
                            job.beat = time.time()
                        continue
                    active.remove(job)
                    finished += 1
                    self._finish(job, code, left=len(queue) + len(active))
        except KeyboardInterrupt:
            self._stop(active)
            self.say(
                "\nstopped: run the same command again to continue (interrupted runs resume from checkpoints)"
            )
            return 130
        return self._summary()

    def _start(self, spec: RunSpec, number: int, total: int) -> Active | None:
        # Re-read just before claiming: another runner may have taken or finished it since the survey.
        found = self._classify(spec, self.store.runs_of(spec.identity))
        if found.state in ("done", "ledger", "claimed"):
            what = (
                "done on another machine (in the ledger)"
                if found.state == "ledger"
                else f"{found.state} elsewhere"
            )
            self.say(f"[skip  {number}/{total}] {spec.size} {spec.label} seed {spec.seed}: {what}")
            return None
        # A worker of this machine may still hold the run though its claim went stale (an orphan of a runner
        # killed where workers cannot follow it): leave it be, without claiming. The worker checks again. One
        # whose runner is gone, or that is itself exiting, lets go within seconds: wait for it.
        held = _holder(found)
        if held and (lock.orphaned(held) or lock.exiting(held)):
            self.say(f"  {spec.size} {spec.label} seed {spec.seed}: waiting for the worker (pid {held}) of a "
                     "killed runner to exit")  # fmt: skip
            held = _wait_free(found, ORPHAN_WAIT_S)
        if held is not None:
            self.say(
                f"[skip  {number}/{total}] {spec.size} {spec.label} seed {spec.seed}: a worker (pid {held}) "
                "still trains it; run again once it has stopped"
            )
            return None
        run = self.store.claim(spec, found)
        if run is None:
            self.say(
                f"[skip  {number}/{total}] {spec.size} {spec.label} seed {spec.seed}: claimed by another runner"
            )
            return None
        run_id = run.info.run_id
        folder = Path(run.data.tags.get(CHECKPOINT_DIR) or self.checkpoints / f"{spec.name}-{run_id[:8]}")
        client = self.store.client
        client.set_tag(run_id, CHECKPOINT_DIR, str(folder))
        client.set_tag(run_id, TAG + "machine", machine())
        client.set_tag(run_id, TAG + "command", self.command)
        folder.mkdir(parents=True, exist_ok=True)
        newest = newest_readable(folder)  # an unreadable last.ckpt is set aside, never resumed from
        for line in newest.skipped:
            self.say(f"{spec.name}: {line}")
        cmd = [sys.executable, "-m", "lightning_modules", "study-worker", "--run-id", run_id]
        cmd += ["--runner-pid", str(os.getpid())]
        cmd += ["--checkpoint-dir", str(folder), "--every", str(self.protocol.checkpoint_every)]
        how = "new"
        if found.state == "free":  # an earlier attempt was stopped: this one resumes or restarts it
            # When this attempt began: the run's wall time (MLflow's start to end) counts from its first claim,
            # pauses between sessions included; from here to the end is what this attempt alone took.
            client.set_tag(run_id, RESUMED_UTC, time.strftime(UTC_FORMAT, time.gmtime()))
        if newest.path is not None:
            cmd += ["--resume", str(newest.path)]
            how = (
                "resuming from its last checkpoint"
                if newest.path.name == LAST
                else f"resuming from {newest.path}"
            )
        elif found.state == "free":
            unreadable = " readable" if newest.skipped else ""
            how = f"restarting: no{unreadable} checkpoint in {folder} on this machine"
            # Nothing of the earlier attempt is kept, so the code that trains the run is this tree's; and its
            # wall time counts from the first claim (MLflow's start time), pause included: marked resumed, so
            # timing.py plans with this attempt's time (RESUMED_UTC above) rather than that wall time.
            client.set_tag(run_id, "git_commit", git_commit())
            client.set_tag(run_id, TAG + "resumed_from_step", "0")
        cmd += ["--", *spec.cli_args()]
        env = {**os.environ, "MLFLOW_TRACKING_URI": self.store.uri, "OMP_NUM_THREADS": self.threads}
        env["PYTHONUNBUFFERED"] = "1"  # the log shows progress as it happens
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        log = folder / "train.log"
        with log.open("ab") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
            out.flush()
            # stdin: a pipe this runner holds open and never writes; the worker exits when it ends (lock.py).
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env)
        client.set_tag(run_id, WORKER, here(proc.pid))
        self.say(
            f"[start {number}/{total}] {spec.size} {spec.label} seed {spec.seed} ({how}; run {run_id[:8]}, log {log})"
        )
        now = time.time()
        return Active(spec, number, run_id, proc, log, now, now)

    def _finish(self, job: Active, code: int, left: int) -> None:
        spec, took = job.spec, time.time() - job.started
        where = f"{spec.size} {spec.label} seed {spec.seed}"
        if job.proc.stdin is not None:  # the worker's runner pipe (lock.py): one descriptor per run otherwise
            job.proc.stdin.close()
        if code == lock.LOCKED_EXIT:  # another worker holds the run: it is not ours to release or retry
            self.say(f"[skip  {job.number}] {where}: another worker trains it ({_last_line(job.log)})")
            return
        run = self.store.client.get_run(job.run_id)
        if code == 0 and "test/loss" in run.data.metrics:
            self.durations.append(took)
            self.timed.append(timing.Done(spec.size, spec.label, self.here, took))
            eta = sum(self.durations) / len(self.durations) * left / self.workers
            ce = run.data.metrics["test/loss"]
            tail = f"{left} left, about {_duration(eta)} to go" if left else "none left"
            self.say(f"[done  {job.number}] {where}: test CE {ce:.4f} in {_duration(took)}; {tail}")
            return
        self.store.release(job.run_id)
        self.failed.append((spec, job.log))
        self.say(
            f"[FAIL  {job.number}] {where}: exit code {code} after {_duration(took)}; see {job.log}: {_last_line(job.log)}"
        )

    def _fits(self, spec: RunSpec, left: int) -> bool:
        """Whether `spec` is expected to end before --hours runs out (timing.py); True without --hours, and
        True, with a warning, when no run like it has been timed on a machine like this one."""
        if self.deadline is None:
            return True
        where = f"{spec.size} {spec.label} seed {spec.seed}"
        expected = timing.expect(self.timed, spec.size, spec.label, self.here)
        if expected is None:
            self.say(f"  --hours: no {spec.size} run has finished on a machine like this one "
                     f"({self.here.name}, {self.here.kind}, {self.workers} worker(s)), so {where} is untimed: "
                     "starting it")  # fmt: skip
            return True
        remaining = self.deadline - time.time()
        if expected.seconds <= remaining:
            return True
        self.say(f"  --hours {self.hours:g}: {where} would take about {_duration(expected.seconds)} "
                 f"({expected.basis}) and {_duration(max(remaining, 0))} are left, so it and the "
                 f"{left - 1} after it are left for a later run")  # fmt: skip
        return False

    def _stop(self, active: list[Active]) -> None:
        for job in active:
            if job.proc.poll() is None:
                job.proc.terminate()
        for job in active:
            try:
                job.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                job.proc.kill()
                job.proc.wait()
            self.store.release(job.run_id)

    def _summary(self) -> int:
        plan = self.survey()
        done = sum(f.state in ("done", "ledger") for _, f in plan)
        elsewhere = [s for s, f in plan if f.state == "claimed"]
        self.say(f"study {self.protocol.name}: {done}/{len(plan)} runs done")
        if elsewhere:
            self.say(
                f"  {len(elsewhere)} still claimed by other runners; run again later to take over any they abandon"
            )
        for spec, log in self.failed:
            self.say(
                f"  failed: {spec.size} {spec.label} seed {spec.seed} (log {log}); run again to retry it"
            )
        if done == len(plan):
            self.say(f"  report: python -m lightning_modules study {self.protocol.path} --report")
        return 1 if self.failed else 0


def _wait_free(found: Found, seconds: float) -> int | None:
    """The lock's holder once it is free (None) or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    held = _holder(found)
    while held is not None and time.monotonic() < deadline:
        time.sleep(0.2)
        held = _holder(found)
    return held


def _holder(found: Found) -> int | None:
    """The pid of the process that holds the run's lock in its checkpoint folder, None when free."""
    folder = found.run.data.tags.get(CHECKPOINT_DIR) if found.run is not None else None
    return lock.holder(Path(folder)) if folder else None


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _last_line(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1][-300:] if lines else "empty log"
