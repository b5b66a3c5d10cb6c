"""Outage-tolerant MLflow writes: a client wrapper that keeps failed calls, in order, and sends them later.

Every write (metrics, parameters, tags, artifacts, the run's end) becomes an op, a JSON-able dict. While the
store answers, an op is sent at once. Once a send fails, that op and every later one wait in a FIFO queue and
training carries on; the queue is retried at the next write after a backoff (1 s, doubling up to 60 s), and sent
in order once the store answers. Memory is bounded: past `max_pending` ops the oldest move to the pending file
(JSON lines), which is sent first when the store returns. What cannot be sent by the end of the run stays in
that file; `python -m lightning_modules replay FILE` sends it (lightning_modules/commands/replay_pending.py).

Sending an op twice is harmless, so a call whose reply was lost can be retried: a metric keeps the timestamp
of its first attempt and MLflow stores a (key, step, timestamp, value) once; tags, an unchanged parameter, an
artifact and the final status overwrite themselves. Reads (get_run, search_*) and run creation are not
buffered: they pass through and fail as they would.

A pending file is handed around (shared clusters), so its contents are untrusted: `read_pending` checks every
line before anything is read, sent or deleted. Each op must have the shape this module writes, and each
artifact path, resolved (symlinks and `..`), must lie in a folder of its own inside the file's artifacts
folder (`<file stem>-artifacts/<folder>/<name>`); only such a folder is ever deleted. A process that dies
while appending can only cut the file's last line: that line is reported (`Pending.cut_line`), not refused,
and every line before it is sent; a damaged line anywhere else refuses the whole file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from lightning_modules.core.errors import UserError
from lightning_modules.core.files import write_text_atomic
from lightning_modules.tracking import store as tracking

log = logging.getLogger(__name__)

FORMAT = "lrkv-lab mlflow-pending 1"
# MLflow's log_batch limits: 1000 entities in all, 100 params, 100 tags.
MAX_BATCH, MAX_BATCH_PARAMS, MAX_BATCH_TAGS = 1000, 100, 100
FIRST_RETRY_S, MAX_RETRY_S = 1.0, 60.0


class PendingFileError(UserError, RuntimeError):
    """The pending file is missing, not one this module wrote, damaged, or names a path outside its own
    artifacts folder; the message names the file (and line) and what to do."""


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


@dataclass(frozen=True)
class Pending:
    """A pending file as read: its header, its ops (artifact paths resolved and absolute), each op's line as
    written (a rewrite keeps them byte for byte), and the number of a last line cut short (None if none)."""

    header: dict[str, Any]
    header_line: str
    ops: list[dict[str, Any]]
    lines: list[str]
    cut_line: int | None
    cut_text: str = ""


def artifact_root(path: Path) -> Path:
    """Where the kept copies of a pending file's artifacts live: `<file stem>-artifacts` beside it."""
    return path.parent.resolve() / f"{path.stem}-artifacts"


def kept_folder(root: Path, kept: Path) -> Path | None:
    """The folder of one kept copy (`root/<folder>`, the only thing replay deletes), or None when `kept`,
    resolved, is not at least two levels inside `root`."""
    try:
        parts = kept.resolve().relative_to(root.resolve()).parts
    except ValueError:
        return None
    return root.resolve() / parts[0] if len(parts) >= 2 else None


def _damaged(path: Path, number: int, what: str) -> PendingFileError:
    return PendingFileError(
        f"{path} line {number}: {what}; the file is damaged or was not written by a run "
        "(nothing was sent): fix or remove that line"
    )


def _pairs(value: Any, width: int, types: tuple[tuple[type, ...], ...]) -> bool:
    return isinstance(value, list) and all(
        isinstance(row, list)
        and len(row) == width
        and all(isinstance(x, t) and not isinstance(x, bool) for x, t in zip(row, types, strict=True))
        for row in value
    )


