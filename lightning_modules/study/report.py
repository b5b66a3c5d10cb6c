"""A protocol's results from the tracking store, into results/<protocol>/ (tables as CSV, figures as PNG, README.md).

Everything is recomputed from the store by one command (`python -m lightning_modules.study PROTOCOL --report`),
with lightning_modules/analysis doing the statistics:
- arms.csv            per arm: final test CE and bits per byte, mean and 95 % t-interval over seeds
- cache_matched.csv   per arm caching exactly as many bytes per token as an lrkv arm: arm - lrkv, paired
                      by seed, with intervals (the paper's open question)
- vs_mha.csv          per arm: test CE and bpb minus mha's, paired by seed (same seed = same init and data
                      order), mean and 95 % t-interval over the pairs; `resolved` when the interval excludes 0
- tokens_to_target.csv, flops_to_target.csv   budget saved in reaching each baseline's final validation loss
                      (analysis/targets.py), paired by seed, with intervals
- cache_frontier.csv  KV-cache bytes per token against final test CE, Pareto-optimal points marked
- runs.csv            one row per run (tidy): identity, costs, tokens, FLOPs, test CE, bpb, commit, times
- evaluations.csv     every evaluation of every run (the tidy table of analysis/runs.py)
- loss_vs_tokens.png, loss_vs_flops.png, cache_frontier.png
- README.md           all of the above on one page (lightning_modules/study/readme.py)
Only done runs of the protocol's current identities count (same budget, same data manifest); runs of an
edited protocol or other data stay in the store but out of the report.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: the report runs in terminals and CI

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from lightning_modules.analysis import curves, frontier, stats, tables, targets  # noqa: E402
from lightning_modules.analysis.errors import NoRunsError  # noqa: E402
from lightning_modules.analysis.runs import final_losses, load_runs  # noqa: E402
from lightning_modules.costs.counts import BASELINE  # noqa: E402
from lightning_modules.study import summary  # noqa: E402
from lightning_modules.study.protocol import ROOT, TAG, Protocol  # noqa: E402
from lightning_modules.study.readme import readme  # noqa: E402
from lightning_modules.study.store import Store, is_done  # noqa: E402


def load(protocol: Protocol, uri: str) -> pd.DataFrame:
    """The tidy table (analysis/runs.py) of the protocol's done runs of its current identities."""
    first = protocol.runs[0]
    tags = {TAG + "protocol": protocol.name, TAG + "data": first.data_hash, "budget": first.budget.describe()}
    runs = load_runs(uri, protocol.experiment, tags=tags)
    tested = set(runs.loc[runs["split"] == "test", "run_id"])
    wanted = {(s.size, s.label, s.seed) for s in protocol.runs}
    planned = pd.Series(
        [(a, b, c) in wanted for a, b, c in zip(runs["size"], runs["label"], runs["seed"], strict=True)],
        index=runs.index,
    )
    keep = runs["run_id"].isin(tested) & planned
    runs = runs[keep].reset_index(drop=True)
    if runs.empty:
        raise NoRunsError(f"no done runs of protocol {protocol.name!r} in {uri}; run it first: "
                          f"python -m lightning_modules.study {protocol.path}")  # fmt: skip
    return runs


def arm_table(runs: pd.DataFrame) -> pd.DataFrame:
    table = tables.final_loss_table(runs)
    finals = final_losses(runs)
    extra = finals.groupby(["size", "label"], sort=False).agg(
        params=("params", "first"),
        kv_cache_bytes_per_token=("kv_cache_bytes_per_token", "first"),
        kv_cache_vs_mha=("kv_cache_vs_mha", "first"),
        tokens=("tokens", "mean"),
        flops=("flops", "mean"),
    )
    return table.merge(extra.reset_index(), on=["size", "label"])


def paired_differences(runs: pd.DataFrame, baseline_kind: str = BASELINE) -> pd.DataFrame:
    """Per size and arm: (arm - baseline) of test CE and bpb over the seeds both ran, mean and t-interval."""
    finals = final_losses(runs)
    rows = []
    for size, part in finals.groupby("size", sort=False):
        base = part[part["attention"] == baseline_kind]
        if base.empty:
            continue
        base_label = str(base["label"].iloc[0])
        for label in part["label"].unique():
            if label != base_label:
                rows.append(_paired(part, size, str(label), base_label))
    return pd.DataFrame(rows)


def cache_matched_differences(runs: pd.DataFrame, reference_kind: str = "lrkv") -> pd.DataFrame:
    """The paper's open question, at equal KV-cache bytes per token: (arm - lrkv) paired by seed, for every
    arm of another attention that caches exactly as many bytes as an lrkv arm of the same size."""
    finals = final_losses(runs)
    rows = []
    for size, part in finals.groupby("size", sort=False):
        cache = part.groupby("label", sort=False)["kv_cache_bytes_per_token"].first()
        kinds = part.groupby("label", sort=False)["attention"].first()
        for ref in kinds[kinds == reference_kind].index:
            for label in kinds.index:
                if kinds[label] != reference_kind and cache[label] == cache[ref]:
                    row = _paired(part, size, str(label), str(ref))
                    row["kv_cache_vs_mha"] = float(part.loc[part["label"] == ref, "kv_cache_vs_mha"].iloc[0])
                    rows.append(row)
    return pd.DataFrame(rows)


