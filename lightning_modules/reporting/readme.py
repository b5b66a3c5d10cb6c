"""results/<protocol>/README.md: the report's page of a study, one section per table it writes.

report.write (lightning_modules/reporting/report.py) computes the tables and hands them here: the provenance
header (runs, budget, machine, dates, commits, command), the final loss per arm, the paired differences to
the baseline with the seed noise they resolve, the cache-matched differences, every pair of arms at equal FLOPs
and at equal tokens (primary family first, then secondary), the pooled arm + seed contrasts, the budget saved
to each target, the cache frontier, the figures and every run's provenance
(lightning_modules/reporting/runs_section.py). The front page's block is another text
(lightning_modules/reporting/results_index.py).
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import pandas as pd

from lightning_modules.analysis.formatting import md_table, p_value, percent, plain, signed
from lightning_modules.costs.counts import BASELINE
from lightning_modules.reporting.runs_section import runs_section
from lightning_modules.study.protocol import ROOT, UTC_FORMAT, Protocol

FILES = ("arms.csv", "vs_mha.csv", "cache_matched.csv", "pairs.csv", "pooled.csv", "tokens_to_target.csv",
         "flops_to_target.csv", "cache_frontier.csv", "runs.csv", "evaluations.csv")  # fmt: skip


def tested(table: pd.DataFrame) -> bool:
    """Whether the table carries p-values (tables written before the Holm correction do not: their
    `resolved` is the raw interval's)."""
    return "p_holm" in table.columns


def resolved_header(table: pd.DataFrame) -> str:
    return "resolved (Holm p < 0.05)" if tested(table) else "resolved (CI excludes 0)"


def p_columns(table: pd.DataFrame) -> dict[str, pd.Series]:
    """p, Holm p and family columns of a vs-mha or cache-matched table (none for an older table)."""
    if not tested(table):
        return {}
    return {"p": table["p"].map(p_value), "Holm p": table["p_holm"].map(p_value), "family": table["family"]}


def matched_view(matched: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "size": matched["size"],
            "arm": matched["label"],
            "vs": matched["baseline"],
            "KV cache vs MHA (both)": matched["kv_cache_vs_mha"].map(percent),
            "pairs": matched["n_pairs"],
            "test CE diff": [
                signed(r.loss_diff_mean, r.loss_diff_ci_low, r.loss_diff_ci_high)
                for r in matched.itertuples()
            ],
            **p_columns(matched),
            resolved_header(matched): matched["resolved"].map({True: "yes", False: "no"}),
        }
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
    pairs: pd.DataFrame | None = None,
    pooled: pd.DataFrame | None = None,
    documents: bool = False,
) -> str:
    """The page: the tables of report.write (lightning_modules/reporting/report.py), section by section."""
    lines = _header(protocol, uri, per_run, planned, done)
    lines += _arms_section(arms)
    lines += _differences_section(diffs)
    lines += _matched_section(matched)
    if pairs is not None:
        lines += pairs_sections(pairs, bool(protocol.primary))
    if pooled is not None:
        lines += pooled_section(pooled)
    lines += _to_target_sections(to_target)
    lines += _frontier_section(cache)
    lines += _figures_section(documents)
    lines += runs_section(per_run)
    return "\n".join(lines)


