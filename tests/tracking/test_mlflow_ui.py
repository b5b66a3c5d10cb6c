"""What the MLflow UI shows, checked through the MLflow API: the experiment declares the model-training kind
(not MLflow 3's GenAI view), and every run has the data manifest as a dataset input (the Dataset column)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lightning_modules import mlflow_ui
from lightning_modules.tracking import ui
from main import main
from tests.training.test_training import args, only_run


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
    assert mlflow_ui.main() == 0  # no experiment yet: the experiment list, in the same view
    assert capsys.readouterr().out.strip().endswith("/#/experiments?workflowType=machine_learning")


def test_a_users_experiment_kind_is_kept(mlflow_uri: str) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_uri)
    experiment_id = client.create_experiment("mine", tags={ui.EXPERIMENT_KIND_TAG: "finetuning"})
    ui.mark_model_training(client, experiment_id)
    assert client.get_experiment(experiment_id).tags[ui.EXPERIMENT_KIND_TAG] == "finetuning"