def _paired(part: pd.DataFrame, size: str, label: str, base_label: str) -> dict:
    arm = part[part["label"] == label].set_index("seed")
    base = part[part["label"] == base_label].set_index("seed")
    seeds = sorted(set(arm.index) & set(base.index))
    row: dict = {"size": size, "label": label, "attention": str(arm["attention"].iloc[0]),
                 "baseline": base_label, "n_pairs": len(seeds)}  # fmt: skip
    for metric in ("loss", "bpb"):
        diff = [float(arm.loc[s, metric] - base.loc[s, metric]) for s in seeds]
        ci = stats.mean_ci(diff)
        row.update({f"{metric}_diff_mean": ci.mean, f"{metric}_diff_ci_low": ci.low,
                    f"{metric}_diff_ci_high": ci.high, f"{metric}_diff_sd": _sd(diff)})  # fmt: skip
    row["resolved"] = bool(row["loss_diff_ci_high"] < 0 or row["loss_diff_ci_low"] > 0)
    return row


def _sd(values: list[float]) -> float:
    return float(pd.Series(values).std(ddof=1)) if len(values) > 1 else math.nan


def per_run_table(runs: pd.DataFrame, store: Store | None) -> pd.DataFrame:
    finals = final_losses(runs)
    val = runs[runs["split"] == "val"]
    steps = val.groupby("run_id")["step"].max().rename("steps")
    columns = ["run_id", "run_name", "size", "attention", "label", "seed", "budget", "params",
               "kv_cache_bytes_per_token", "kv_cache_vs_mha", "train_flops_per_token", "tokens", "flops",
               "loss", "bpb", "git_commit"]  # fmt: skip
    table = (
        finals[columns]
        .rename(columns={"loss": "test_loss", "bpb": "test_bpb"})
        .merge(steps.reset_index(), on="run_id", how="left")
    )
    return table if store is None else _with_store(table, store)


def _with_store(table: pd.DataFrame, store: Store) -> pd.DataFrame:
    """The per-run table with what only the store knows: start, end and duration, machine, command."""
    infos = {r.info.run_id: r for r in _runs(store, list(table["run_id"]))}
    table["start_utc"] = [_utc(infos[i].info.start_time) for i in table["run_id"]]
    table["end_utc"] = [_utc(infos[i].info.end_time) for i in table["run_id"]]
    table["duration_s"] = [
        (infos[i].info.end_time - infos[i].info.start_time) / 1000 if infos[i].info.end_time else math.nan
        for i in table["run_id"]
    ]
    table["machine"] = [infos[i].data.tags.get(TAG + "machine", "") for i in table["run_id"]]
    table["device"] = [infos[i].data.tags.get(TAG + "device", "") for i in table["run_id"]]
    table["hardware"] = [infos[i].data.tags.get("hardware", "") for i in table["run_id"]]
    table["command"] = [infos[i].data.tags.get(TAG + "command", "") for i in table["run_id"]]
    table["resumed_from_step"] = [
        infos[i].data.tags.get(TAG + "resumed_from_step", "") for i in table["run_id"]
    ]
    return table


def _runs(store: Store, run_ids: list[str]) -> list:
    return [store.client.get_run(run_id) for run_id in run_ids]


def _utc(ms: int | None) -> str:
    if not ms:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


# ----- writing ----------------------------------------------------------------------------------------
def write(protocol: Protocol, uri: str, out: Path | None = None, front_page: Path | None = None) -> Path:
    """Write results/<protocol>/ (or `out`); with `front_page`, also rewrite that README's block for the
    protocol (lightning_modules/study/summary.py)."""
    if front_page is not None:  # a README that cannot take the block fails before anything is written
        summary.current_block(summary.read_readme(front_page), protocol.name)
    out = (out or ROOT / "results" / protocol.name).resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs = load(protocol, uri)
    store = Store(uri, protocol.experiment)
    arms = arm_table(runs)
    diffs = paired_differences(runs)
    matched = cache_matched_differences(runs)
    to_target = {x: targets.tokens_to_target(runs, x) for x in ("tokens", "flops")}
    cache = frontier.cache_frontier(runs)
    per_run = per_run_table(runs, store)
    files = {"arms.csv": arms, "vs_mha.csv": diffs, "cache_matched.csv": matched,
             "tokens_to_target.csv": to_target["tokens"], "flops_to_target.csv": to_target["flops"],
             "cache_frontier.csv": cache, "runs.csv": per_run, "evaluations.csv": runs}  # fmt: skip
    for name, table in files.items():
        table.to_csv(out / name, index=False)
    _write_figures(protocol, runs, cache, out)
    planned = len(protocol.runs)
    done = sum(is_done(r) for rs in store.protocol_runs(protocol.name).values() for r in rs)
    (out / "README.md").write_text(
        readme(protocol, uri, arms, diffs, matched, to_target, cache, per_run, planned, min(done, planned))
    )
    print(
        f"study {protocol.name}: {len(per_run)}/{planned} runs reported; tables, figures and README.md in {out}"
    )
    if front_page is not None:
        changed = summary.update_readme(
            front_page, protocol.name, summary.block(protocol.name, arms, diffs, matched)
        )
        print(
            f"{front_page}: study {protocol.name}'s block {'rewritten' if changed else 'already up to date'}"
        )
    return out


def _write_figures(protocol: Protocol, runs: pd.DataFrame, cache: pd.DataFrame, out: Path) -> None:
    """loss_vs_tokens.png, loss_vs_flops.png and cache_frontier.png."""
    for x in ("tokens", "flops"):
        fig = curves.plot_loss_curves(runs, x=x)
        fig.savefig(out / f"loss_vs_{x}.png", dpi=150, bbox_inches="tight")
        plt.close(fig)
    fig = frontier.plot_cache_frontier(cache, title=f"study {protocol.name}: final test loss vs KV cache")
    fig.savefig(out / "cache_frontier.png", dpi=150, bbox_inches="tight")
    plt.close(fig)
