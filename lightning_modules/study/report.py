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
from lightning_modules.study import summary  # noqa: E402
from lightning_modules.study.formatting import md_table, plain, signed  # noqa: E402
from lightning_modules.study.protocol import ROOT, TAG, Protocol  # noqa: E402
from lightning_modules.study.store import Store, is_done  # noqa: E402

BASELINE_KIND = "mha"  # differences and savings are against the full-cache baseline, as in the paper


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


def paired_differences(runs: pd.DataFrame, baseline_kind: str = BASELINE_KIND) -> pd.DataFrame:
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
    if store is not None:
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
    arms.to_csv(out / "arms.csv", index=False)
    diffs.to_csv(out / "vs_mha.csv", index=False)
    matched.to_csv(out / "cache_matched.csv", index=False)
    to_target["tokens"].to_csv(out / "tokens_to_target.csv", index=False)
    to_target["flops"].to_csv(out / "flops_to_target.csv", index=False)
    cache.to_csv(out / "cache_frontier.csv", index=False)
    per_run.to_csv(out / "runs.csv", index=False)
    runs.to_csv(out / "evaluations.csv", index=False)
    for x in ("tokens", "flops"):
        fig = curves.plot_loss_curves(runs, x=x)
        fig.savefig(out / f"loss_vs_{x}.png", dpi=150, bbox_inches="tight")
        plt.close(fig)
    fig = frontier.plot_cache_frontier(cache, title=f"study {protocol.name}: final test loss vs KV cache")
    fig.savefig(out / "cache_frontier.png", dpi=150, bbox_inches="tight")
    plt.close(fig)
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


def _saved(row: pd.Series) -> str:
    if row["n_reached"] < row["n"]:
        return f"not reached in {row['n'] - row['n_reached']}/{row['n']} pairs"
    if math.isnan(row["saved_ci_low"]):
        return f"{100 * row['saved_mean']:.1f} % (1 pair)"
    return (
        f"{100 * row['saved_mean']:.1f} % [{100 * row['saved_ci_low']:.1f}, {100 * row['saved_ci_high']:.1f}]"
    )


