"""Runs from MLflow as one tidy table: a row per evaluation (validation during training, test at the end).

The training module's MLflow contract (docs/tracking.md) is what this reads: tags `size`, `attention`,
`attention_label`, `seed`, `budget`, `git_commit` and `knob.<name>`; params `cost.<name>`; metrics
`val/{loss,ppl,bpb,tokens,flops}` during training and `test/...` at the end, all against the global step.

Columns of the table, `columns()` (run columns repeat on every row of a run, `EVAL_COLUMNS` vary):
  run_id, run_name, status, size, attention, label, budget, git_commit (str)   seed (int64)
  knob_<name> for every knob of every registered attention (lightning_modules/model/attention/), typed from its
  declaration: Int64 for int knobs (<NA> where the run's attention has no such knob), float64, or str
  params, non_embedding_params, attention_params, kv_cache_bytes_per_token, kv_cache_vs_mha,
  train_flops_per_token, decode_flops_per_token (float64, from the cost.* params; NaN when not logged)
  split ("val" or "test"), step (int64), tokens, flops, loss, ppl, bpb (float64)
Losses are cross-entropy in nats per token, bpb bits per byte; tokens and FLOPs are cumulative training
tokens and FLOPs reached at that evaluation. Long format (one `split` column rather than val_loss and
test_loss side by side) so that a test point and a validation curve are drawn and summarised the same way.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd

from lightning_modules.analysis.analysis_errors import MissingMetricsError, MissingTagsError, NoRunsError
from lightning_modules.analysis.locations import (
    require_existing_sqlite,
    resolve_experiment,
    resolve_tracking_uri,
)
from lightning_modules.analysis.styles import label_sort_key, size_sort_key

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

REQUIRED_TAGS = ("size", "attention", "attention_label", "seed")
COST_COLUMNS = (
    "params",
    "non_embedding_params",
    "attention_params",
    "kv_cache_bytes_per_token",
    "kv_cache_vs_mha",
    "train_flops_per_token",
    "decode_flops_per_token",
)
RUN_COLUMNS = (
    "run_id",
    "run_name",
    "status",
    "size",
    "attention",
    "label",
    "seed",
    "budget",
    "git_commit",
    *COST_COLUMNS,
)
EVAL_COLUMNS = ("split", "step", "tokens", "flops", "loss", "ppl", "bpb")
COLUMNS = RUN_COLUMNS + EVAL_COLUMNS  # what every table from load_runs has; the knob columns come on top
SPLITS = ("val", "test")
EVAL_METRICS = ("loss", "tokens", "flops", "ppl", "bpb")
REQUIRED_EVAL_METRICS = ("loss", "tokens", "flops")  # ppl and bpb are derived views; a curve needs these
STR_COLUMNS = ("run_id", "run_name", "status", "size", "attention", "label", "budget", "git_commit", "split")
MAX_NAMED = 10  # runs named in one error message


def knob_types() -> dict[str, type]:
    """knob name -> its declared type (int, float, str), for every registered attention. Imported when
    called: the registry imports torch, which a drawing kernel need not load to import this module."""
    from lightning_modules.model.attention import knob_specs  # late: the registry imports torch

    return {name: spec.type for name, spec in knob_specs().items()}


def columns() -> tuple[str, ...]:
    """Every column of load_runs' table, in order: the run's, its knobs', its costs', the evaluation's."""
    fixed = RUN_COLUMNS[: RUN_COLUMNS.index(COST_COLUMNS[0])]
    return (*fixed, *(f"knob_{k}" for k in knob_types()), *COST_COLUMNS, *EVAL_COLUMNS)


