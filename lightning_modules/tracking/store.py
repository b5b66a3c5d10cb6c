"""Where the MLflow store is, which experiment the runs go to, how it is opened safely, and a reachability check.

Default store: embedded SQLite under ./mlruns (docs/tracking.md; MLflow 3 deprecates the file store and
Lightning's MLFlowLogger would default to it, so a URI is always passed). MLFLOW_TRACKING_URI overrides.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lightning_modules.core.errors import UserError

EXPERIMENT = "lrkv-lab"


class TrackingUnreachableError(UserError, RuntimeError):
    """The store cannot be opened or the server does not answer; the message names the URI."""


def default_tracking_uri(root: Path | None = None) -> str:
    return f"sqlite:///{(root or Path.cwd()) / 'mlruns' / 'mlflow.db'}"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def local_artifact_location(uri: str) -> str | None:
    """Artifacts of the embedded store live beside it (mlruns/artifacts); a server manages its own."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
    return None


def fail_fast_http() -> None:
    """One attempt per request, at most 10 s: MLflow's default retries a refused connection for about two
    minutes inside every call, which would stall training; lightning_modules/tracking/buffer.py does the
    retrying instead, without blocking. A user's own setting wins."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Hold an exclusive lock beside an SQLite store while it is opened or a run is created in it.

    Opening a fresh store runs MLflow's schema migrations, and processes starting together race in them
    (`duplicate column name: step`); creating the experiment races the same way. A server serialises its
    own writes, so other URIs need no lock. flock is per host: on a network filesystem use a server.
    """
    if not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_reachable(uri: str) -> None:
    """Fail fast, naming the URI, if the store cannot be opened or the server does not answer."""
    fail_fast_http()
    from mlflow.tracking import MlflowClient  # late: the store rules above must stay cheap to import

    try:
        with store_lock(uri):
            MlflowClient(uri).search_experiments(max_results=1)
    except Exception as e:  # any failure means no run can be tracked: stop before training
        raise TrackingUnreachableError(
            f"MLflow tracking store {uri} is unreachable: {type(e).__name__}: {e}; start the server, or "
            "unset MLFLOW_TRACKING_URI to log to ./mlruns"
        ) from e
