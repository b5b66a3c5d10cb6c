"""What the MLflow UI needs to show these runs the way a person training models expects (docs/tracking.md).

- MLflow 3 opens an experiment in its GenAI view (traces, prompts, judges). An experiment declares its kind
  with the tag `mlflow.experimentKind` ("custom_model_development" is the model-training kind), which we set
  once, never overwriting a user's choice. MLflow 3.17's UI, though, picks the view from its own
  GenAI / Model training switch (kept in the browser), which a link sets with `workflowType=machine_learning`;
  `ui_url` gives that link, and `python -m lightning_modules mlflow-ui` prints it (make mlflow-ui).
- The UI shows the store everything else uses (`resolve_tracking_uri`, lightning_modules/tracking/store.py):
  an SQLite store is served by an `mlflow ui` started on it (`ui_plan` gives the command); a tracking server
  already serves its own UI, so its link is printed and nothing is started. MLflow's deprecated file store
  is refused, as everywhere in the project.
- The runs table's Dataset column lists a run's dataset inputs. The shards are logged as one, named after
  the data directory, with the manifest's sha256 as digest (the manifest pins every shard's checksum, so
  equal digests mean equal data) and the data directory as source.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from lightning_modules.core.errors import UserError
from lightning_modules.tracking import store as tracking

if TYPE_CHECKING:
    from mlflow import MlflowClient

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
DIGEST_CHARS = 16  # MLflow stores a digest of at most 36 characters
CONTEXTS = {"fit": "training", "validate": "validation", "test": "testing"}
HOST, PORT = "127.0.0.1", 5000  # local only: the UI has no authentication
UI = f"http://{HOST}:{PORT}"  # make mlflow-ui
SERVER_SCHEMES = ("http://", "https://")


class UiStoreError(UserError, ValueError):
    """The tracking URI names a store the UI is not started on; the message says which to give."""


def mark_model_training(client: MlflowClient, experiment_id: str) -> None:
    """Make the experiment open in the model-training view, unless it already declares a kind."""
    from mlflow.exceptions import MlflowException  # late: mlflow takes seconds to import

    experiment = client.get_experiment(experiment_id)
    if EXPERIMENT_KIND_TAG in experiment.tags:
        return
    try:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
    except MlflowException:
        # Two runs starting at once (the study's workers) both find the tag missing; the SQL store's insert of
        # the second then fails on the unique key. Lost to a run that set it: nothing left to do.
        if EXPERIMENT_KIND_TAG not in client.get_experiment(experiment_id).tags:
            raise


def manifest_dataset(data_dir: str | Path):  # noqa: ANN201 (mlflow.entities.Dataset, imported late)
    """The shards of `data_dir` as an MLflow dataset: name, digest and source from its manifest.json."""
    from mlflow.entities import Dataset  # late: mlflow takes seconds to import

    folder = Path(data_dir).resolve()
    raw = (folder / "manifest.json").read_bytes()
    manifest = json.loads(raw)
    splits = {
        name: {"samples": split["samples"], "tokens": split["tokens"]}
        for name, split in manifest["splits"].items()
    }
    profile = {"vocab_size": manifest["vocab_size"], "seq_len": manifest["seq_len"], "splits": splits}
    return Dataset(
        name=folder.name,
        digest=hashlib.sha256(raw).hexdigest()[:DIGEST_CHARS],
        source_type="local",
        source=json.dumps({"uri": str(folder)}),
        profile=json.dumps(profile),
    )


def log_dataset(client: MlflowClient, run_id: str, data_dir: str | Path, stage: str) -> None:
    """Log the shards as a dataset input of the run, in the stage's context (training, validation, testing)."""
    from mlflow.entities import DatasetInput, InputTag  # late, as above
    from mlflow.exceptions import MlflowException
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    context = InputTag(MLFLOW_DATASET_CONTEXT, CONTEXTS.get(stage, stage))
    inputs = [DatasetInput(manifest_dataset(data_dir), tags=[context])]
    try:
        client.log_inputs(run_id, datasets=inputs)
    except MlflowException:
        # Two runs starting at once (the study's workers) both find the dataset missing from the experiment and
        # both insert it; the SQL store's primary key (experiment, name, digest) fails the second. The winner's
        # row is there now, so a second try links this run to it; any other failure fails again and stands.
        client.log_inputs(run_id, datasets=inputs)


def ui_url(experiment_id: str | None, base: str = UI) -> str:
    """The UI's runs table of the experiment (or its experiment list) in the model-training view."""
    page = f"experiments/{experiment_id}/runs" if experiment_id else "experiments"
    return f"{base}/#/{page}?workflowType=machine_learning"


@dataclass(frozen=True)
class UiPlan:
    """What `make mlflow-ui` does for a store: the link to open, and the `mlflow ui` to start (None when a
    tracking server already serves the UI)."""

    store: str
    link: str
    command: list[str] | None


def ui_command(store: str, host: str = HOST, port: int = PORT) -> list[str]:
    """`mlflow ui` on `store`, run by this interpreter (its environment's mlflow, whatever PATH holds)."""
    return [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        store,
        "--host",
        host,
        "--port",
        str(port),
    ]


def ui_plan(store: str | None = None, port: int = PORT) -> UiPlan:
    """The plan for `store` (default: the project's store, resolve_tracking_uri). The store is opened once,
    for the experiment's id in the link; one that cannot be opened raises TrackingUnreachableError."""
    store = tracking.resolve_tracking_uri(store)
    if store.startswith("file:") or "://" not in store:
        raise UiStoreError(
            f"MLFLOW_TRACKING_URI={store} is MLflow's deprecated file store, which this project never uses: "
            "set it to sqlite:///PATH/mlflow.db or http://HOST:PORT, or unset it for ./mlruns"
        )
    tracking.check_reachable(store)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from mlflow import MlflowClient  # late and quiet: mlflow takes seconds to import, and warns doing so

    with tracking.store_lock(store):
        experiment = MlflowClient(store).get_experiment_by_name(tracking.EXPERIMENT)
    experiment_id = experiment.experiment_id if experiment else None
    if store.startswith(SERVER_SCHEMES):
        return UiPlan(store, ui_url(experiment_id, store.rstrip("/")), None)
    return UiPlan(store, ui_url(experiment_id, f"http://{HOST}:{port}"), ui_command(store, port=port))


def serve(plan: UiPlan) -> NoReturn:
    """Become the plan's `mlflow ui` (exec: Ctrl-C and the exit status are its own)."""
    if plan.command is None:
        raise ValueError(f"{plan.store} is a tracking server: it serves its own UI, none is started here")
    sys.stdout.flush()
    os.execv(plan.command[0], plan.command)
