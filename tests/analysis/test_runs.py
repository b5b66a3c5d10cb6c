"""Loading runs from MLflow into the tidy table, and the errors when the store cannot give one."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from lightning_modules.analysis.analysis_errors import (
    MissingMetricsError,
    MissingTagsError,
    NoRunsError,
    StoreError,
)
from lightning_modules.analysis.locations import REPO_ROOT, resolve_tracking_uri
from lightning_modules.analysis.tidy import columns, final_losses, load_runs
from tests.analysis import synthetic

N_RUNS = len(synthetic.specs())  # 2 sizes x 5 attentions x 2 seeds + 2 sweep runs


@pytest.fixture(scope="module")
def runs(synthetic_store: str) -> pd.DataFrame:
    return load_runs(synthetic_store)


@pytest.mark.slow
def test_columns_and_dtypes(runs: pd.DataFrame) -> None:
    assert tuple(runs.columns) == columns()
    for column in ("run_id", "run_name", "size", "attention", "label", "budget", "git_commit", "split"):
        assert pd.api.types.is_string_dtype(runs[column]), column
    assert runs["seed"].dtype == "int64" and runs["step"].dtype == "int64"
    for knob in (
        "knob_n_kv_heads",
        "knob_rank",
        "knob_kv_latent_dim",
        "knob_rope_head_dim",
        "knob_q_latent_dim",
    ):
        assert runs[knob].dtype == "Int64", knob
    for column in ("tokens", "flops", "loss", "ppl", "bpb", "kv_cache_bytes_per_token", "knob_residual_init"):
        assert runs[column].dtype == "float64", column
    for column in ("knob_lrkv_path", "knob_latent_init"):
        assert pd.api.types.is_string_dtype(runs[column]), column


def test_one_row_per_evaluation(runs: pd.DataFrame) -> None:
    assert runs["run_id"].nunique() == N_RUNS == 22
    assert len(runs) == N_RUNS * (len(synthetic.EVAL_STEPS["nano"]) + 1)
    assert (runs.groupby("run_id")["split"].apply(lambda s: (s == "test").sum()) == 1).all()


def test_values_are_what_was_logged(runs: pd.DataFrame) -> None:
    spec = next(s for s in synthetic.specs() if s.name == "nano-lrkv-r8-seed7")
    cost = synthetic.cost_row(spec)
    rows = runs[(runs["run_name"] == spec.name) & (runs["split"] == "val")]
    assert list(rows["step"]) == list(synthetic.EVAL_STEPS["nano"])
    tokens = [s * synthetic.TOKENS_PER_STEP["nano"] for s in synthetic.EVAL_STEPS["nano"]]
    assert list(rows["tokens"]) == tokens
    assert rows["loss"].tolist() == pytest.approx([synthetic.loss_at(spec, t) for t in tokens])
    assert rows["flops"].tolist() == pytest.approx([t * cost["train_flops_per_token"] for t in tokens])
    assert rows["bpb"].tolist() == pytest.approx(
        (rows["loss"] / (math.log(2) * synthetic.BYTES_PER_TOKEN)).tolist()
    )
    first = rows.iloc[0]
    assert (first["size"], first["attention"], first["label"], first["seed"]) == (
        "nano",
        "lrkv",
        "lrkv-r8",
        7,
    )
    assert (first["knob_rank"], first["knob_lrkv_path"], first["knob_residual_init"]) == (
        8,
        "factorized",
        0.1,
    )
    assert first["kv_cache_bytes_per_token"] == cost["kv_cache_bytes_per_token"]
    assert first["budget"] == "tokens=1.23e+06"
    mha = runs[runs["label"] == "mha"].iloc[0]
    assert pd.isna(mha["knob_rank"]) and pd.isna(mha["knob_lrkv_path"])


def test_rows_are_ordered_by_size_attention_label_seed_split_step(runs: pd.DataFrame) -> None:
    order = list(dict.fromkeys(runs["run_name"]))
    assert order[:4] == ["nano-mha-seed7", "nano-mha-seed8", "nano-mqa-seed7", "nano-mqa-seed8"]
    assert order.index("nano-mla-c32-seed7") < order.index("nano-mla-c64-seed7")  # sweeps by number
    assert order.index("nano-lrkv-r8-seed8") < order.index("nano-lrkv-r16-seed7")
    assert all(name.startswith("20m") for name in order[12:])


def test_final_losses_are_the_test_evaluations(runs: pd.DataFrame) -> None:
    finals = final_losses(runs)
    assert len(finals) == N_RUNS and set(finals["split"]) == {"test"}
    spec = synthetic.specs()[0]
    tokens = synthetic.EVAL_STEPS[spec.size][-1] * synthetic.TOKENS_PER_STEP[spec.size]
    row = finals[finals["run_name"] == spec.name].iloc[0]
    assert row["loss"] == pytest.approx(synthetic.loss_at(spec, tokens) + synthetic.TEST_GAP)
    last_val = final_losses(runs, "val")
    assert set(last_val["step"]) == {300, 600}


def test_final_losses_name_runs_without_a_test(runs: pd.DataFrame) -> None:
    no_test = runs[~((runs["run_name"] == "nano-mqa-seed8") & (runs["split"] == "test"))]
    with pytest.raises(MissingMetricsError, match="nano-mqa-seed8.*split='val'"):
        final_losses(no_test)


def test_select_by_tags(synthetic_store: str) -> None:
    big = load_runs(synthetic_store, tags={"size": "20m"})
    assert set(big["size"]) == {"20m"} and big["run_id"].nunique() == 10
    rank16 = load_runs(synthetic_store, tags={"knob.rank": "16"})
    assert sorted(set(rank16["run_name"])) == [
        "20m-lrkv-r16-seed7",
        "20m-lrkv-r16-seed8",
        "nano-lrkv-r16-seed7",
    ]
    with pytest.raises(NoRunsError, match="with tags"):
        load_runs(synthetic_store, tags={"size": "6.3b"})


def test_environment_names_the_store(synthetic_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", synthetic_store)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", synthetic.EXPERIMENT)
    assert load_runs()["run_id"].nunique() == N_RUNS
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "elsewhere")
    with pytest.raises(NoRunsError, match="no experiment 'elsewhere'.*lrkv-lab"):
        load_runs()


def test_relative_sqlite_uri_is_taken_from_the_repo_root(tmp_path: Path) -> None:
    assert resolve_tracking_uri("sqlite:///mlruns/mlflow.db") == f"sqlite:///{REPO_ROOT / 'mlruns/mlflow.db'}"
    assert resolve_tracking_uri("sqlite:///x.db", base=tmp_path) == f"sqlite:///{tmp_path / 'x.db'}"
    assert resolve_tracking_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"
    assert resolve_tracking_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_missing_store_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "mlruns" / "mlflow.db"
    with pytest.raises(StoreError, match="no MLflow store at .*make demo"):
        load_runs(f"sqlite:///{path}")
    assert not path.exists()


@pytest.mark.parametrize("uri", ["mlruns", "file:///tmp/mlruns"])
def test_file_store_is_refused(uri: str) -> None:
    with pytest.raises(StoreError, match="file store"):
        load_runs(uri)


# ----- stores that break the contract: one store, one experiment per way of breaking it -------------------
@pytest.fixture(scope="module")
def broken_store(new_store: Callable[[str], str]) -> str:
    uri = new_store("broken_store")
    client = MlflowClient(tracking_uri=uri)
    client.create_experiment("empty")

    def run(
        experiment: str, name: str, tags: dict[str, str], metrics: list[Metric], finish: bool = True
    ) -> None:
        exp = client.get_experiment_by_name(experiment) or client.get_experiment(
            client.create_experiment(experiment)
        )
        r = client.create_run(exp.experiment_id, run_name=name, tags=tags)
        client.log_batch(r.info.run_id, metrics=metrics)
        if finish:
            client.set_terminated(r.info.run_id)

    full = [Metric(f"val/{k}", 1.0, 0, 10) for k in ("loss", "tokens", "flops")]
    tags = {"size": "nano", "attention": "mha", "attention_label": "mha", "seed": "1"}
    run("untagged", "nano-mha-seed1", {"size": "nano", "attention": "mha"}, full)
    run("untagged", "other", {**tags, "seed": "one"}, full)
    run("running", "nano-mha-seed1", tags, full, finish=False)
    run(
        "no-tokens", "nano-mha-seed1", tags, [Metric("val/loss", 1.0, 0, 10), Metric("val/flops", 1.0, 0, 10)]
    )
    run("no-val", "nano-mha-seed1", tags, [Metric("train/loss", 1.0, 0, 10)])
    # A resumed run logs step 10 again, later: its second value is the one the run ended with.
    relogged = [Metric("val/loss", 2.0, 1, 10), Metric("val/loss", 1.5, 2, 10)] + full[1:]
    run("resumed", "nano-mha-seed1", tags, relogged)
    return uri


def test_empty_experiment(broken_store: str) -> None:
    with pytest.raises(NoRunsError, match="no runs in experiment 'empty'.*make demo"):
        load_runs(broken_store, "empty")


def test_missing_tags_name_the_runs_and_the_tags(broken_store: str) -> None:
    with pytest.raises(MissingTagsError, match=r"nano-mha-seed1 \(\w+\): attention_label, seed") as err:
        load_runs(broken_store, "untagged")
    assert "other" in str(err.value) and "not an integer: 'one'" in str(err.value)


def test_unfinished_runs_are_left_out_unless_asked(broken_store: str) -> None:
    with pytest.raises(NoRunsError, match="none with status in \\['FINISHED'\\].*RUNNING x1"):
        load_runs(broken_store, "running")
    assert load_runs(broken_store, "running", statuses=("RUNNING",))["status"].tolist() == ["RUNNING"]


def test_missing_metrics_name_the_run_and_the_metric(broken_store: str) -> None:
    with pytest.raises(MissingMetricsError, match="nano-mha-seed1.*val/tokens is not logged"):
        load_runs(broken_store, "no-tokens")
    with pytest.raises(MissingMetricsError, match="nano-mha-seed1.*logged no val/loss"):
        load_runs(broken_store, "no-val")


def test_a_step_logged_twice_keeps_the_later_value(broken_store: str) -> None:
    assert load_runs(broken_store, "resumed")["loss"].tolist() == [1.5]
