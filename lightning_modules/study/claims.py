"""The study's state lives in the MLflow store: which runs are done, which are claimed, which can be resumed.

A run of a protocol is the MLflow run tagged with its identity (`study.identity`, protocol.py). Its state:
- done: status FINISHED and a `test/loss` logged (fit and test both completed). Skipped.
- claimed: a runner holds it: tag `study.claim` names the runner (host:pid:nonce) and `study.heartbeat` (unix
  seconds) is refreshed every HEARTBEAT_S while it trains. Left alone.
- free: anything else (a run killed, failed, interrupted, or whose claim went stale). Taken over and resumed
  from its last checkpoint.

Claim rule (several runners, one machine or several sharing one tracking server):
- New run: a runner first searches for the identity; if none exists it creates the MLflow run with the
  identity tags and its claim, waits `settle_s`, then searches again. If several runs of the identity now
  exist (runners that created at the same moment), the one with the smallest run id wins and the others
  delete theirs. Safe as long as creating a run takes less than `settle_s` (default 2 s).
- Existing free run: the runner overwrites `study.claim` with its own, waits `settle_s`, and reads it back;
  only the runner whose name is still there proceeds (the last writer wins, the others see it and back off).
- Stale claims: a claim is stale when its heartbeat is older than `stale_after_s` (default 600 s, at least
  MIN_STALE_S: several missed heartbeats; keep the machines' clocks within a minute of each other), or at
  once when it names this host and both its runner and the worker the runner started (tag `study.worker`,
  host:pid) are gone: a runner killed with SIGKILL takes its worker with it (lock.py), but not in the same
  instant, and a worker that still trains must never get a twin. A runner that stops normally or on Ctrl-C
  releases its claims (heartbeat 0), so the next invocation resumes them immediately. Whatever the claim
  says, a worker refuses a run whose lock another worker holds (lock.py).
"""

from __future__ import annotations

import math
import os
import socket
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from lightning_modules.core.errors import ConfigError
from lightning_modules.study.protocol import TAG, RunSpec

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

HEARTBEAT_S = 30.0
# A live runner's heartbeat is up to HEARTBEAT_S (and a poll) old; a stale age below two beats would hand
# the runs of live runners to others.
MIN_STALE_S = 2 * HEARTBEAT_S
CLAIM, HEARTBEAT, CHECKPOINT_DIR = TAG + "claim", TAG + "heartbeat", TAG + "checkpoint_dir"
WORKER = TAG + "worker"  # host:pid of the worker process the claiming runner started
ORPHAN_GRACE_S = 10.0
# "ledger": done on another machine, recorded in the committed results ledger (ledger.py), absent from this store.
State = Literal["done", "ledger", "claimed", "free", "missing"]


@dataclass(frozen=True)
class Found:
    state: State
    run: Run | None

    @property
    def run_id(self) -> str | None:
        return self.run.info.run_id if self.run is not None else None


def runner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _client(uri: str) -> MlflowClient:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from mlflow import MlflowClient  # late and quiet: mlflow warns while it imports
    return MlflowClient(tracking_uri=uri)


def check_timing(settle_s: float, stale_after_s: float) -> None:
    """The claim rule's two waits, refused before anything is claimed when they cannot work."""
    if not (math.isfinite(settle_s) and settle_s >= 0):
        raise ConfigError(
            f"--settle-s {settle_s}: must be a number of seconds >= 0 (the wait after claiming; default 2)"
        )
    if not (math.isfinite(stale_after_s) and stale_after_s >= MIN_STALE_S):
        raise ConfigError(
            f"--stale-after-s {stale_after_s}: must be a number of seconds >= {MIN_STALE_S:g} (two heartbeats "
            "of a live runner; default 600)"
        )


def is_done(run: Run) -> bool:
    return run.info.status == "FINISHED" and "test/loss" in run.data.metrics


