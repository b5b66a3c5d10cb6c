"""A protocol's results from the tracking store, into results/<protocol>/ (tables as CSV, figures as PNG, README.md).

Everything is recomputed from the store by one command (`python -m lightning_modules study PROTOCOL --report`),
with lightning_modules/analysis doing the statistics:
- arms.csv            per arm: final test CE and bits per byte, mean and 95 % t-interval over seeds
- cache_matched.csv   per arm caching exactly as many bytes per token as an lrkv arm: arm - lrkv, paired
                      by seed, with intervals (the paper's open question)
- vs_mha.csv          per arm: test CE and bpb minus mha's, paired by seed (same seed = same init and data
                      order), mean and 95 % t-interval over the pairs, the paired t-test's p and its Holm-
                      adjusted p within the pair's family; `resolved` when the Holm-adjusted p < 0.05
- pairs.csv           every pair of arms of a size, at equal FLOPs (final test CE) and at equal tokens
                      (validation curves read at the pair's common token count), p and Holm p per family
                      (analysis/pairwise.py, analysis/families.py)
- pooled.csv          every pair's contrast under the pooled arm + seed model (analysis/pooled.py)
- tokens_to_target.csv, flops_to_target.csv   budget saved in reaching each baseline's final validation loss
                      (analysis/targets.py), paired by seed, with intervals
- cache_frontier.csv  KV-cache bytes per token against final test CE, Pareto-optimal points marked
- runs.csv            one row per run (tidy): identity, costs, tokens, FLOPs, test CE, bpb, commit, times
- evaluations.csv     every evaluation of every run (the tidy table of analysis/tidy.py)
- loss_vs_tokens.png, loss_vs_flops.png, cache_frontier.png, pairs.png (forest plot, analysis/forest.py)
- README.md           all of the above on one page (lightning_modules/reporting/readme.py)
Only done runs of the protocol's current identities count (same budget, same data manifest); runs of an
edited protocol or other data stay in the store but out of the report.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # headless: the report runs in terminals and CI

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from lightning_modules.analysis import (  # noqa: E402
    curves,
    forest,
    frontier,
    pairwise,
    pooled,
    stats,
    tables,
    targets,
    tidy,  # noqa: E402
)
from lightning_modules.analysis.analysis_errors import NoRunsError, StoreError  # noqa: E402
from lightning_modules.analysis.documents import PAGE as DOCUMENTS_PAGE  # noqa: E402
from lightning_modules.analysis.locations import sqlite_path  # noqa: E402
from lightning_modules.analysis.tidy import final_losses, load_runs  # noqa: E402
from lightning_modules.costs.counts import BASELINE  # noqa: E402
from lightning_modules.reporting import ledger_tables, results_index  # noqa: E402
from lightning_modules.reporting.ledger_tables import LedgerTables  # noqa: E402
from lightning_modules.reporting.readme import readme  # noqa: E402
from lightning_modules.study.claims import Store  # noqa: E402
from lightning_modules.study.ledger import IDENTITY, default_folder  # noqa: E402
from lightning_modules.study.protocol import RESUMED_UTC, ROOT, TAG, UTC_FORMAT, Protocol  # noqa: E402

if TYPE_CHECKING:
    from mlflow.entities import Run


def load(protocol: Protocol, uri: str, ledger: LedgerTables | None = None) -> pd.DataFrame:
    """The tidy table (analysis/tidy.py) of the protocol's done runs of its current identities: the store's,
    and the ledger's runs the store lacks (ledger.py: done on other machines). The store wins where both
    hold a run: it is the newer record on this machine."""
    runs = _store_table(protocol, uri, required=ledger is None or ledger.empty)
    if ledger is not None and not ledger.empty:
        have = set(zip(runs["size"], runs["label"], runs["seed"], strict=True))
        extra = ledger.evaluations
        new = [
            (a, b, c) not in have
            for a, b, c in zip(extra["size"], extra["label"], extra["seed"], strict=True)
        ]
        runs = tidy.typed(
            pd.concat([runs, extra[pd.Series(new, index=extra.index, dtype=bool)]], ignore_index=True)
        )
    if runs.empty:
        raise NoRunsError(f"no done runs of protocol {protocol.name!r} in {uri} or its ledger; run it first: "
                          f"python -m lightning_modules study {protocol.path}")  # fmt: skip
    return runs


def _store_table(protocol: Protocol, uri: str, required: bool) -> pd.DataFrame:
    """The store's part of load(); an empty table when the store has none and the ledger may have them."""
    first = protocol.runs[0]
    tags = {TAG + "protocol": protocol.name, TAG + "data": first.data_hash, "budget": first.budget.describe()}
    try:
        runs = load_runs(uri, protocol.experiment, tags=tags)
    except (NoRunsError, StoreError):
        if required:
            raise
        return tidy.typed(pd.DataFrame(columns=list(tidy.COLUMNS)))
    tested = set(runs.loc[runs["split"] == "test", "run_id"])
    wanted = {(s.size, s.label, s.seed) for s in protocol.runs}
    planned = pd.Series(
        [(a, b, c) in wanted for a, b, c in zip(runs["size"], runs["label"], runs["seed"], strict=True)],
        index=runs.index,
        dtype=bool,
    )
    keep = runs["run_id"].isin(tested) & planned
    return runs[keep].reset_index(drop=True)


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


