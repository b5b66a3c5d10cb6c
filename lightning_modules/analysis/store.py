"""Where the MLflow store, the experiment and the figures folder are: argument, else environment, else default.

The training side logs to `sqlite:///mlruns/mlflow.db` relative to the repository root (docs/tracking.md). Notebooks run with notebooks/ as their working directory, so a relative SQLite path is resolved
against the repository root here, never against the current directory. The file store is deprecated in
MLflow 3 and never used by this project: a plain path or file: URI is refused rather than silently read.
"""

from __future__ import annotations

import os
from pathlib import Path

from lightning_modules.analysis.errors import StoreError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRACKING_URI = "sqlite:///mlruns/mlflow.db"
DEFAULT_EXPERIMENT = "lrkv-lab"
# MLflow's own variable names, so that one `export` serves training, the UI and the analysis alike.
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
FIGURES_ENV = "LRKV_FIGURES_DIR"
SQLITE_PREFIX = "sqlite:///"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a sqlite:/// URI (relative paths as written), or None for other schemes."""
    if not uri.startswith(SQLITE_PREFIX):
        return None
    return Path(uri[len(SQLITE_PREFIX) :].split("?", 1)[0])


def resolve_tracking_uri(uri: str | None = None, base: Path | None = None) -> str:
    """`uri`, else $MLFLOW_TRACKING_URI, else the project default; a relative SQLite path is made absolute
    against `base` (default: the repository root)."""
    uri = uri or os.environ.get(TRACKING_URI_ENV) or DEFAULT_TRACKING_URI
    if uri.startswith("file:") or "://" not in uri:
        raise StoreError(
            f"tracking URI {uri!r} names an MLflow file store, which this project does not use (docs/tracking.md); "
            f"use a SQLite store such as {DEFAULT_TRACKING_URI} or a server URL"
        )
    path = sqlite_path(uri)
    if path is None or path.is_absolute():
        return uri
    query = uri.split("?", 1)[1] if "?" in uri else ""
    absolute = (base or REPO_ROOT).resolve() / path
    return SQLITE_PREFIX + str(absolute) + (f"?{query}" if query else "")


def resolve_experiment(name: str | None = None) -> str:
    return name or os.environ.get(EXPERIMENT_ENV) or DEFAULT_EXPERIMENT


def resolve_figures_dir(out: str | Path | None = None) -> Path:
    """`out`, else $LRKV_FIGURES_DIR, else figures/ at the repository root (gitignored)."""
    chosen = out or os.environ.get(FIGURES_ENV) or REPO_ROOT / "figures"
    path = Path(chosen)
    return path if path.is_absolute() else (REPO_ROOT / path).resolve()


def require_existing_sqlite(uri: str) -> None:
    """Opening a missing SQLite file would create an empty store (and run MLflow's migrations); reading
    analysis from it is always a mistake, so say where the runs were expected instead."""
    path = sqlite_path(uri)
    if path is not None and not path.exists():
        raise StoreError(
            f"no MLflow store at {path} (tracking URI {uri}): train something first, e.g. `make demo`, "
            f"or point --tracking-uri / ${TRACKING_URI_ENV} at an existing store"
        )
