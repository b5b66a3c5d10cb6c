"""Synthetic runs logged with the MLflow client exactly as the training module's contract says.

Curves are known closed forms, so tests can compare what the analysis reads and computes with the truth:
loss(t) = FLOOR[size] + OFFSET[kind] + SEED_SPREAD[seed] x SEED_SCALE[kind] + 2 / sqrt(1 + t / 1e5), t in training tokens.
Costs (cost.*) come from the real cost model, so FLOPs are tokens x train_flops_per_token of that config.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from lightning_modules.analysis.tidy import COST_COLUMNS
from lightning_modules.costs import counts as costs
from lightning_modules.model.attention import AttentionConfig, paper_names, resolve_attention
from lightning_modules.tracking import runs

EXPERIMENT = "lrkv-lab"
SIZES = ("nano", "20m")
SEEDS = (7, 8)
FLOOR = {"nano": 3.0, "20m": 2.6}
TOKENS_PER_STEP = {"nano": 4096, "20m": 8192}
EVAL_STEPS = {"nano": (50, 100, 150, 200, 250, 300), "20m": (100, 200, 300, 400, 500, 600)}
OFFSET = {"mha": 0.0, "mqa": 0.02, "gqa": 0.01, "mla": -0.01, "lrkv": -0.03}  # by attention kind
SEED_SCALE = {"mha": 0.004, "mqa": 0.002, "gqa": 0.003, "mla": 0.005, "lrkv": 0.001}
SEED_SPREAD = {7: 1.0, 8: -1.0}  # seed noise: SEED_SPREAD[seed] x SEED_SCALE[kind], so intervals differ
TEST_GAP = 0.01  # test loss = last validation loss + this
BYTES_PER_TOKEN = 4.0
# A small sweep at nano, one seed each: the frontier gets points beyond the five defaults, and the
# one-seed path (no interval) is exercised.
SWEEP = (("lrkv", {"rank": 16}, "lrkv-r16", -0.04), ("mla", {"kv_latent_dim": 32}, "mla-c32", 0.005))


@dataclass(frozen=True)
class RunSpec:
    size: str
    kind: str
    knobs: tuple[tuple[str, Any], ...]
    label: str
    seed: int
    offset: float

    @property
    def name(self) -> str:
        return f"{self.size}-{self.label}-seed{self.seed}"


def specs() -> list[RunSpec]:
    out = []
    for size in SIZES:
        for kind in paper_names():  # the reference paper's arms: OFFSET and SEED_SCALE are theirs
            model, attention = _configs(size, kind, {})
            label = attention.label()
            for seed in SEEDS:
                out.append(RunSpec(size, kind, (), label, seed, OFFSET[kind]))
    for kind, knobs, label, offset in SWEEP:
        out.append(RunSpec("nano", kind, tuple(knobs.items()), label, 7, offset))
    return out


def loss_at(spec: RunSpec, tokens: float) -> float:
    noise = SEED_SPREAD[spec.seed] * SEED_SCALE[spec.kind]
    return FLOOR[spec.size] + spec.offset + noise + 2.0 / math.sqrt(1.0 + tokens / 1e5)


def cost_row(spec: RunSpec) -> dict[str, Any]:
    model, attention = _configs(spec.size, spec.kind, dict(spec.knobs))
    return costs.cost_row(model, attention)


def log_synthetic_runs(tracking_uri: str) -> None:
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id = client.create_experiment(EXPERIMENT)
    for spec in specs():
        _log_run(client, experiment_id, spec)


def _configs(size: str, kind: str, knobs: dict[str, Any]) -> tuple[costs.ModelConfig, AttentionConfig]:
    model, attention = costs.load_configs([costs.fragment("model", size), costs.fragment("attention", kind)])
    return model, resolve_attention(model, dataclasses.replace(attention, **knobs))


def _log_run(client: MlflowClient, experiment_id: str, spec: RunSpec) -> None:
    model, attention = _configs(spec.size, spec.kind, dict(spec.knobs))
    row = costs.cost_row(model, attention)
    steps = EVAL_STEPS[spec.size]
    budget = steps[-1] * TOKENS_PER_STEP[spec.size]
    # The training CLI's own tag and parameter conventions (lightning_modules/tracking/store.py), so the contract
    # lives in one place; only the commit is pinned for determinism.
    tags = runs.run_tags(model, attention, spec.seed, f"tokens={budget:.3g}")
    tags["git_commit"] = "0123456789abcdef0123456789abcdef01234567"
    assert tags["attention_label"] == spec.label
    config = {"model": {"arch": dataclasses.asdict(model), "attention": dataclasses.asdict(attention)}}
    params = {k: str(v) for k, v in runs.flatten(config).items() if v is not None}
    params["data.batch_size"] = str(TOKENS_PER_STEP[spec.size] // model.seq_len)
    params["trainer.max_steps"] = str(steps[-1])
    for key in COST_COLUMNS:  # the cost parameters the loader reads
        params[f"cost.{key}"] = str(row[key])

    run = client.create_run(experiment_id, run_name=spec.name, tags=tags)
    flops_per_token = row["train_flops_per_token"]
    metrics = []
    ts = 1_700_000_000_000
    for step in range(10, steps[-1] + 1, 10):
        tokens = step * TOKENS_PER_STEP[spec.size]
        metrics += [
            Metric("train/loss", loss_at(spec, tokens) + 0.05, ts + step, step),
            Metric("train/tokens", float(tokens), ts + step, step),
            Metric("train/flops", tokens * flops_per_token, ts + step, step),
            Metric("train/tokens_per_s", 5000.0, ts + step, step),
        ]
    for step in steps:
        metrics += _eval_metrics("val", spec, step, flops_per_token, 0.0, ts + step)
    metrics += _eval_metrics("test", spec, steps[-1], flops_per_token, TEST_GAP, ts + steps[-1] + 1)
    client.log_batch(run.info.run_id, metrics=metrics, params=[Param(k, v) for k, v in params.items()])
    client.set_terminated(run.info.run_id)


def _eval_metrics(
    split: str, spec: RunSpec, step: int, flops_per_token: float, gap: float, ts: int
) -> list[Metric]:
    tokens = step * TOKENS_PER_STEP[spec.size]
    loss = loss_at(spec, tokens) + gap
    values = {
        "loss": loss,
        "ppl": math.exp(loss),
        "bpb": loss / (math.log(2) * BYTES_PER_TOKEN),
        "tokens": float(tokens),
        "flops": tokens * flops_per_token,
    }
    return [Metric(f"{split}/{k}", v, ts, step) for k, v in values.items()]


def tidy_table(
    curves: dict[tuple[str, str, str, int], list[tuple[float, float]]], flops_per_token: dict[str, float]
) -> Any:
    """A table in load_runs' columns, in memory, from {(size, attention, label, seed): [(tokens, loss), ...]}:
    one validation row per point (steps 1, 2, ...) and a test row equal to the last point. FLOPs are tokens x
    flops_per_token[label]. For tests whose answers follow from straight lines, not from a store."""
    import pandas as pd

    from lightning_modules.analysis.tidy import columns

    rows = []
    for (size, attention, label, seed), points in curves.items():
        run = {c: None for c in columns()}
        run.update(
            run_id=f"{size}-{label}-{seed}",
            run_name=f"{size}-{label}-seed{seed}",
            status="FINISHED",
            size=size,
            attention=attention,
            label=label,
            seed=seed,
        )
        evaluations = [("val", step, *point) for step, point in enumerate(points, start=1)]
        evaluations.append(("test", len(points), *points[-1]))
        for split, step, tokens, loss in evaluations:
            rows.append(
                {
                    **run,
                    "split": split,
                    "step": step,
                    "tokens": float(tokens),
                    "loss": float(loss),
                    "flops": float(tokens) * flops_per_token[label],
                }
            )
    return pd.DataFrame(rows, columns=list(columns()))