def _check_op(op: Any, path: Path, number: int) -> dict[str, Any]:
    """The op of one line if it has the shape this module writes (so sending it cannot fail on its form)."""
    if not isinstance(op, dict):
        raise _damaged(path, number, "not a JSON object")
    kind, run_id = op.get("op"), op.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        raise _damaged(path, number, "no run_id")
    number_ = (int, float)
    if kind == "batch":
        ok = (
            _pairs(op.get("metrics"), 4, ((str,), number_, (int,), (int,)))
            and _pairs(op.get("params"), 2, ((str,), (str,)))
            and _pairs(op.get("tags"), 2, ((str,), (str,)))
        )
    elif kind == "artifact":
        target = op.get("artifact_path")
        ok = isinstance(op.get("path"), str) and (target is None or isinstance(target, str))
        # The run's artifact folder is joined with this: no absolute path, no `..` out of it.
        if (
            ok
            and target is not None
            and (target.startswith(("/", "\\")) or ".." in PurePosixPath(target).parts)
        ):
            raise _damaged(path, number, f"artifact_path {target!r} leaves the run's artifact folder")
    elif kind == "terminated":
        ok = isinstance(op.get("status"), str) and isinstance(op.get("end_time"), int)
    else:
        raise _damaged(path, number, f"unknown op {kind!r}")
    if not ok:
        raise _damaged(path, number, f"a {kind!r} op without the fields this project writes")
    return op


def _confine(op: dict[str, Any], path: Path, number: int, root: Path) -> dict[str, Any]:
    """The artifact op with its path resolved, if that lies in a kept-copy folder of `root`."""
    kept = (path.parent.resolve() / op["path"]).resolve()
    if kept_folder(root, kept) is None:
        raise PendingFileError(
            f"{path} line {number}: artifact {op['path']!r} resolves to {kept}, not a kept copy inside the "
            f"file's own artifacts folder {root}; refused (nothing was sent or deleted): remove that line, or "
            "the file if you do not know where it came from"
        )
    return {**op, "path": str(kept)}