def load_runs(
    tracking_uri: str | None = None,
    experiment: str | None = None,
    *,
    tags: Mapping[str, str] | None = None,
    statuses: Iterable[str] = ("FINISHED",),
) -> pd.DataFrame:
    """Every run of `experiment` whose tags equal `tags` (e.g. {"size": "nano"}) and whose status is in
    `statuses`, as the tidy table described in the module docstring, sorted by size, attention, label, seed,
    split and step. URI and experiment default to $MLFLOW_TRACKING_URI / $MLFLOW_EXPERIMENT_NAME, then to
    sqlite:///mlruns/mlflow.db under the repository root and `lrkv-lab`. Unfinished runs are left out by
    default because a partial curve would bias the final losses and the tokens-to-target table."""
    uri = resolve_tracking_uri(tracking_uri)
    name = resolve_experiment(experiment)
    require_existing_sqlite(uri)
    # Imported here, not at the top: mlflow takes seconds to import, and only loading needs it. In a notebook
    # kernel its import warns that ipywidgets is missing (tqdm.auto); no progress bar is used here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from mlflow import MlflowClient  # late and quiet, as the comment above says

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        known = sorted(e.name for e in client.search_experiments())
        raise NoRunsError(
            f"no experiment {name!r} in {uri} (experiments there: {', '.join(known) or 'none'}); "
            f"train something first, e.g. `make demo`, or choose the experiment"
        )
    runs = _search(client, exp.experiment_id, _filter_string(tags or {}))
    where = f"experiment {name!r} in {uri}" + (f" with tags {dict(tags)}" if tags else "")
    if not runs:
        raise NoRunsError(f"no runs in {where}; train something first, e.g. `make demo`")
    wanted = set(statuses)
    kept = [r for r in runs if r.info.status in wanted]
    if not kept:
        found = ", ".join(f"{s} x{n}" for s, n in Counter(r.info.status for r in runs).items())
        raise NoRunsError(
            f"{len(runs)} runs in {where}, none with status in {sorted(wanted)} (found: {found}); "
            f"pass statuses=... to include them"
        )
    _check_tags(kept)
    table = pd.concat([_run_rows(client, r) for r in kept], ignore_index=True)
    return _typed_and_sorted(table)


def final_losses(runs: pd.DataFrame, split: str = "test") -> pd.DataFrame:
    """One row per run: its last evaluation on `split` ("test" is the held-out loss at the end of training,
    "val" the last validation). Every run must have one, or the comparison would silently lose runs."""
    require_columns(runs, COLUMNS, "final_losses")
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: allowed values are {', '.join(SPLITS)}")
    rows = runs[runs["split"] == split]
    lacking = sorted(set(runs["run_name"][~runs["run_id"].isin(rows["run_id"])]))
    if lacking:
        hint = " (use split='val' for the last validation instead)" if split == "test" else ""
        raise MissingMetricsError(f"runs without {split}/loss: {_names(lacking)}{hint}")
    last = rows.loc[rows.groupby("run_id", sort=False)["step"].idxmax()]
    return last.reset_index(drop=True)