# ----- provenance -------------------------------------------------------------------------------------
def _header(protocol: Protocol, uri: str, per_run: pd.DataFrame, planned: int, done: int) -> list[str]:
    first = protocol.runs[0]
    busy = per_run["duration_s"].sum() / 60 if "duration_s" in per_run else math.nan
    commits = ", ".join(sorted({str(c) for c in per_run["git_commit"]}))
    command = "; ".join(sorted({c for c in per_run.get("command", []) if c})) or "unknown"
    return [
        f"# Study `{protocol.name}`",
        "",
        protocol.description,
        "",
        f"Regenerate this folder from the store and this folder's ledger (runs.csv, evaluations.csv: runs done "
        f"on other machines): `python -m lightning_modules study {_rel(protocol.path)} --report` (store "
        f"`{uri}`, experiment `{protocol.experiment}`).",
        "",
        f"- Runs: {done} of {planned} done "
        f"({len(protocol.sizes)} size(s) x {len(protocol.labels)} arms x {len(protocol.seeds)} seeds: "
        f"{', '.join(map(str, protocol.seeds))}).{_remaining(protocol, per_run)}",
        f"- Budget: {first.budget.describe()} per run ({_budget_kind(first.budget.flops)}); data "
        f"`{_rel(first.data_fragment)}`, manifest sha256 {first.data_hash}.",
        f"- Machine: {_machine(per_run)}",
        f"- CPU kind (lightning_modules/core/precision.py): {_kinds(per_run)}.",
        f"- Date and wall time: {_span(per_run)}; {busy:.1f} min of run time summed over runs.",
        f"- Commit(s): {commits}.",
        f"- Command: `{command}`.",
        f"- Report written {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}.",
        "",
    ]


def _remaining(protocol: Protocol, per_run: pd.DataFrame) -> str:
    """The runs not done yet, named, so a partial report says what is missing."""
    done = set(zip(per_run["size"], per_run["label"], per_run["seed"], strict=True))
    left = [
        f"{s.size} {s.label} seed {s.seed}" for s in protocol.runs if (s.size, s.label, s.seed) not in done
    ]
    return f" Not done yet: {'; '.join(left)}." if left else ""


def _budget_kind(flops: float | None) -> str:
    return "equal training compute across arms" if flops is not None else "equal training tokens across arms"


def _kinds(per_run: pd.DataFrame) -> str:
    if "hardware" not in per_run:
        return "not recorded"
    counts = per_run["hardware"].fillna("not recorded").replace("", "not recorded").value_counts()
    return ", ".join(f"{kind} ({n} runs)" for kind, n in counts.items())


def _span(per_run: pd.DataFrame) -> str:
    """Wall time from the first run's start to the last one's end ("unknown" without the store's times)."""
    starts = [s for s in per_run.get("start_utc", []) if s]
    ends = [e for e in per_run.get("end_utc", []) if e]
    if not (starts and ends):
        return "unknown"
    t0 = dt.datetime.strptime(min(starts), UTC_FORMAT)
    t1 = dt.datetime.strptime(max(ends), UTC_FORMAT)
    return f"{(t1 - t0).total_seconds() / 60:.1f} min from {min(starts)} to {max(ends)} UTC"


def _machine(per_run: pd.DataFrame) -> str:
    """The machines, then (when recorded) the devices and the hardware capabilities the runs report."""
    text = "; ".join(sorted({m for m in per_run.get("machine", []) if m})) or "unknown"
    if "device" in per_run:
        text += f"; device {', '.join(sorted({d for d in per_run.get('device', []) if d}))}"
    capability = sorted({h for h in per_run.get("hardware", []) if isinstance(h, str) and h})
    if capability:
        text += f"; {', '.join(capability)}"
    return text


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# ----- tables -----------------------------------------------------------------------------------------
def _whole(value: float) -> str:
    return f"{value:,.0f}"


def _arms_section(arms: pd.DataFrame) -> list[str]:
    view = pd.DataFrame(
        {
            "size": arms["size"],
            "arm": arms["label"],
            "params": arms["params"].map(_whole),
            "KV cache B/token": arms["kv_cache_bytes_per_token"].map(_whole),
            "vs MHA": arms["kv_cache_vs_mha"].map(percent),
            "tokens": arms["tokens"].map(_whole),
            "seeds": arms["n"],
            "test CE (nats/token)": [
                plain(r.loss_mean, r.loss_ci_low, r.loss_ci_high) for r in arms.itertuples()
            ],
            "bits per byte": [plain(r.bpb_mean, r.bpb_ci_low, r.bpb_ci_high) for r in arms.itertuples()],
        }
    )
    return ["## Final test loss per arm (mean [95 % t-interval] over seeds)", "", md_table(view), ""]