def paired_differences(
    runs: pd.DataFrame, baseline_kind: str = BASELINE, pairs: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Per size and arm: (arm - baseline) of test CE and bpb over the seeds both ran, mean and t-interval,
    with the pair's p and Holm p from `pairs` (analysis/pairwise.py's table; by default every pair secondary)."""
    finals = final_losses(runs)
    pairs = pairwise.pair_table(runs) if pairs is None else pairs
    rows = []
    for size, part in finals.groupby("size", sort=False):
        base = part[part["attention"] == baseline_kind]
        if base.empty:
            continue
        base_label = str(base["label"].iloc[0])
        for label in part["label"].unique():
            if label != base_label:
                rows.append(_paired(part, size, str(label), base_label, pairs))
    return pd.DataFrame(rows)


def cache_matched_differences(
    runs: pd.DataFrame, reference_kind: str = "lrkv", pairs: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The paper's open question, at equal KV-cache bytes per token: (arm - lrkv) paired by seed, for every
    arm of another attention that caches exactly as many bytes as an lrkv arm of the same size; p and Holm p
    as in paired_differences."""
    finals = final_losses(runs)
    pairs = pairwise.pair_table(runs) if pairs is None else pairs
    rows = []
    for size, part in finals.groupby("size", sort=False):
        cache = part.groupby("label", sort=False)["kv_cache_bytes_per_token"].first()
        kinds = part.groupby("label", sort=False)["attention"].first()
        for ref in kinds[kinds == reference_kind].index:
            for label in kinds.index:
                if kinds[label] != reference_kind and cache[label] == cache[ref]:
                    row = _paired(part, size, str(label), str(ref), pairs)
                    row["kv_cache_vs_mha"] = float(part.loc[part["label"] == ref, "kv_cache_vs_mha"].iloc[0])
                    rows.append(row)
    return pd.DataFrame(rows)


def _paired(part: pd.DataFrame, size: str, label: str, base_label: str, pairs: pd.DataFrame) -> dict:
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
    test = _pair_test(pairs, size, label, base_label)
    row.update({"family": test["family"], "p": test["p"], "p_holm": test["p_holm"]})
    # Resolved after Holm's correction within the pair's family, not by the raw interval alone: with many
    # pairs, one raw 95 % interval in twenty excludes 0 by chance (analysis/multiplicity.py).
    row["resolved"] = bool(test["p_holm"] < 0.05)
    return row


def _pair_test(pairs: pd.DataFrame, size: str, label: str, base_label: str) -> pd.Series:
    """The equal-FLOP row of `pairs` for the two arms, whichever way round it is oriented (p is symmetric)."""
    flops = pairs[(pairs["view"] == pairwise.EQUAL_FLOPS) & (pairs["size"] == size)]
    match = flops[((flops["a"] == label) & (flops["b"] == base_label))
                  | ((flops["a"] == base_label) & (flops["b"] == label))]  # fmt: skip
    return match.iloc[0]


def _sd(values: list[float]) -> float:
    return float(pd.Series(values).std(ddof=1)) if len(values) > 1 else math.nan


def per_run_table(
    runs: pd.DataFrame,
    store: Store | None,
    protocol: Protocol | None = None,
    ledger: LedgerTables | None = None,
) -> pd.DataFrame:
    """One row per run. With the protocol, each row carries its identity and data hash (what the ledger
    matches runs by, ledger.py); a run only the ledger holds keeps the ledger's row (start, end, machine,
    CPU kind came from the store of the machine that ran it)."""
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
    if protocol is not None:
        specs = {(s.size, s.label, s.seed): s for s in protocol.runs}
        keys = list(zip(table["size"], table["label"], table["seed"], strict=True))
        table.insert(0, IDENTITY, [specs[k].identity for k in keys])
        table.insert(1, "data", [specs[k].data_hash for k in keys])
    from_ledger = set(ledger.runs["run_id"]) if ledger is not None and not ledger.empty else set()
    if store is not None:  # a run this store holds too is reported from the store, the fresher record
        from_ledger -= {i for i in from_ledger if _has_run(store, i)}
    stored = table[~table["run_id"].isin(from_ledger)].copy()
    if store is not None and not stored.empty:
        stored = _with_store(stored, store)
    if not from_ledger:
        return stored
    assert ledger is not None  # from_ledger is empty otherwise
    # Only the runs the store lacks: a run both hold is already in `stored`, and listing it again would count it
    # twice (a report on the machine that ran it, after its ledger row was committed).
    kept = ledger.runs[ledger.runs["run_id"].isin(from_ledger & set(table["run_id"]))]
    order = {run_id: i for i, run_id in enumerate(table["run_id"])}
    merged = pd.concat([stored, kept.reindex(columns=stored.columns.union(kept.columns, sort=False))])
    return merged.sort_values("run_id", key=lambda ids: ids.map(order)).reset_index(drop=True)


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
    table["settings"] = [infos[i].data.tags.get(TAG + "settings", "") for i in table["run_id"]]
    table["resumed_utc"] = [infos[i].data.tags.get(RESUMED_UTC, "") for i in table["run_id"]]
    table["last_attempt_s"] = [last_attempt_s(infos[i]) for i in table["run_id"]]
    return table