class Store:
    def __init__(
        self, uri: str, experiment: str, settle_s: float = 2.0, stale_after_s: float = 600.0
    ) -> None:
        check_timing(settle_s, stale_after_s)
        self.uri, self.settle_s, self.stale_after_s = uri, settle_s, stale_after_s
        self.client = _client(uri)
        self.experiment_id = self._experiment(experiment)
        self.me = runner_name()

    def _experiment(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:  # another runner created it between our lookup and create
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    # ----- reading -----------------------------------------------------------------------------------
    def runs_of(self, identity: str) -> list[Run]:
        return list(
            self.client.search_runs(
                [self.experiment_id], filter_string=f"tags.`{TAG}identity` = '{identity}'"
            )
        )

    def protocol_runs(self, protocol: str) -> dict[str, list[Run]]:
        """Every run of a protocol, by identity (one search for the whole plan, not one per run)."""
        by_identity: dict[str, list[Run]] = {}
        token = None
        while True:
            page = self.client.search_runs(
                [self.experiment_id], filter_string=f"tags.`{TAG}protocol` = '{protocol}'",
                max_results=1000, page_token=token,
            )  # fmt: skip
            for run in page:
                by_identity.setdefault(run.data.tags.get(TAG + "identity", ""), []).append(run)
            token = page.token
            if not token:
                return by_identity

    def claim_is_live(self, run: Run, now: float | None = None) -> bool:
        tags = run.data.tags
        claim, beat = tags.get(CLAIM, ""), tags.get(HEARTBEAT, "0")
        try:
            age = (now or time.time()) - float(beat)
        except ValueError:
            return False
        if not claim or age > self.stale_after_s:
            return False
        # A runner on this machine that is gone, and its worker too: no need to wait for the heartbeat to age.
        return not _gone_here(claim) or _outlives(tags.get(WORKER, ""))

    def classify(self, runs: list[Run]) -> Found:
        if not runs:
            return Found("missing", None)
        for run in runs:
            if is_done(run):
                return Found("done", run)
        for run in runs:
            if self.claim_is_live(run):
                return Found("claimed", run)
        # Several free runs of one identity only arise from a lost creation race that failed to clean up;
        # resume the oldest (it holds the most progress).
        return Found("free", min(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id)))

    # ----- claiming ----------------------------------------------------------------------------------
    def claim(self, spec: RunSpec, found: Found) -> Run | None:
        """Claim `spec` (found in state missing or free); the claimed run, or None if another runner won."""
        if found.state == "missing":
            return self._claim_new(spec)
        if found.state == "free" and found.run is not None:
            return self._take_over(found.run)
        return None

    def _claim_new(self, spec: RunSpec) -> Run | None:
        tags = {**spec.tags(), CLAIM: self.me, HEARTBEAT: str(time.time())}
        # MLflow's own source tag, which its logger sets on runs it creates: the CLI reads it to tell a resumed
        # run (parameters already logged, never logged again) from a new one.
        tags["mlflow.source.name"] = "lightning_modules/study/worker.py"
        mine = self.client.create_run(self.experiment_id, run_name=spec.name, tags=tags)
        time.sleep(self.settle_s)
        rivals = [r for r in self.runs_of(spec.identity) if r.info.run_id != mine.info.run_id]
        if any(is_done(r) for r in rivals) or any(r.info.run_id < mine.info.run_id for r in rivals):
            self.client.delete_run(mine.info.run_id)
            return None
        return self.client.get_run(mine.info.run_id)

    def _take_over(self, run: Run) -> Run | None:
        run_id = run.info.run_id
        self.client.set_tag(run_id, CLAIM, self.me)
        self.client.set_tag(run_id, HEARTBEAT, str(time.time()))
        time.sleep(self.settle_s)
        now = self.client.get_run(run_id)
        if now.data.tags.get(CLAIM) != self.me or is_done(now):
            return None
        self.client.update_run(run_id, status="RUNNING")
        return now

    def heartbeat(self, run_id: str) -> None:
        self.client.set_tag(run_id, HEARTBEAT, str(time.time()))

    def release(self, run_id: str) -> None:
        """Give a claim up at once (the run stays resumable from its checkpoint)."""
        run = self.client.get_run(run_id)
        if run.data.tags.get(CLAIM) == self.me:
            self.client.set_tag(run_id, HEARTBEAT, "0")
        if run.info.status == "RUNNING":
            self.client.set_terminated(run_id, status="KILLED")


def here(pid: int) -> str:
    """A process of this machine as the claim tags name it (host:pid)."""
    return f"{socket.gethostname()}:{pid}"


def _gone_here(name: str) -> bool:
    """Whether `name` (host:pid[:nonce], or empty) names no live process of this machine; a process of
    another machine cannot be seen from here, so it counts as live."""
    if not name:
        return True
    host, _, rest = name.partition(":")
    pid = rest.partition(":")[0]
    return host == socket.gethostname() and pid.isdigit() and not _alive(int(pid))


def _outlives(worker: str) -> bool:
    """Whether a worker whose runner is gone still lives after ORPHAN_GRACE_S: the kernel kills it when its
    runner dies (lock.py), but a rerun started at that moment can still see it tearing down."""
    if worker and worker.partition(":")[0] != socket.gethostname():
        return True  # another machine's: cannot be seen from here, so it lives
    deadline = time.monotonic() + ORPHAN_GRACE_S
    while not _gone_here(worker):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie answers signal 0 until it is reaped, which a container without an init may never do
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:  # ended between the two looks
        return False
    except (OSError, IndexError):  # no /proc (macOS): signal 0 is all there is
        return True
    return state not in ("Z", "X")
