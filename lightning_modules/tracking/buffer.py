"""Outage-tolerant MLflow writes: a client wrapper that keeps failed calls, in order, and sends them later.

Every write (metrics, parameters, tags, artifacts, the run's end) becomes an op, a JSON-able dict. While the
store answers, an op is sent at once. Once a send fails, that op and every later one wait in a FIFO queue and
training carries on; the queue is retried at the next write after a backoff (1 s, doubling up to 60 s), and sent
in order once the store answers. Memory is bounded: past `max_pending` ops the oldest move to the pending file
(JSON lines), which is sent first when the store returns. What cannot be sent by the end of the run stays in
that file; `python -m lightning_modules.tracking_replay FILE` sends it (lightning_modules/tracking_replay.py).

Sending an op twice is harmless, so a call whose reply was lost can be retried: a metric keeps the timestamp
of its first attempt and MLflow stores a (key, step, timestamp, value) once; tags, an unchanged parameter, an
artifact and the final status overwrite themselves. Reads (get_run, search_*) and run creation are not
buffered: they pass through and fail as they would.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections import deque
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from data.atomic import write_text_atomic
from lightning_modules.tracking import store as tracking

log = logging.getLogger(__name__)

FORMAT = "lrkv-lab mlflow-pending 1"
# MLflow's log_batch limits: 1000 entities in all, 100 params, 100 tags.
MAX_BATCH, MAX_BATCH_PARAMS, MAX_BATCH_TAGS = 1000, 100, 100
FIRST_RETRY_S, MAX_RETRY_S = 1.0, 60.0


class PendingFileError(RuntimeError):
    """The pending file is missing, not one this module wrote, or damaged."""


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def batch_op(run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> dict[str, Any]:
    return {
        "op": "batch",
        "run_id": run_id,
        "metrics": [[m.key, m.value, m.timestamp, m.step] for m in metrics],
        "params": [[p.key, str(p.value)] for p in params],
        "tags": [[t.key, str(t.value)] for t in tags],
    }


def _fits(group: list[dict[str, Any]], op: dict[str, Any]) -> bool:
    """Whether a batch op can join a group of batch ops of its run in one request: within MLflow's limits,
    and no tag or parameter key twice (a later value must not race an earlier one inside one request)."""
    head = group[0]
    if op["op"] != "batch" or head["op"] != "batch" or head["run_id"] != op["run_id"]:
        return False
    params = [k for o in (*group, op) for k, _ in o["params"]]
    tags = [k for o in (*group, op) for k, _ in o["tags"]]
    metrics = sum(len(o["metrics"]) for o in (*group, op))
    return (
        metrics + len(params) + len(tags) <= MAX_BATCH
        and len(params) <= MAX_BATCH_PARAMS
        and len(tags) <= MAX_BATCH_TAGS
        and len(set(params)) == len(params)
        and len(set(tags)) == len(tags)
    )


def _groups(ops: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive batch ops of one run merged into requests (one request after an outage instead of one
    per step); any other op is a group of its own. Order is kept."""
    groups: list[list[dict[str, Any]]] = []
    for op in ops:
        if groups and _fits(groups[-1], op):
            groups[-1].append(op)
        else:
            groups.append([op])
    return groups


def send(client: MlflowClient, group: list[dict[str, Any]]) -> None:
    """Send one group of ops (see _groups); raises whatever the client raises."""
    head = group[0]
    if head["op"] == "batch":
        client.log_batch(
            head["run_id"],
            metrics=[Metric(k, v, ts, step) for op in group for k, v, ts, step in op["metrics"]],
            params=[Param(k, v) for op in group for k, v in op["params"]],
            tags=[RunTag(k, v) for op in group for k, v in op["tags"]],
        )
    elif head["op"] == "artifact":
        path = Path(head["path"])
        if path.is_dir():
            client.log_artifacts(head["run_id"], str(path), head["artifact_path"])
        else:
            client.log_artifact(head["run_id"], str(path), head["artifact_path"])
    elif head["op"] == "terminated":
        client.set_terminated(head["run_id"], head["status"], head["end_time"])
    else:
        raise PendingFileError(f"unknown op {head['op']!r}")