def read_pending(path: Path) -> Pending:
    """The pending file, every line checked (module docstring); raises PendingFileError naming the line."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PendingFileError(f"{path}: cannot read it as a pending MLflow file ({_one_line(e)})") from None
    # json.dumps escapes newlines, so "\n" ends every line; the last piece is "" unless the end was cut.
    *complete, tail = text.split("\n")
    header_line = complete[0] if complete else tail
    try:
        header = json.loads(header_line) if header_line.strip() else {}
    except (ValueError, RecursionError):  # not JSON, an integer past Python's digit limit, nesting too deep
        header = {}
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise PendingFileError(
            f"{path}: not a pending MLflow file (its first line is not a {FORMAT!r} header)"
        )
    if not isinstance(header.get("tracking_uri"), str):
        raise _damaged(path, 1, "the header names no tracking_uri")
    root = artifact_root(path)
    if root.is_symlink():  # its kept copies would be deleted wherever it points
        raise PendingFileError(
            f"{root} is a symbolic link, not the folder a run keeps its artifacts in; refused (nothing was "
            "sent or deleted): replace it by the real folder"
        )
    ops: list[dict[str, Any]] = []
    lines: list[str] = []
    cut_line, cut_text = None, ""
    numbered = list(enumerate(complete[1:], start=2))
    last = len(complete) + 1 if complete and tail else None  # a line with no newline after it
    if last is not None:
        numbered.append((last, tail))
    for number, line in numbered:
        if not line.strip():
            continue
        try:
            op = json.loads(line)
        except json.JSONDecodeError as e:
            if number == last:  # the append of a dying process: only the last line can be cut
                cut_line, cut_text = number, tail
                break
            raise _damaged(path, number, f"not JSON ({e.msg})") from None
        except (ValueError, RecursionError) as e:  # JSON no run writes: a 5,000-digit number, deep nesting
            raise _damaged(path, number, f"not a line a run writes ({type(e).__name__})") from None
        op = _check_op(op, path, number)
        ops.append(_confine(op, path, number, root) if op["op"] == "artifact" else op)
        lines.append(line)
    return Pending(header, header_line, ops, lines, cut_line, cut_text)


def check_kept_copies(path: Path, pending: Pending) -> None:
    """Every artifact the file names is there, and nothing inside a kept folder links outside the artifacts
    folder (a folder's contents are sent too); raises PendingFileError naming the first that is not."""
    root = artifact_root(path)
    for op in pending.ops:
        if op["op"] != "artifact":
            continue
        kept = Path(op["path"])
        if not kept.exists():
            raise PendingFileError(
                f"{path}: the kept copy {kept} of an artifact is missing (nothing was sent): restore it, or "
                "remove its line from the file"
            )
        inside = [Path(d) / n for d, dirs, files in os.walk(kept) for n in (*dirs, *files)]
        for entry in inside:
            if kept_folder(root, entry) is None:
                raise PendingFileError(
                    f"{path}: {entry} links to {entry.resolve()}, outside the file's artifacts folder {root}; "
                    "refused (nothing was sent or deleted): remove that link"
                )


def send_pending(
    client: MlflowClient, path: Path, pending: Pending, run_id: str | None = None
) -> tuple[int, BaseException | None]:
    """Send the file's ops in order (each to `run_id` instead, when given): the number sent, and the error
    that stopped the rest (None when all went). The file is rewritten only to drop what was sent, with the
    header and the remaining lines exactly as they were (a `run_id` is never written into it); it goes,
    with its artifacts folder, once everything is in. Kept copies are deleted only after the rewrite, so a
    crash in between leaves a spare copy, never a line whose copy is gone."""
    ops = [{**op, "run_id": run_id} for op in pending.ops] if run_id else pending.ops
    done, error = 0, None
    try:
        for group in _groups(ops):
            send(client, group)
            done += len(group)
    except Exception as e:  # the store refused or is away: keep what is left, report why
        error = e
    if done == len(ops):
        path.unlink(missing_ok=True)
        shutil.rmtree(artifact_root(path), ignore_errors=True)
    elif done:
        rest = "".join(line + "\n" for line in [pending.header_line, *pending.lines[done:]])
        write_text_atomic(path, rest + pending.cut_text)
    root = artifact_root(path)
    for op in pending.ops[:done]:
        folder = kept_folder(root, Path(op["path"])) if op["op"] == "artifact" else None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return done, error


def write_pending(path: Path, header: dict[str, Any], ops: list[dict[str, Any]], append: bool) -> None:
    """Write (or append to) a pending file; a fresh write goes through a temporary file so a crash never
    leaves half of one. An append after a cut last line (a process died appending) drops that line first:
    otherwise the next line would be glued to it, and a damaged line in the middle refuses the whole file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(op) + "\n" for op in ops)
    if append and path.exists():
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            cut = f.tell() > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"
        if not cut:
            with path.open("a") as f:
                f.write(lines)
            return
        text = path.read_text()
        kept = text[: text.rfind("\n") + 1]
        log.warning(
            "%s line %d was cut short by a process that died appending to it; that call is dropped",
            path,
            kept.count("\n") + 1,
        )
        write_text_atomic(path, kept + lines)
        return
    write_text_atomic(path, json.dumps(header) + "\n" + lines)


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
        self._file_ops = len(read_pending(self.pending_file).ops) if self.pending_file.exists() else 0
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
        pending = read_pending(self.pending_file)
        if pending.cut_line is not None:
            log.warning("%s line %d was cut short by a process that died writing it; that call is lost",
                        self.pending_file, pending.cut_line)  # fmt: skip
        done, error = send_pending(self._client, self.pending_file, pending)
        self._file_ops = len(pending.ops) - done
        if error is not None:
            raise error

    def _forget(self, op: dict[str, Any]) -> None:
        """A sent artifact's kept copy is no longer needed: its own folder goes, nothing above it."""
        folder = kept_folder(self._artifact_dir(), Path(op["path"])) if op["op"] == "artifact" else None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

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