def last_attempt_s(run: Run) -> float:
    """Seconds from the start of the attempt that finished the run to its end: the whole run when it was never
    stopped, the resumed or restarted part when it was (runner.py's RESUMED_UTC), NaN while it has not ended."""
    end = run.info.end_time
    if not end:
        return math.nan
    resumed = run.data.tags.get(RESUMED_UTC, "")
    if resumed:
        began = dt.datetime.strptime(resumed, UTC_FORMAT).replace(tzinfo=dt.UTC)
        return end / 1000 - began.timestamp()
    if run.data.tags.get(TAG + "resumed_from_step", ""):  # stopped and resumed before the tag was recorded
        return math.nan
    return (end - run.info.start_time) / 1000


def _has_run(store: Store, run_id: str) -> bool:
    # late, as store.py imports mlflow: it warns while it imports
    from mlflow.exceptions import MlflowException

    try:
        store.client.get_run(run_id)
    except MlflowException:
        return False
    return True


def _store_exists(uri: str) -> bool:
    path = sqlite_path(uri)
    return path is None or path.exists()  # a server or another backend: assume it answers


def _runs(store: Store, run_ids: list[str]) -> list:
    return [store.client.get_run(run_id) for run_id in run_ids]


def _utc(ms: int | None) -> str:
    if not ms:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime(UTC_FORMAT)


# ----- writing ----------------------------------------------------------------------------------------
def write(
    protocol: Protocol,
    uri: str,
    out: Path | None = None,
    ledger_dir: Path | None = None,
) -> Path:
    """Write results/<protocol>/ (or `out`) from the store and the ledger (results/<protocol>/ or
    `ledger_dir`, read before anything is written); a folder in results/ also rebuilds the index
    results/README.md (lightning_modules/reporting/results_index.py)."""
    out = (out or ROOT / "results" / protocol.name).resolve()
    out.mkdir(parents=True, exist_ok=True)
    ledger = ledger_tables.read(ledger_dir or default_folder(protocol.name), protocol)
    runs = load(protocol, uri, ledger)
    # A report from the ledger alone opens no store (opening a missing SQLite file would create one).
    store = Store(uri, protocol.experiment) if _store_exists(uri) else None
    arms = arm_table(runs)
    pairs = pairwise.pair_table(runs, protocol.primary)
    pooled_pairs = pooled.pooled_table(runs, protocol.primary)
    diffs = paired_differences(runs, pairs=pairs)
    matched = cache_matched_differences(runs, pairs=pairs)
    to_target = {x: targets.tokens_to_target(runs, x) for x in ("tokens", "flops")}
    cache = frontier.cache_frontier(runs)
    per_run = per_run_table(runs, store, protocol, ledger)
    files = {"arms.csv": arms, "vs_mha.csv": diffs, "cache_matched.csv": matched, "pairs.csv": pairs,
             "pooled.csv": pooled_pairs, "tokens_to_target.csv": to_target["tokens"],
             "flops_to_target.csv": to_target["flops"], "cache_frontier.csv": cache, "runs.csv": per_run,
             "evaluations.csv": runs}  # fmt: skip
    for name, table in files.items():
        table.to_csv(out / name, index=False)
    _write_figures(protocol, runs, cache, out)
    fig = forest.plot_forest(pairs, title=f"study {protocol.name}: paired differences, equal FLOPs")
    fig.savefig(out / "pairs.png", dpi=150, bbox_inches="tight")
    plt.close(fig)
    planned = len(protocol.runs)
    done = len(per_run)  # done runs of the protocol's current identities, here or in the ledger
    tables = (arms, diffs, matched, to_target, cache, per_run)
    page = readme(protocol, uri, *tables, planned, min(done, planned), pairs=pairs, pooled=pooled_pairs,
                  documents=(out / DOCUMENTS_PAGE).is_file())  # fmt: skip
    (out / "README.md").write_text(page)
    print(
        f"study {protocol.name}: {len(per_run)}/{planned} runs reported; tables, figures and README.md in {out}"
    )
    if out.parent == (ROOT / "results").resolve():  # a folder elsewhere (--out) leaves its parent alone
        changed = results_index.write_index(out.parent, ROOT / "conf" / "study")
        print(f"{out.parent / results_index.INDEX}: {'rewritten' if changed else 'already up to date'}")
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