def read_pending(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the ops of a pending file; artifact paths made absolute."""
    try:
        lines = path.read_text().splitlines()
        header = json.loads(lines[0]) if lines else {}
        ops = [json.loads(line) for line in lines[1:] if line.strip()]
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PendingFileError(f"{path}: cannot read it as a pending MLflow file ({_one_line(e)})") from None
    if header.get("format") != FORMAT:
        raise PendingFileError(
            f"{path}: not a pending MLflow file (its first line is not a {FORMAT!r} header)"
        )
    for op in ops:
        if op.get("op") == "artifact":
            op["path"] = str(path.parent / op["path"])
    return header, ops


def write_pending(path: Path, header: dict[str, Any], ops: list[dict[str, Any]], append: bool) -> None:
    """Write (or append to) a pending file; a fresh write goes through a temporary file so a crash never
    leaves half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(op) for op in ops]
    if append and path.exists():
        with path.open("a") as f:
            f.write("".join(line + "\n" for line in lines))
        return
    write_text_atomic(path, "".join(line + "\n" for line in [json.dumps(header), *lines]))


class BufferedClient:
    """An MlflowClient whose writes survive an unreachable store (see the module docstring).

    `pending_file` is where ops go past `max_pending` and at the end (`save`); artifacts waiting to be sent
    are copied beside it, since the caller's file may be temporary.
    """

    def __init__(
        self,
        client: MlflowClient,
        tracking_uri: str,
        pending_file: Path,
        max_pending: int = 10_000,
        max_retry_interval: float = MAX_RETRY_S,
    ) -> None:
        tracking.fail_fast_http()
        self._client = client
        self.tracking_uri = tracking_uri
        self.pending_file = pending_file.absolute()
        self._max_pending = max_pending
        self._queue: deque[dict[str, Any]] = deque()
        self._file_ops = len(read_pending(self.pending_file)[1]) if self.pending_file.exists() else 0
        self._max_retry = max_retry_interval
        self._retry_at = 0.0
        self._backoff = min(FIRST_RETRY_S, max_retry_interval)
        self._outage = False
        self._artifacts = 0
        self.last_error: str | None = None

    def __getattr__(self, name: str) -> Any:  # reads and everything not buffered
        return getattr(self._client, name)

    @property
    def pending(self) -> int:
        return len(self._queue) + self._file_ops

    # -- writes -------------------------------------------------------------------------------------------
    def log_batch(self, run_id: str, metrics: Any = (), params: Any = (), tags: Any = (), **_: Any) -> None:
        self._submit(batch_op(run_id, metrics or (), params or (), tags or ()))

    def log_metric(
        self,
        run_id: str,
        key: str,
        value: float,
        timestamp: int | None = None,
        step: int | None = None,
        **_: Any,
    ) -> None:
        ts = timestamp if timestamp is not None else int(time.time() * 1000)
        self._submit(batch_op(run_id, metrics=[Metric(key, value, ts, step or 0)]))

    def log_param(self, run_id: str, key: str, value: Any, **_: Any) -> None:
        self._submit(batch_op(run_id, params=[Param(key, str(value))]))

    def set_tag(self, run_id: str, key: str, value: Any, **_: Any) -> None:
        self._submit(batch_op(run_id, tags=[RunTag(key, str(value))]))

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        self._submit({"op": "artifact", "run_id": run_id, "path": local_path, "artifact_path": artifact_path})

    def log_artifacts(self, run_id: str, local_dir: str, artifact_path: str | None = None) -> None:
        self.log_artifact(run_id, local_dir, artifact_path)

    def set_terminated(self, run_id: str, status: str | None = None, end_time: int | None = None) -> None:
        end = end_time if end_time is not None else int(time.time() * 1000)
        self._submit({"op": "terminated", "run_id": run_id, "status": status or "FINISHED", "end_time": end})

    # -- queue ----------------------------------------------------------------------------------------------
    def _submit(self, op: dict[str, Any]) -> None:
        if not self.pending:
            try:
                send(self._client, [op])
                return
            except Exception as e:  # the store is away (or refused): keep the op, training goes on
                self._failed(e)
        self._enqueue(op)
        if time.monotonic() >= self._retry_at:
            self.flush()

    def _enqueue(self, op: dict[str, Any]) -> None:
        if op["op"] == "artifact":
            op = {**op, "path": str(self._keep_copy(Path(op["path"])))}
        self._queue.append(op)
        if len(self._queue) > self._max_pending:  # bounded memory: the oldest half goes to the file
            spill = [self._queue.popleft() for _ in range(len(self._queue) // 2)]
            self._append_to_file(spill)

    def _keep_copy(self, source: Path) -> Path:
        self._artifacts += 1
        folder = self._artifact_dir() / f"{time.time_ns()}-{self._artifacts}"
        folder.mkdir(parents=True)
        target = folder / source.name
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)
        return target

    def _artifact_dir(self) -> Path:
        return self.pending_file.with_name(self.pending_file.stem + "-artifacts")

    def _header(self) -> dict[str, Any]:
        return {"format": FORMAT, "tracking_uri": self.tracking_uri}

    def _relative(self, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        base = self.pending_file.parent.resolve()
        return [
            {**op, "path": str(Path(op["path"]).resolve().relative_to(base))}
            if op["op"] == "artifact"
            else op
            for op in ops
        ]

    def _append_to_file(self, ops: list[dict[str, Any]]) -> None:
        write_pending(self.pending_file, self._header(), self._relative(ops), append=True)
        self._file_ops += len(ops)

    def _failed(self, error: BaseException) -> None:
        self.last_error = _one_line(error)
        if not self._outage:  # one line when an outage starts, not one per step
            self._outage = True
            log.warning(
                "MLflow store %s is not answering (%s); log calls are held and retried, training goes on",
                self.tracking_uri,
                self.last_error,
            )
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self._max_retry)

    def flush(self) -> bool:
        """Send everything held, oldest first (the file, then memory). True when nothing is left."""
        held = self.pending
        try:
            if self._file_ops:
                self._flush_file()
            while self._queue:
                group = _groups(list(self._queue)[: MAX_BATCH + 1])[0]
                send(self._client, group)
                for _ in group:
                    self._forget(self._queue.popleft())
        except Exception as e:
            self._failed(e)
            return False
        if self._outage:
            log.warning("MLflow store %s answers again; %d held log calls sent", self.tracking_uri, held)
        self._outage, self._retry_at = False, 0.0
        self._backoff = min(FIRST_RETRY_S, self._max_retry)
        return True

    def _flush_file(self) -> None:
        _, ops = read_pending(self.pending_file)
        done = 0
        try:
            for group in _groups(ops):
                send(self._client, group)
                done += len(group)
                for op in group:
                    self._forget(op)
        finally:
            rest = ops[done:]
            if rest:
                write_pending(self.pending_file, self._header(), self._relative(rest), append=False)
            else:
                self.pending_file.unlink(missing_ok=True)
                shutil.rmtree(self._artifact_dir(), ignore_errors=True)
            self._file_ops = len(rest)

    def _forget(self, op: dict[str, Any]) -> None:
        """A sent artifact's kept copy is no longer needed."""
        if op["op"] == "artifact" and self._artifact_dir() in Path(op["path"]).parents:
            shutil.rmtree(Path(op["path"]).parent, ignore_errors=True)

    def drain(self, timeout_s: float) -> bool:
        """Try to send everything for up to timeout_s (at least once). True when nothing is left."""
        deadline = time.monotonic() + timeout_s
        while not self.flush():
            wait = min(self._retry_at, deadline) - time.monotonic()
            if time.monotonic() >= deadline:
                return False
            time.sleep(max(wait, 0.05))
        return True

    def save(self) -> Path | None:
        """Move what is held in memory to the pending file; its path, or None when nothing is pending."""
        if self._queue:
            self._append_to_file(list(self._queue))
            self._queue.clear()
        return self.pending_file if self._file_ops else None