def _differences_section(diffs: pd.DataFrame) -> list[str]:
    if diffs.empty:
        return []
    view = pd.DataFrame(
        {
            "size": diffs["size"],
            "arm": diffs["label"],
            "pairs": diffs["n_pairs"],
            "test CE diff": [
                signed(r.loss_diff_mean, r.loss_diff_ci_low, r.loss_diff_ci_high) for r in diffs.itertuples()
            ],
            "sd of diff": diffs["loss_diff_sd"].map(lambda v: "" if math.isnan(v) else f"{v:.4f}"),
            "bpb diff": [
                signed(r.bpb_diff_mean, r.bpb_diff_ci_low, r.bpb_diff_ci_high) for r in diffs.itertuples()
            ],
            **p_columns(diffs),
            resolved_header(diffs): diffs["resolved"].map({True: "yes", False: "no"}),
        }
    )
    title = f"## Difference to {diffs['baseline'].iloc[0]}, paired by seed (arm - baseline; negative: better)"
    return [title, "", md_table(view), "", resolution(diffs), ""]


def resolution(diffs: pd.DataFrame) -> str:
    """What gap these seeds can tell from noise: the half-width of the paired interval, t x sd / sqrt(n)."""
    half = (diffs["loss_diff_ci_high"] - diffs["loss_diff_ci_low"]) / 2
    if half.dropna().empty:
        return "One seed pair per arm: no interval, so no gap is resolved."
    sd = diffs["loss_diff_sd"].dropna()
    low, high = int(diffs["n_pairs"].min()), int(diffs["n_pairs"].max())
    n = str(low) if low == high else f"{low}-{high}"  # arms part-way through a seed have fewer pairs
    return (
        f"Seed noise: the standard deviation of a paired difference over seeds is {sd.min():.4f}-{sd.max():.4f} "
        f"nats, so with {n} pairs a gap is resolved when it exceeds the 95 % half-width "
        f"{half.min():.4f}-{half.max():.4f} nats (t x sd / sqrt(n)) before any correction for testing many "
        f"pairs; {int(diffs['resolved'].sum())} of {len(diffs)} differences are resolved"
        + (" after Holm's correction within their family (Holm p < 0.05)." if "p_holm" in diffs else ".")
    )


def _matched_section(matched: pd.DataFrame) -> list[str]:
    if matched.empty:
        return []
    return [
        "## At equal KV-cache bytes per token: arm - lrkv, paired by seed (negative: the arm is better)",
        "",
        md_table(matched_view(matched)),
        "",
    ]


def pairs_sections(pairs: pd.DataFrame, declared: bool) -> list[str]:
    """Every pair of arms, per view: the primary family's table first, then the secondary one."""
    if pairs.empty:
        return []
    lines = [
        "## Every pair of arms, paired by seed (a - b; negative: a is better)",
        "",
        _families_text(pairs, declared),
        "",
    ]
    for view, title in (("equal_flops", "At equal FLOPs: final test CE (the protocol's budget)"),
                        ("equal_tokens", "At equal tokens: validation CE at the pair's common token count"),
                        ("equal_flops_val", "At equal FLOPs on the validation split: validation CE at each "
                                            "run's last step (the control between the two views above)")):  # fmt: skip
        part = pairs[pairs["view"] == view]
        if part.empty:  # a table written before the view existed
            continue
        if part["n_pairs"].sum() == 0:  # nothing to tabulate: only the sentence saying why
            lines += [f"### {title}", "", VIEW_TEXT.get(view, _equal_tokens_text)(part), ""]
            continue
        for fam in ("primary", "secondary"):
            rows = part[part["family"] == fam]
            if not rows.empty:
                lines += [
                    f"### {title}, {fam} family ({len(rows)} pairs)",
                    "",
                    md_table(_pairs_view(rows)),
                    "",
                ]
        if view in VIEW_TEXT:
            lines += [VIEW_TEXT[view](part), ""]
    lines += ["![paired differences](pairs.png)", "", "Every row: `pairs.csv`.", ""]
    return lines


