"""Send the MLflow calls a run could not send (its tracking store was away at the end) into the run.

The calls go in their original order and the file (and its kept artifacts) is removed once all are in. A
call sent twice is stored once (lightning_modules/tracking/buffer.py), so a replay cut short can simply be
run again: it resumes from the first call not yet sent. The command: `python -m lightning_modules replay`.

The file is checked whole before the first call goes (lightning_modules/tracking/buffer.py, `read_pending`):
a damaged line, or an artifact path outside the file's own artifacts folder, refuses it with nothing sent or
deleted. `tracking_uri` and `run_id` redirect this replay only: the file keeps its own store and run ids,
and is rewritten only to drop what was sent, so a replay cut short is resumed with the same options. A last
line cut short (the run died while appending to the file) cannot be sent: the lines before it are, and the
result says which line was lost (`Replayed.warning`); the command still exits 0, since nothing more can be
sent from that file.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lightning_modules.core.errors import UserError, one_line
from lightning_modules.tracking import store as tracking
from lightning_modules.tracking.buffer import (
    PendingFileError,
    check_kept_copies,
    read_pending,
    send_pending,
)

# The stores this project logs to (docs/tracking.md): never MLflow's deprecated file store.
STORE_SCHEMES = ("sqlite:///", "http://", "https://")


class ReplayError(UserError, RuntimeError):
    """The store did not take the calls, or the options name no store or run; the message says what to do."""


@dataclass(frozen=True)
class Replayed:
    path: Path
    sent: int
    cut_line: int | None  # the number of a last line cut short, lost

    @property
    def warning(self) -> str | None:
        if self.cut_line is None:
            return None
        return (
            f"{self.path} line {self.cut_line} was cut short (the run died while writing it), so that call "
            f"is lost; the {self.sent} complete calls before it were sent"
        )


def store_uri(tracking_uri: str | None, header_uri: str) -> str:
    """The store to send to: `tracking_uri` (a relative SQLite path taken against the working directory), else
    the one in the file; refused unless it is an SQLite store or a server."""
    uri = tracking.resolve_tracking_uri(tracking_uri) if tracking_uri else header_uri
    if not uri.startswith(STORE_SCHEMES):
        where = "--tracking-uri" if tracking_uri else "the pending file's header"
        raise ReplayError(
            f"{where} names {uri!r}, not an MLflow store this project logs to: give "
            "--tracking-uri sqlite:///PATH/mlflow.db or --tracking-uri http://HOST:PORT"
        )
    return uri


def replay(path: Path, tracking_uri: str | None = None, run_id: str | None = None) -> Replayed:
    """Send every call in the pending file (to `tracking_uri` / `run_id` instead, for this replay only).
    Raises PendingFileError (the file) or ReplayError (the store, the options)."""
    from mlflow.tracking import MlflowClient  # late: mlflow takes seconds to import; --help need not wait

    if not path.is_file():
        raise PendingFileError(f"{path}: no such pending MLflow file; give the path the run printed")
    if run_id is not None and not run_id.strip():
        raise ReplayError("--run-id is empty: give the id of the run to send the calls to")
    pending = read_pending(path)
    check_kept_copies(path, pending)
    uri = store_uri(tracking_uri, pending.header["tracking_uri"])
    tracking.fail_fast_http()
    try:
        with tracking.store_lock(uri):
            client = MlflowClient(uri)
    except Exception as e:  # a store that cannot even be opened: nothing was sent
        raise ReplayError(f"cannot open the MLflow store {uri} ({_why(e)}); nothing was sent") from e
    with _store_logs_quiet():
        sent, error = send_pending(client, path, pending, run_id)
    if error is not None:
        left = len(pending.ops) - sent
        then = (
            "nothing was sent and the file is unchanged: start the server, or fix that error or the options, "
            "and run this command again"
            if not sent
            else f"{sent} were sent: start the server (or fix that error) and run this command again, with the "
            "same options, to send the rest to the same place"
        )
        raise ReplayError(
            f"{uri} did not take the calls in {path} ({_why(error)}); {left} still pending there, {then}"
        )
    return Replayed(path, sent, pending.cut_line)


@contextlib.contextmanager
def _store_logs_quiet() -> Iterator[None]:
    """MLflow's SQL store logs each failed write with its traceback at ERROR before raising (a read-only
    database printed two); the replay reports the failure itself, in one line, so those records are dropped
    while it sends."""
    noisy = logging.getLogger("mlflow.store.db.utils")
    before = noisy.level
    noisy.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        noisy.setLevel(before)


def _why(error: BaseException) -> str:
    """The error's first cause (a store's wrapper exceptions repeat the SQL around it): its type and message."""
    root, seen = error, {id(error)}
    while (cause := root.__cause__ or root.__context__) is not None and id(cause) not in seen:
        root = cause
        seen.add(id(root))
    return f"{type(root).__name__}: {one_line(root)[:300]}"
