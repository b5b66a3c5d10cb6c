"""Where the MLflow store, the experiment and the figures folder are: argument, else environment, else default.

The store follows the one rule of lightning_modules/tracking/store.py (docs/tracking.md), with one difference
of base: notebooks run with notebooks/ as their working directory, so a relative SQLite path is resolved
against the repository root here, never against the current directory (training, run from the repository
root, resolves it against the working directory: the same store). The file store is deprecated in MLflow 3
and never used by this project: a plain path or file: URI is refused rather than silently read.
"""

from __future__ import annotations

import os
from pathlib import Path

from lightning_modules.analysis.analysis_errors import StoreError
from lightning_modules.tracking import store as tracking
from lightning_modules.tracking.store import DEFAULT_TRACKING_URI, TRACKING_URI_ENV, sqlite_path

REPO_ROOT = Path(__file__).resolve().parents[2]
# MLflow's own variable names, so that one `export` serves training, the UI and the analysis alike.
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
FIGURES_ENV = "LRKV_FIGURES_DIR"


def resolve_tracking_uri(uri: str | None = None, base: Path | None = None) -> str:
    """`uri`, else $MLFLOW_TRACKING_URI, else the project default (tracking.resolve_tracking_uri); a relative
    SQLite path is made absolute against `base` (default: the repository root). A file store is refused."""
    resolved = tracking.resolve_tracking_uri(uri, base or REPO_ROOT)
    if resolved.startswith("file:") or "://" not in resolved:
        raise StoreError(
            f"tracking URI {resolved!r} names an MLflow file store, which this project does not use (docs/tracking.md); "
            f"use a SQLite store such as {DEFAULT_TRACKING_URI} or a server URL"
        )
    return resolved


def resolve_experiment(name: str | None = None) -> str:
    return name or os.environ.get(EXPERIMENT_ENV) or tracking.EXPERIMENT


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