def _families_text(pairs: pd.DataFrame, declared: bool) -> str:
    flops = pairs[pairs["view"] == "equal_flops"]
    counts = flops["family"].value_counts()
    head = (
        f"{counts.get('primary', 0)} primary comparison(s) declared by the protocol (`comparisons.primary`)"
        if declared
        else "No primary comparison was declared (the protocol has no `comparisons.primary`): every pair is secondary"
    )
    return (
        f"{head}; {counts.get('secondary', 0)} secondary pair(s). p is the paired t-test's (two-sided, n - 1 "
        "degrees of freedom); Holm p is Holm's step-down adjustment within the family and view, which keeps the "
        "chance of any false claim in the family at 5 %; resolved: Holm p < 0.05."
    )


def _pairs_view(rows: pd.DataFrame) -> pd.DataFrame:
    at_tokens = {}  # the common token count: only the equal-token view has one
    if (rows["view"] == "equal_tokens").all():
        at_tokens = {"at tokens": rows["tokens_mean"].map(lambda v: "" if math.isnan(v) else _whole(v))}
    return pd.DataFrame(
        {
            "size": rows["size"],
            "a - b": [f"{r.a} - {r.b}" for r in rows.itertuples()],
            "pairs": [
                f"{r.n_pairs}" + (f" ({r.n_dropped} dropped)" if r.n_dropped else "")
                for r in rows.itertuples()
            ],
            **at_tokens,
            "diff": [signed(r.diff_mean, r.ci_low, r.ci_high) for r in rows.itertuples()],
            "sd": rows["diff_sd"].map(lambda v: "" if math.isnan(v) else f"{v:.4f}"),
            "p": rows["p"].map(p_value),
            "Holm p": rows["p_holm"].map(p_value),
            "resolved": rows["resolved"].map({True: "yes", False: "no"}),
        }
    )


def _with_drops(text: str, part: pd.DataFrame, why: str) -> str:
    """The view's sentence, and how many seed pairs it dropped and why."""
    dropped = int(part["n_dropped"].sum())
    if dropped == 0:
        return text
    return (
        text[:-1]
        + f"; {dropped} of {dropped + int(part['n_pairs'].sum())} seed pairs were dropped because {why}."
    )


def _equal_tokens_text(part: pd.DataFrame) -> str:
    text = (
        "Equal tokens: each seed's pair is read at the smaller of the two runs' final token counts, on each run's "
        "validation curve interpolated linearly in tokens, never extrapolated"
    )
    if int(part["n_dropped"].sum()) == 0:
        return text + "; no pair was dropped."
    why = "a run's last validation came before that count (validate at the end of training to keep them)"
    return _with_drops(text + ".", part, why)


def _final_val_text(part: pd.DataFrame) -> str:
    text = (
        "Equal FLOPs on the validation split: each run's validation CE at its last step, on the split the "
        "equal-token view reads. From the equal-FLOP table to this one only the split changes; from this one to "
        "the equal-token table only the token count does."
    )
    return _with_drops(
        text, part, "a run did not validate at its last step (recorded before fits validated there)"
    )


VIEW_TEXT = {"equal_tokens": _equal_tokens_text, "equal_flops_val": _final_val_text}


