"""Every pair of arms within a size, paired by seed (same seed = same initialisation and data order), in three
views, with Holm-adjusted p-values per declared family (analysis/families.py).

- view "equal_flops"   split "test", metric "loss": each run's final test cross-entropy at the end of training,
                       i.e. at the protocol's one FLOP budget (arms differ in the tokens they trained).
- view "equal_tokens"  split "val", metric "loss": each run's validation curve read at the pair's common token
                       count, the smaller of the two runs' last validated token counts for that seed (a fit
                       validates at its last step, lightning_modules/training/final_validation.py, so this is
                       the smaller final count; runs recorded before that read at their last validation)
                       (analysis/equal_tokens.py: linear in tokens, never extrapolated; a seed whose run has no
                       validation at or before the count is dropped from that pair and counted in `n_dropped`).
- view "equal_flops_val"  split "val", metric "loss": each run's validation loss at the end of training (its
                       final token count), the equal-FLOP view read on the split the equal-token view reads. It
                       is the control that separates the two differences between the views above: from
                       equal_flops to equal_flops_val only the split changes, from equal_flops_val to
                       equal_tokens only the token count. A run without a validation at its last step (recorded
                       before fits validated there) has no value and its seed is dropped and counted.

One row per (size, view, pair): a - b averaged over the seeds both ran (`n_pairs`), its sd, 95 % t-interval,
the paired t-test's two-sided `p` and `p_holm` (Holm within the view's primary or secondary family across the
table's sizes), and `resolved` = p_holm < 0.05. docs/statistics.md describes every table of the report.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

from lightning_modules.analysis.equal_tokens import loss_at
from lightning_modules.analysis.families import Pair, family, ordered_pairs, with_holm
from lightning_modules.analysis.multiplicity import paired_t
from lightning_modules.analysis.tidy import final_losses

EQUAL_FLOPS = "equal_flops"
EQUAL_TOKENS = "equal_tokens"
EQUAL_FLOPS_VAL = "equal_flops_val"
METRIC = "loss"  # cross-entropy in nats per token; bpb is the same loss times one constant per split
COLUMNS = ["size", "view", "split", "metric", "a", "b", "a_attention", "b_attention", "family", "n_pairs",
           "n_dropped", "tokens_mean", "diff_mean", "diff_sd", "ci_low", "ci_high", "p", "p_holm",
           "resolved"]  # fmt: skip


def pair_table(runs: pd.DataFrame, primary: Iterable[Pair] = ()) -> pd.DataFrame:
    """Both views of every pair of arms of every size of `runs` (the tidy table of analysis/tidy.py)."""
    primary = [tuple(p) for p in primary]
    finals = final_losses(runs)
    curves = runs[runs["split"] == "val"]
    rows = []
    for size, part in finals.groupby("size", sort=False):
        labels = [str(label) for label in dict.fromkeys(part["label"])]
        kinds = part.groupby("label", sort=False)["attention"].first().astype(str).to_dict()
        by_label = {label: part[part["label"] == label].set_index("seed") for label in labels}
        for a, b in ordered_pairs(labels, kinds, primary):
            common = {"size": size, "a": a, "b": b, "a_attention": kinds[a], "b_attention": kinds[b],
                      "family": family(a, b, primary), "metric": METRIC}  # fmt: skip
            rows.append({**common, **_equal_flops(by_label[a], by_label[b])})
            rows.append({**common, **_equal_tokens(by_label[a], by_label[b], curves)})
            rows.append({**common, **_equal_flops_val(by_label[a], by_label[b], curves)})
    return with_holm(pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("p_holm", "resolved")]))


def _equal_flops(a: pd.DataFrame, b: pd.DataFrame) -> dict:
    seeds = sorted(set(a.index) & set(b.index))
    diffs = [float(a.loc[s, METRIC] - b.loc[s, METRIC]) for s in seeds]
    return {"view": EQUAL_FLOPS, "split": "test", "n_dropped": 0, "tokens_mean": math.nan, **_test(diffs)}


def _equal_tokens(a: pd.DataFrame, b: pd.DataFrame, curves: pd.DataFrame) -> dict:
    diffs, counts, dropped = [], [], 0
    for seed in sorted(set(a.index) & set(b.index)):
        pair = [curves[curves["run_id"] == run.loc[seed, "run_id"]] for run in (a, b)]
        tokens = float(min(curve["tokens"].max() for curve in pair))  # NaN when a run has no validation
        at = [loss_at(curve, tokens, METRIC) for curve in pair]
        if any(math.isnan(v) for v in at):
            dropped += 1
            continue
        diffs.append(at[0] - at[1])
        counts.append(tokens)
    mean_tokens = sum(counts) / len(counts) if counts else math.nan
    return {"view": EQUAL_TOKENS, "split": "val", "n_dropped": dropped, "tokens_mean": mean_tokens,
            **_test(diffs)}  # fmt: skip


def _equal_flops_val(a: pd.DataFrame, b: pd.DataFrame, curves: pd.DataFrame) -> dict:
    diffs, dropped = [], 0
    for seed in sorted(set(a.index) & set(b.index)):
        # each run at its own final token count (its test row's), where a fit's last validation lies
        at = [loss_at(curves[curves["run_id"] == run.loc[seed, "run_id"]], float(run.loc[seed, "tokens"]), METRIC)
              for run in (a, b)]  # fmt: skip
        if any(math.isnan(v) for v in at):
            dropped += 1
            continue
        diffs.append(at[0] - at[1])
    return {"view": EQUAL_FLOPS_VAL, "split": "val", "n_dropped": dropped, "tokens_mean": math.nan,
            **_test(diffs)}  # fmt: skip


def _test(diffs: list[float]) -> dict:
    t = paired_t(diffs)
    sd = t.se * math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    return {"n_pairs": len(diffs), "diff_mean": t.estimate, "diff_sd": sd, "ci_low": t.low, "ci_high": t.high,
            "p": t.p}  # fmt: skip