def require_columns(table: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise MissingMetricsError(
            f"{what} needs the table from load_runs; missing columns: {', '.join(missing)}"
        )


# ----- reading MLflow -------------------------------------------------------------------------------------
def _filter_string(tags: Mapping[str, str]) -> str:
    # Backticks because contract tags contain dots (knob.rank); quotes in values are escaped for SQL.
    parts = []
    for key, value in tags.items():
        escaped = str(value).replace("'", "\\'")
        parts.append(f"tags.`{key}` = '{escaped}'")
    return " AND ".join(parts)


def _search(client: MlflowClient, experiment_id: str, filter_string: str) -> list[Run]:
    runs: list[Run] = []
    token: str | None = None
    while True:
        page = client.search_runs(
            [experiment_id], filter_string=filter_string, max_results=1000, page_token=token
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _check_tags(runs: list[Run]) -> None:
    problems = []
    for run in runs:
        tags = run.data.tags
        missing = [t for t in REQUIRED_TAGS if not tags.get(t)]
        if "seed" not in missing and not tags["seed"].lstrip("-").isdigit():
            missing.append(f"seed (not an integer: {tags['seed']!r})")
        if missing:
            problems.append(f"{run.info.run_name} ({run.info.run_id[:8]}): {', '.join(missing)}")
    if problems:
        raise MissingTagsError(
            f"{len(problems)} runs lack the tags the analysis groups by ({', '.join(REQUIRED_TAGS)}): "
            f"{_names(problems)}; log them as the training module does, or select tagged runs with "
            f"load_runs(tags={{...}})"
        )


def _history(client: MlflowClient, run_id: str, key: str) -> pd.Series:
    # A resumed run can log a step twice; the later value is the one that run ended with.
    history = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    return pd.Series({m.step: m.value for m in history}, dtype="float64")


def _run_values(run: Run) -> dict[str, Any]:
    tags, params = run.data.tags, run.data.params
    values: dict[str, Any] = {
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
        "status": run.info.status,
        "size": tags["size"],
        "attention": tags["attention"],
        "label": tags["attention_label"],
        "seed": int(tags["seed"]),
        "budget": tags.get("budget"),
        "git_commit": tags.get("git_commit"),
    }
    for knob, kind in knob_types().items():
        raw = tags.get(f"knob.{knob}")
        if raw in (None, "", "None"):
            values[f"knob_{knob}"] = None
        elif kind is int:
            values[f"knob_{knob}"] = int(float(raw))
        else:
            values[f"knob_{knob}"] = kind(raw)
    for cost in COST_COLUMNS:
        raw = params.get(f"cost.{cost}")
        values[cost] = float(raw) if raw not in (None, "", "None") else float("nan")
    return values


def _run_rows(client: MlflowClient, run: Run) -> pd.DataFrame:
    run_id, logged = run.info.run_id, run.data.metrics
    frames = []
    for split in SPLITS:
        if f"{split}/loss" not in logged:
            if split == "val":
                raise MissingMetricsError(f"run {run.info.run_name} ({run_id[:8]}) logged no val/loss")
            continue  # a run that has not been tested yet still has its validation curve
        series = {
            m: _history(client, run_id, f"{split}/{m}") for m in EVAL_METRICS if f"{split}/{m}" in logged
        }
        frame = pd.DataFrame(series).reindex(columns=list(EVAL_METRICS))
        frame = frame[frame["loss"].notna()]  # an evaluation is a step at which the loss was logged
        for metric in REQUIRED_EVAL_METRICS:
            gaps = frame.index[frame[metric].isna()].tolist()
            if gaps:
                raise MissingMetricsError(
                    f"run {run.info.run_name} ({run_id[:8]}): {split}/{metric} is not logged at the "
                    f"steps of {split}/loss {gaps[:5]}; every evaluation needs its tokens and FLOPs"
                )
        frame = frame.rename_axis("step").reset_index()
        frame.insert(0, "split", split)
        frames.append(frame)
    rows = pd.concat(frames, ignore_index=True)
    for key, value in _run_values(run).items():
        rows[key] = [value] * len(rows)
    return rows


def typed(table: pd.DataFrame) -> pd.DataFrame:
    """A table read back from CSV (a committed evaluations.csv) with load_runs' columns, types and order."""
    require_columns(table, COLUMNS, "typed")
    return _typed_and_sorted(table)


def _typed_and_sorted(table: pd.DataFrame) -> pd.DataFrame:
    table = table.reindex(columns=list(columns()))
    knobs = knob_types()
    str_knobs = tuple(f"knob_{k}" for k, t in knobs.items() if t is str)
    float_knobs = tuple(f"knob_{k}" for k, t in knobs.items() if t is float)
    for column in STR_COLUMNS + str_knobs:
        table[column] = table[column].astype("str").where(table[column].notna())
    table["seed"] = table["seed"].astype("int64")
    table["step"] = table["step"].astype("int64")
    for knob in (k for k, t in knobs.items() if t is int):
        table[f"knob_{knob}"] = table[f"knob_{knob}"].astype("Int64")
    for column in (*float_knobs, *COST_COLUMNS, "tokens", "flops", "loss", "ppl", "bpb"):
        table[column] = table[column].astype("float64")
    # Display order: sizes small to large, attentions in the fixed order, sweeps by their number.
    row_keys = list(
        zip(
            [size_sort_key(s) for s in table["size"]],
            [label_sort_key(a, lb) for a, lb in zip(table["attention"], table["label"], strict=True)],
            table["seed"],
            [SPLITS.index(s) for s in table["split"]],
            table["step"],
            strict=True,
        )
    )
    order = sorted(range(len(table)), key=row_keys.__getitem__)
    return table.iloc[order].reset_index(drop=True)


def _names(items: list[str]) -> str:
    shown = "; ".join(items[:MAX_NAMED])
    return shown + (f"; and {len(items) - MAX_NAMED} more" if len(items) > MAX_NAMED else "")