def pooled_section(pooled: pd.DataFrame) -> list[str]:
    """The pooled arm + seed model's contrasts, primary family first, and the assumption they rest on."""
    if pooled.empty:
        return []
    first = pooled.iloc[0]
    lines = [
        "## Pooled arm + seed model (final test CE = mu + arm + seed + noise, least squares per size)",
        "",
        f"Residual sd {first['residual_sd']:.4f} nats with {int(first['df'])} degrees of freedom "
        f"({int(first['n_arms'])} arms x {int(first['n_seeds'])} complete seeds"
        + (f", {int(first['seeds_dropped'])} incomplete seed(s) left out" if first["seeds_dropped"] else "")
        + "). The noise is estimated from every arm's residuals at once, so the intervals are tighter than one "
        "pair's, on the assumption that the noise is homogeneous (every pair of arms scatters alike over seeds, "
        "no arm x seed interaction); the per-pair tables above do not assume it. Holm within each family.",
        "",
    ]
    for fam in ("primary", "secondary"):
        rows = pooled[pooled["family"] == fam]
        if rows.empty:
            continue
        view = pd.DataFrame(
            {
                "size": rows["size"],
                "a - b": [f"{r.a} - {r.b}" for r in rows.itertuples()],
                "diff": [signed(r.diff_mean, r.ci_low, r.ci_high) for r in rows.itertuples()],
                "p": rows["p"].map(p_value),
                "Holm p": rows["p_holm"].map(p_value),
                "resolved": rows["resolved"].map({True: "yes", False: "no"}),
            }
        )
        lines += [f"### {fam} family ({len(rows)} pairs)", "", md_table(view), ""]
    return lines + ["Every row: `pooled.csv`.", ""]


def _to_target_sections(to_target: dict[str, pd.DataFrame]) -> list[str]:
    """Per budget axis: what reaching the baseline's final validation loss saved, for the rows against the
    baseline and the rows where lrkv does the reaching."""
    lines: list[str] = []
    for x, title in (("tokens", "Tokens to target"), ("flops", "FLOPs to target")):
        saved = to_target[x]
        if saved.empty:
            continue
        mine = saved[(saved["baseline_attention"] == BASELINE) | (saved["attention"] == "lrkv")]
        view = pd.DataFrame(
            {
                "size": mine["size"],
                "reaches": mine["label"],
                "baseline": mine["baseline"],
                "pairs": mine["n"],
                "saved": [_saved(r) for _, r in mine.iterrows()],
            }
        )
        lines += [
            f"## {title}: budget saved in reaching the baseline's final validation loss (paired by seed)",
            "",
            md_table(view),
            "",
            f"Every pair: `{x}_to_target.csv`.",
            "",
        ]
    return lines


def _saved(row: pd.Series) -> str:
    if row["n_reached"] < row["n"]:
        return f"not reached in {row['n'] - row['n_reached']}/{row['n']} pairs"
    if math.isnan(row["saved_ci_low"]):
        return f"{100 * row['saved_mean']:.1f} % (1 pair)"
    return (
        f"{100 * row['saved_mean']:.1f} % [{100 * row['saved_ci_low']:.1f}, {100 * row['saved_ci_high']:.1f}]"
    )


def _frontier_section(cache: pd.DataFrame) -> list[str]:
    view = pd.DataFrame(
        {
            "size": cache["size"],
            "arm": cache["label"],
            "KV cache B/token": cache["kv_cache_bytes_per_token"].map(_whole),
            "vs MHA": cache["kv_cache_vs_mha"].map(percent),
            "test CE": [plain(r.loss_mean, r.loss_ci_low, r.loss_ci_high) for r in cache.itertuples()],
            "Pareto-optimal": cache["pareto"].map({True: "yes", False: ""}),
        }
    )
    return ["## Cache frontier (final test CE against KV-cache bytes per token)", "", md_table(view), ""]


def _figures_section(documents: bool = False) -> list[str]:
    return [
        "## Figures",
        "",
        "![loss vs tokens](loss_vs_tokens.png)",
        "",
        "![loss vs FLOPs](loss_vs_flops.png)",
        "",
        "![cache frontier](cache_frontier.png)",
        "",
        "Files: " + ", ".join(f"`{n}`" for n in FILES) + ".",
        "",
    ] + (
        [
            "How far the evaluation documents, not only the seeds, move each gap: `documents.md` (written by "
            '`python -m lightning_modules score-documents`, docs/statistics.md "Seeds and documents").',
            "",
        ]
        if documents
        else []
    )
