"""Where the MLflow store is, which experiment the runs go to, how it is opened safely, and a reachability check.

Where the store lives, the one rule (docs/tracking.md; training and the analysis both call
`resolve_tracking_uri`): the URI given, else $MLFLOW_TRACKING_URI, else the embedded SQLite store
sqlite:///mlruns/mlflow.db; a relative SQLite path is made absolute against a base directory, the working
directory unless the caller names another (the analysis names the repository root). MLflow 3 deprecates the
file store and Lightning's MLFlowLogger would default to it, so a URI is always passed.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lightning_modules.core.errors import UserError

EXPERIMENT = "lrkv-lab"
# MLflow's own variable name, so that one `export` serves training, the UI and the analysis alike.
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
DEFAULT_TRACKING_URI = "sqlite:///mlruns/mlflow.db"  # relative: resolve_tracking_uri takes it against a base
SQLITE_PREFIX = "sqlite:///"


class TrackingUnreachableError(UserError, RuntimeError):
    """The store cannot be opened or the server does not answer; the message names the URI."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a sqlite:/// URI (relative paths as written), or None for other schemes."""
    if not uri.startswith(SQLITE_PREFIX):
        return None
    return Path(uri[len(SQLITE_PREFIX) :].split("?", 1)[0])


def resolve_tracking_uri(uri: str | None = None, base: Path | None = None) -> str:
    """`uri`, else $MLFLOW_TRACKING_URI, else DEFAULT_TRACKING_URI; a relative SQLite path is made absolute
    against `base` (default: the working directory), so the URI names one store wherever it is opened."""
    uri = uri or os.environ.get(TRACKING_URI_ENV) or DEFAULT_TRACKING_URI
    path = sqlite_path(uri)
    if path is None or path.is_absolute():
        return uri
    query = uri.split("?", 1)[1] if "?" in uri else ""
    absolute = (base or Path.cwd()).resolve() / path
    return SQLITE_PREFIX + str(absolute) + (f"?{query}" if query else "")


def default_tracking_uri(root: Path | None = None) -> str:
    """The default store under `root` (default: the working directory), whatever the environment says."""
    return resolve_tracking_uri(DEFAULT_TRACKING_URI, root)


def tracking_uri() -> str:
    """The store training logs to: the rule of resolve_tracking_uri against the working directory."""
    return resolve_tracking_uri()


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