def readme(
    protocol: Protocol,
    uri: str,
    arms: pd.DataFrame,
    diffs: pd.DataFrame,
    matched: pd.DataFrame,
    to_target: dict[str, pd.DataFrame],
    cache: pd.DataFrame,
    per_run: pd.DataFrame,
    planned: int,
    done: int,
) -> str:
    first = protocol.runs[0]
    starts = [s for s in per_run.get("start_utc", []) if s]
    ends = [e for e in per_run.get("end_utc", []) if e]
    span = "unknown"
    if starts and ends:
        t0 = dt.datetime.strptime(min(starts), "%Y-%m-%d %H:%M:%S")
        t1 = dt.datetime.strptime(max(ends), "%Y-%m-%d %H:%M:%S")
        span = f"{(t1 - t0).total_seconds() / 60:.1f} min from {min(starts)} to {max(ends)} UTC"
    busy = per_run["duration_s"].sum() / 60 if "duration_s" in per_run else math.nan
    capability = sorted({h for h in per_run.get("hardware", []) if isinstance(h, str) and h})
    lines = [
        f"# Study `{protocol.name}`",
        "",
        protocol.description,
        "",
        f"Regenerate this folder from the store: `python -m lightning_modules.study "
        f"{_rel(protocol.path)} --report` (store `{uri}`, experiment `{protocol.experiment}`).",
        "",
        f"- Runs: {len(per_run)} reported, {done} of {planned} planned done "
        f"({len(protocol.sizes)} size(s) x {len(protocol.labels)} arms x {len(protocol.seeds)} seeds: "
        f"{', '.join(map(str, protocol.seeds))}).",
        f"- Budget: {first.budget.describe()} per run (equal training compute across arms); data "
        f"`{_rel(first.data_fragment)}`, manifest sha256 {first.data_hash}.",
        f"- Machine: {'; '.join(sorted({m for m in per_run.get('machine', []) if m})) or 'unknown'}"
        + (
            f"; device {', '.join(sorted({d for d in per_run.get('device', []) if d}))}"
            if "device" in per_run
            else ""
        )
        + (f"; {', '.join(capability)}" if capability else ""),
        f"- Date and wall time: {span}; {busy:.1f} min of run time summed over runs.",
        f"- Commit(s): {', '.join(sorted({str(c) for c in per_run['git_commit']}))}.",
        f"- Command: `{'; '.join(sorted({c for c in per_run.get('command', []) if c})) or 'unknown'}`.",
        f"- Report written {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}.",
        "",
        "## Final test loss per arm (mean [95 % t-interval] over seeds)",
        "",
    ]
    view = pd.DataFrame(
        {
            "size": arms["size"],
            "arm": arms["label"],
            "params": arms["params"].map(lambda v: f"{v:,.0f}"),
            "KV cache B/token": arms["kv_cache_bytes_per_token"].map(lambda v: f"{v:,.0f}"),
            "vs MHA": arms["kv_cache_vs_mha"].map(lambda v: f"{100 * v:.1f} %"),
            "tokens": arms["tokens"].map(lambda v: f"{v:,.0f}"),
            "seeds": arms["n"],
            "test CE (nats/token)": [
                plain(r.loss_mean, r.loss_ci_low, r.loss_ci_high) for r in arms.itertuples()
            ],
            "bits per byte": [plain(r.bpb_mean, r.bpb_ci_low, r.bpb_ci_high) for r in arms.itertuples()],
        }
    )
    lines += [md_table(view), ""]
    if not diffs.empty:
        lines += [
            f"## Difference to {diffs['baseline'].iloc[0]}, paired by seed (arm - baseline; negative: better)",
            "",
        ]
        view = pd.DataFrame(
            {
                "size": diffs["size"],
                "arm": diffs["label"],
                "pairs": diffs["n_pairs"],
                "test CE diff": [
                    signed(r.loss_diff_mean, r.loss_diff_ci_low, r.loss_diff_ci_high)
                    for r in diffs.itertuples()
                ],
                "sd of diff": diffs["loss_diff_sd"].map(lambda v: "" if math.isnan(v) else f"{v:.4f}"),
                "bpb diff": [
                    signed(r.bpb_diff_mean, r.bpb_diff_ci_low, r.bpb_diff_ci_high) for r in diffs.itertuples()
                ],
                "resolved (CI excludes 0)": diffs["resolved"].map({True: "yes", False: "no"}),
            }
        )
        lines += [md_table(view), "", resolution(diffs), ""]
    if not matched.empty:
        lines += [
            "## At equal KV-cache bytes per token: arm - lrkv, paired by seed (negative: the arm is better)",
            "",
            md_table(summary.matched_view(matched)),
            "",
        ]
    for x, title in (("tokens", "Tokens to target"), ("flops", "FLOPs to target")):
        saved = to_target[x]
        if saved.empty:
            continue
        mine = saved[(saved["baseline_attention"] == BASELINE_KIND) | (saved["attention"] == "lrkv")]
        lines += [
            f"## {title}: budget saved in reaching the baseline's final validation loss (paired by seed)",
            "",
            md_table(
                pd.DataFrame(
                    {
                        "size": mine["size"],
                        "reaches": mine["label"],
                        "baseline": mine["baseline"],
                        "pairs": mine["n"],
                        "saved": [_saved(r) for _, r in mine.iterrows()],
                    }
                )
            ),  # fmt: skip
            "",
            f"Every pair: `{x}_to_target.csv`.",
            "",
        ]
    lines += ["## Cache frontier (final test CE against KV-cache bytes per token)", ""]
    view = pd.DataFrame(
        {
            "size": cache["size"],
            "arm": cache["label"],
            "KV cache B/token": cache["kv_cache_bytes_per_token"].map(lambda v: f"{v:,.0f}"),
            "vs MHA": cache["kv_cache_vs_mha"].map(lambda v: f"{100 * v:.1f} %"),
            "test CE": [plain(r.loss_mean, r.loss_ci_low, r.loss_ci_high) for r in cache.itertuples()],
            "Pareto-optimal": cache["pareto"].map({True: "yes", False: ""}),
        }
    )
    lines += [md_table(view), ""]
    lines += [
        "## Figures",
        "",
        "![loss vs tokens](loss_vs_tokens.png)",
        "",
        "![loss vs FLOPs](loss_vs_flops.png)",
        "",
        "![cache frontier](cache_frontier.png)",
        "",
        "Files: "
        + ", ".join(
            f"`{n}`"
            for n in (
                "arms.csv",
                "vs_mha.csv",
                "cache_matched.csv",
                "tokens_to_target.csv",
                "flops_to_target.csv",
                "cache_frontier.csv",
                "runs.csv",
                "evaluations.csv",
            )
        )
        + ".",  # fmt: skip
        "",
    ]
    return "\n".join(lines)


def resolution(diffs: pd.DataFrame) -> str:
    """What gap these seeds can tell from noise: the half-width of the paired interval, t x sd / sqrt(n)."""
    half = (diffs["loss_diff_ci_high"] - diffs["loss_diff_ci_low"]) / 2
    if half.dropna().empty:
        return "One seed pair per arm: no interval, so no gap is resolved."
    sd = diffs["loss_diff_sd"].dropna()
    n = int(diffs["n_pairs"].min())
    return (
        f"Seed noise: the standard deviation of a paired difference over seeds is {sd.min():.4f}-{sd.max():.4f} "
        f"nats, so with {n} pairs a gap is resolved when it exceeds the 95 % half-width "
        f"{half.min():.4f}-{half.max():.4f} nats (t x sd / sqrt(n)); "
        f"{int(diffs['resolved'].sum())} of {len(diffs)} differences are."
    )


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
