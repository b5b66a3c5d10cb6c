"""MLflow conventions: where the store is, what a run is called and tagged, and a reachability check.

Default store: embedded SQLite under ./mlruns (docs/tracking.md; MLflow 3 deprecates the file store and
Lightning's MLFlowLogger would default to it, so a URI is always passed). MLFLOW_TRACKING_URI overrides.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from lightning_modules.attention import AttentionConfig, knob_values
from lightning_modules.config import ModelConfig

EXPERIMENT = "lrkv-lab"


class TrackingUnreachableError(RuntimeError):
    pass


def default_tracking_uri(root: Path | None = None) -> str:
    return f"sqlite:///{(root or Path.cwd()) / 'mlruns' / 'mlflow.db'}"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def local_artifact_location(uri: str) -> str | None:
    """Artifacts of the embedded store live beside it (mlruns/artifacts); a server manages its own."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
    return None


def check_reachable(uri: str) -> None:
    """Fail fast, naming the URI, if the store cannot be opened or the server does not answer."""
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(uri).search_experiments(max_results=1)
    except Exception as e:  # any failure means no run can be tracked: stop before training
        raise TrackingUnreachableError(
            f"MLflow tracking store {uri} is unreachable: {type(e).__name__}: {e}"
        ) from e


def git_commit() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha.strip() + ("-dirty" if dirty.strip() else "")


def run_name(model: ModelConfig, attention: AttentionConfig, seed: Any) -> str:
    return f"{model.name}-{attention.label()}-seed{seed}"


def run_tags(model: ModelConfig, attention: AttentionConfig, seed: Any, budget: str) -> dict[str, str]:
    """Tags the analysis selects runs by (lightning_modules/analysis): the size, the attention and its
    resolved knobs, the seed, the budget and the code version."""
    tags = {
        "size": model.name,
        "attention": attention.kind,
        "attention_label": attention.label(),
        "seed": str(seed),
        "budget": budget,
        "git_commit": git_commit(),
    }
    for knob, value in knob_values(attention).items():
        if value is not None:
            tags[f"knob.{knob}"] = str(value)
    return tags


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts to {"a.b.c": value}; lists and other leaves kept whole."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat
