"""What the MLflow UI shows, checked through the MLflow API: the experiment declares the model-training kind
(not MLflow 3's GenAI view), and every run has the data manifest as a dataset input (the Dataset column).
Which store `make mlflow-ui` shows, checked through `--dry-run` (the command it would run): the one
MLFLOW_TRACKING_URI names, else ./mlruns; a tracking server is linked to, not served again."""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from pathlib import Path

import pytest

from lightning_modules.commands import mlflow_ui
from lightning_modules.tracking import ui
from main import main
from tests.mlflow_server import MlflowServer
from tests.training.helpers import args, only_run

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_experiment_kind_and_dataset_input(tiny_shards: Path, mlflow_uri: str) -> None:
    main(args("fit", tiny_shards, "mha", "--trainer.max_steps", "2"))
    client, run = only_run(mlflow_uri)
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.tags[ui.EXPERIMENT_KIND_TAG] == ui.MODEL_TRAINING == "custom_model_development"

    (logged,) = client.get_run(run.info.run_id).inputs.dataset_inputs
    dataset = logged.dataset
    manifest = (tiny_shards / "manifest.json").read_bytes()
    assert dataset.name == tiny_shards.name
    assert dataset.digest == hashlib.sha256(manifest).hexdigest()[:16]
    assert json.loads(dataset.source)["uri"] == str(tiny_shards.resolve())
    profile = json.loads(dataset.profile)
    assert profile["splits"]["train"]["tokens"] == json.loads(manifest)["splits"]["train"]["tokens"]
    assert {(t.key, t.value) for t in logged.tags} == {("mlflow.data.context", "training")}


def test_ui_link_opens_the_model_training_view(mlflow_uri: str, capsys) -> None:  # noqa: ANN001
    assert ui.ui_url("3") == "http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning"
    assert mlflow_ui.main(["--dry-run"]) == 0  # no experiment yet: the experiment list, in the same view
    link = capsys.readouterr().out.splitlines()[0]
    assert link == "MLflow UI: http://127.0.0.1:5000/#/experiments?workflowType=machine_learning"


def test_the_ui_serves_the_store_tracking_uri_names(mlflow_uri: str, capsys) -> None:  # noqa: ANN001
    assert mlflow_ui.main(["--dry-run", "--port", "5123"]) == 0
    would_run = capsys.readouterr().out.splitlines()[-1]
    backend = f"--backend-store-uri {mlflow_uri} --host 127.0.0.1 --port 5123"
    assert would_run == f"would run: {sys.executable} -m mlflow ui {backend}"


@pytest.mark.slow
def test_without_tracking_uri_the_ui_serves_mlruns_of_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    plan = ui.ui_plan()
    assert (
        plan.command is not None and plan.store == f"sqlite:///{tmp_path.resolve() / 'mlruns' / 'mlflow.db'}"
    )
    assert plan.command[plan.command.index("--backend-store-uri") + 1] == plan.store


@pytest.mark.slow
def test_a_tracking_server_is_linked_to_not_served_again(mlflow_server: MlflowServer, capsys) -> None:  # noqa: ANN001
    assert mlflow_ui.main([]) == 0  # no --dry-run: it must not start anything for a server
    out = capsys.readouterr().out
    assert out.startswith(f"MLflow UI: {mlflow_server.uri}/#/experiments") and "nothing started" in out
    assert "would run" not in out and ui.ui_plan().command is None


def test_make_mlflow_ui_is_the_command_alone() -> None:
    makefile = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(makefile) if line.startswith("mlflow-ui: $(STAMP)"))
    recipe = list(itertools.takewhile(lambda line: line.startswith("\t"), makefile[start + 1 :]))
    assert recipe == ["\t$(PY) -m lightning_modules mlflow-ui"]


def test_a_users_experiment_kind_is_kept(mlflow_uri: str) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_uri)
    experiment_id = client.create_experiment("mine", tags={ui.EXPERIMENT_KIND_TAG: "finetuning"})
    ui.mark_model_training(client, experiment_id)
    assert client.get_experiment(experiment_id).tags[ui.EXPERIMENT_KIND_TAG] == "finetuning"


def test_a_kind_set_by_a_run_starting_at_the_same_time_is_not_an_error(mlflow_uri: str) -> None:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(mlflow_uri)
    experiment_id = client.create_experiment("raced")
    stale = client.get_experiment(experiment_id)  # what both racing runs read: no kind yet

    class Raced(MlflowClient):
        """The other run sets the kind between this one's read and its insert, which then fails (as the SQL
        store's unique key makes it)."""

        reads = 0

        def get_experiment(self, experiment_id: str):  # noqa: ANN202
            self.reads += 1
            return stale if self.reads == 1 else super().get_experiment(experiment_id)

        def set_experiment_tag(self, experiment_id: str, key: str, value: str) -> None:
            super().set_experiment_tag(experiment_id, key, value)
            raise MlflowException(
                "UNIQUE constraint failed: experiment_tags.key, experiment_tags.experiment_id"
            )

    ui.mark_model_training(Raced(mlflow_uri), experiment_id)
    assert client.get_experiment(experiment_id).tags[ui.EXPERIMENT_KIND_TAG] == ui.MODEL_TRAINING

    class Broken(MlflowClient):  # the insert fails and nobody set the kind: the error stands
        def set_experiment_tag(self, experiment_id: str, key: str, value: str) -> None:
            raise MlflowException("database is locked")

    other = client.create_experiment("broken")
    with pytest.raises(MlflowException, match="locked"):
        ui.mark_model_training(Broken(mlflow_uri), other)


def test_a_dataset_logged_by_a_run_starting_at_the_same_time_is_not_an_error(
    tiny_shards: Path, mlflow_uri: str
) -> None:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(mlflow_uri)
    experiment_id = client.create_experiment("raced")
    winner, loser = (client.create_run(experiment_id).info.run_id for _ in range(2))

    class Raced(MlflowClient):
        """The other run inserts the dataset between this one's lookup and its insert, which then fails (as
        the SQL store's primary key on experiment, name and digest makes it)."""

        tries = 0

        def log_inputs(self, run_id: str, datasets=None, models=None) -> None:  # noqa: ANN001
            self.tries += 1
            if self.tries == 1:
                ui.log_dataset(client, winner, tiny_shards, "fit")
                raise MlflowException("UNIQUE constraint failed: datasets.experiment_id, datasets.name")
            super().log_inputs(run_id, datasets=datasets, models=models)

    raced = Raced(mlflow_uri)
    ui.log_dataset(raced, loser, tiny_shards, "fit")
    assert raced.tries == 2
    logged = {r: client.get_run(r).inputs.dataset_inputs for r in (winner, loser)}
    assert all(len(inputs) == 1 for inputs in logged.values())
    assert logged[winner][0].dataset.digest == logged[loser][0].dataset.digest

    class Broken(MlflowClient):  # every insert fails: the error stands
        def log_inputs(self, run_id: str, datasets=None, models=None) -> None:  # noqa: ANN001
            raise MlflowException("database is locked")

    with pytest.raises(MlflowException, match="locked"):
        ui.log_dataset(Broken(mlflow_uri), loser, tiny_shards, "fit")
