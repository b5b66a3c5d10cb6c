"""Every pair of arms at equal FLOPs and at equal tokens, the pooled arm + seed model, the declared families
and Holm within them (lightning_modules/analysis/pairwise.py, pooled.py, families.py), on tables built so
that the answers are known exactly, then on the committed results/ of the two CPU studies."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from lightning_modules.analysis import forest, pairwise, pooled
from lightning_modules.analysis.multiplicity import holm
from lightning_modules.analysis.tidy import COLUMNS
from lightning_modules.core.errors import ConfigError
from lightning_modules.reporting import readme, report
from lightning_modules.study import protocol as protocols
from tests.study.helpers import micro_protocol

ROOT = Path(__file__).resolve().parents[2]


def _row(label: str, attention: str, seed: int, split: str, step: int, tokens: float, loss: float) -> dict:
    row = {c: math.nan for c in COLUMNS}
    row.update(run_id=f"{label}-{seed}", run_name=f"5m-{label}-seed{seed}", status="FINISHED", size="5m",
               attention=attention, label=label, seed=seed, budget="flops=7e+12", git_commit="abc",
               kv_cache_bytes_per_token=2048.0, kv_cache_vs_mha=0.5, params=5e6, split=split, step=step,
               tokens=tokens, flops=7e12, loss=loss, bpb=loss / 2)  # fmt: skip
    return row


def table(
    curves: dict[str, tuple[str, dict[int, list[tuple[float, float]]], dict[int, tuple[float, float]]]],
) -> pd.DataFrame:
    """label -> (attention, seed -> validation curve [(tokens, loss)], seed -> (final tokens, test loss))."""
    rows = []
    for label, (attention, val, test) in curves.items():
        for seed in test:
            for step, (tokens, loss) in enumerate(val[seed], start=1):
                rows.append(_row(label, attention, seed, "val", step, tokens, loss))
            tokens, loss = test[seed]
            rows.append(_row(label, attention, seed, "test", len(val[seed]) + 1, tokens, loss))
    return pd.DataFrame(rows)


# mha trains 1,000 tokens and validates at 200, 400, ..., 1,000; lrkv trains 1,500 and validates every 300
# tokens: the common count of a seed is 1,000, where mha's curve ends and lrkv's lies between 900 and 1,200.
MHA_VAL = {
    s: [(200.0 * k, 6.0 - 0.2 * k + 0.01 * s) for k in range(1, 6)] for s in (1, 2, 3)
}  # at 1000: 5.0 + 0.01 s
LRKV_VAL = {s: [(300.0, 5.9), (600.0, 5.6), (900.0, 5.2 + 0.02 * s), (1200.0, 4.9 + 0.02 * s), (1500.0, 4.7)]
            for s in (1, 2, 3)}  # at 1000: (2/3)(5.2 + 0.02 s) + (1/3)(4.9 + 0.02 s) = 5.1 + 0.02 s  # fmt: skip
MHA_TEST = {1: (1000.0, 5.30), 2: (1000.0, 5.40), 3: (1000.0, 5.35)}
LRKV_TEST = {1: (1500.0, 5.20), 2: (1500.0, 5.32), 3: (1500.0, 5.31)}


def two_arms(lrkv_val: dict | None = None) -> pd.DataFrame:
    return table({"mha": ("mha", MHA_VAL, MHA_TEST), "lrkv-r16": ("lrkv", lrkv_val or LRKV_VAL, LRKV_TEST)})


def view(pairs: pd.DataFrame, name: str) -> pd.Series:
    (row,) = [r for _, r in pairs[pairs["view"] == name].iterrows()]
    return row


def test_equal_flops_is_the_paired_t_test_of_the_final_test_losses() -> None:
    row = view(pairwise.pair_table(two_arms()), "equal_flops")
    assert (row["a"], row["b"], row["split"], row["metric"], row["n_pairs"]) == (
        "lrkv-r16",
        "mha",
        "test",
        "loss",
        3,
    )
    lrkv, mha = [t[1] for t in LRKV_TEST.values()], [t[1] for t in MHA_TEST.values()]
    assert row["diff_mean"] == pytest.approx(np.mean(np.subtract(lrkv, mha)))
    assert row["p"] == pytest.approx(scipy.stats.ttest_rel(lrkv, mha).pvalue, rel=1e-9)
    assert row["p_holm"] == pytest.approx(row["p"])  # one pair per view: nothing to adjust


def test_equal_tokens_reads_both_curves_at_the_smaller_final_count() -> None:
    row = view(pairwise.pair_table(two_arms()), "equal_tokens")
    # lrkv - mha at 1,000 tokens: (5.1 + 0.02 s) - (5.0 + 0.01 s) = 0.1 + 0.01 s for s = 1, 2, 3
    diffs = [0.1 + 0.01 * s for s in (1, 2, 3)]
    assert (row["split"], row["n_pairs"], row["n_dropped"], row["tokens_mean"]) == ("val", 3, 0, 1000.0)
    assert row["diff_mean"] == pytest.approx(np.mean(diffs)) and row["diff_sd"] == pytest.approx(0.01)
    assert row["p"] == pytest.approx(scipy.stats.ttest_1samp(diffs, 0).pvalue, rel=1e-6)


def test_a_curve_that_stops_short_sets_the_common_count_and_a_run_without_one_is_dropped() -> None:
    short = {**LRKV_VAL, 3: LRKV_VAL[3][:3]}  # seed 3's lrkv curve ends at 900 tokens, before mha's 1,000
    row = view(pairwise.pair_table(two_arms(short)), "equal_tokens")
    # seed 3 is read at 900: lrkv 5.2 + 0.06; mha between 800 (5.23) and 1,000 (5.03): 5.13; difference 0.13
    assert (row["n_pairs"], row["n_dropped"]) == (3, 0)
    assert row["tokens_mean"] == pytest.approx((1000 + 1000 + 900) / 3)
    assert row["diff_mean"] == pytest.approx(np.mean([0.11, 0.12, 0.13]))
    runs = two_arms()
    unvalidated = runs[~((runs["label"] == "lrkv-r16") & (runs["seed"] == 3) & (runs["split"] == "val"))]
    row = view(pairwise.pair_table(unvalidated), "equal_tokens")  # no curve: nothing to read, never a guess
    assert (row["n_pairs"], row["n_dropped"]) == (2, 1)
    assert row["diff_mean"] == pytest.approx(np.mean([0.11, 0.12]))
    flops = view(pairwise.pair_table(two_arms(short)), "equal_flops")
    assert (flops["n_pairs"], flops["n_dropped"]) == (3, 0)  # the final test losses are all there


def test_equal_flops_val_reads_each_run_at_its_own_final_count_and_drops_a_run_that_stops_short() -> None:
    row = view(pairwise.pair_table(two_arms()), "equal_flops_val")
    # lrkv's validation at its final 1,500 tokens (4.7) minus mha's at its final 1,000 (5.0 + 0.01 s)
    diffs = [4.7 - (5.0 + 0.01 * s) for s in (1, 2, 3)]
    assert (row["a"], row["b"], row["split"], row["n_pairs"], row["n_dropped"]) == (
        "lrkv-r16",
        "mha",
        "val",
        3,
        0,
    )
    assert row["diff_mean"] == pytest.approx(np.mean(diffs)) and row["diff_sd"] == pytest.approx(0.01)
    assert row["p"] == pytest.approx(scipy.stats.ttest_1samp(diffs, 0).pvalue, rel=1e-6)
    # seed 3's lrkv curve ends at 900 tokens while its run trained 1,500: no value at its final count, no guess
    short = view(pairwise.pair_table(two_arms({**LRKV_VAL, 3: LRKV_VAL[3][:3]})), "equal_flops_val")
    assert (short["n_pairs"], short["n_dropped"]) == (2, 1)
    assert short["diff_mean"] == pytest.approx(np.mean(diffs[:2]))


# ----- families and Holm -------------------------------------------------------------------------------
# Three arms x four seeds of final test loss, no curves needed for the equal-FLOP and pooled views.
LOSSES = {"mha": ("mha", [5.60, 5.70, 5.65, 5.62]), "gqa-g2": ("gqa", [5.57, 5.69, 5.60, 5.61]),
          "lrkv-r16": ("lrkv", [5.55, 5.62, 5.63, 5.58])}  # fmt: skip


def three_arms() -> pd.DataFrame:
    curves = {}
    for label, (attention, losses) in LOSSES.items():
        val = {s: [(500.0, 6.0), (1000.0, 5.9)] for s in range(1, 5)}
        curves[label] = (attention, val, {s: (1000.0, loss) for s, loss in enumerate(losses, start=1)})
    return table(curves)


def test_every_pair_once_mha_as_b_later_minus_earlier_and_holm_over_the_family() -> None:
    flops = pairwise.pair_table(three_arms()).query("view == 'equal_flops'")
    assert list(zip(flops["a"], flops["b"], strict=True)) == [("gqa-g2", "mha"), ("lrkv-r16", "mha"),
                                                               ("lrkv-r16", "gqa-g2")]  # fmt: skip
    assert set(flops["family"]) == {"secondary"}
    assert list(flops["p_holm"]) == pytest.approx(holm(list(flops["p"])))
    assert list(flops["resolved"]) == [p < 0.05 for p in flops["p_holm"]]


def test_declared_primary_pairs_keep_their_orientation_and_their_own_holm() -> None:
    pairs = pairwise.pair_table(three_arms(), primary=[("mha", "lrkv-r16")])
    flops = pairs[pairs["view"] == "equal_flops"].set_index(["a", "b"])
    assert flops.loc[("mha", "lrkv-r16"), "family"] == "primary"
    assert flops.loc[("mha", "lrkv-r16"), "diff_mean"] == pytest.approx(-np.mean(
        np.subtract(LOSSES["lrkv-r16"][1], LOSSES["mha"][1])))  # fmt: skip
    assert flops.loc[("mha", "lrkv-r16"), "p_holm"] == pytest.approx(flops.loc[("mha", "lrkv-r16"), "p"])
    secondary = flops[flops["family"] == "secondary"]
    assert len(secondary) == 2 and list(secondary["p_holm"]) == pytest.approx(holm(list(secondary["p"])))


def test_vs_mha_takes_p_and_holm_p_from_the_pair_and_resolves_on_holm() -> None:
    runs = three_arms()
    pairs = pairwise.pair_table(runs, primary=[("lrkv-r16", "mha")])
    diffs = report.paired_differences(runs, pairs=pairs).set_index("label")
    flops = pairs[pairs["view"] == "equal_flops"].set_index(["a", "b"])
    for label in ("gqa-g2", "lrkv-r16"):
        assert diffs.loc[label, "p_holm"] == flops.loc[(label, "mha"), "p_holm"]
        assert diffs.loc[label, "family"] == flops.loc[(label, "mha"), "family"]
        assert diffs.loc[label, "resolved"] == (flops.loc[(label, "mha"), "p_holm"] < 0.05)


# ----- the pooled model --------------------------------------------------------------------------------
def test_pooled_contrast_is_the_two_way_anova_by_hand() -> None:
    y = np.array([LOSSES[label][1] for label in LOSSES]).T  # seeds x arms
    s, a = y.shape
    grand = y.mean()
    ss_arm = s * ((y.mean(axis=0) - grand) ** 2).sum()
    ss_seed = a * ((y.mean(axis=1) - grand) ** 2).sum()
    sse = ((y - grand) ** 2).sum() - ss_arm - ss_seed
    df = (a - 1) * (s - 1)
    se = math.sqrt(2 * sse / df / s)
    table_ = pooled.pooled_table(three_arms()).set_index(["a", "b"])
    row = table_.loc[("lrkv-r16", "mha")]
    estimate = y[:, 2].mean() - y[:, 0].mean()
    assert (row["df"], row["n_seeds"], row["seeds_dropped"]) == (df, 4, 0)
    assert row["diff_mean"] == pytest.approx(estimate) and row["se"] == pytest.approx(se)
    assert row["residual_sd"] == pytest.approx(math.sqrt(sse / df))
    assert row["p"] == pytest.approx(2 * scipy.stats.t.sf(abs(estimate) / se, df), rel=1e-9)
    assert row["ci_high"] - row["diff_mean"] == pytest.approx(scipy.stats.t.ppf(0.975, df) * se, rel=1e-9)
    assert list(table_["p_holm"]) == pytest.approx(holm(list(table_["p"])))


def test_pooled_residuals_are_the_least_squares_fit_of_arm_and_seed_dummies() -> None:
    y = np.array([LOSSES[label][1] for label in LOSSES]).T
    s, a = y.shape
    design = np.array([[1.0] + [float(j == k) for k in range(1, a)] + [float(i == k) for k in range(1, s)]
                       for i in range(s) for j in range(a)])  # fmt: skip
    coef, residual, *_ = np.linalg.lstsq(design, y.reshape(-1), rcond=None)
    row = pooled.pooled_table(three_arms()).set_index(["a", "b"]).loc[("lrkv-r16", "gqa-g2")]
    assert row["diff_mean"] == pytest.approx(coef[2] - coef[1])
    assert row["residual_sd"] == pytest.approx(math.sqrt(float(residual[0]) / ((a - 1) * (s - 1))))


def test_pooled_leaves_out_a_seed_some_arm_lacks() -> None:
    runs = three_arms()
    runs = runs[~((runs["label"] == "gqa-g2") & (runs["seed"] == 4))]
    row = pooled.pooled_table(runs).iloc[0]
    assert (row["n_seeds"], row["seeds_dropped"], row["df"]) == (3, 1, 4)


# ----- protocols: the declared family -------------------------------------------------------------------
ARMS = "[{kind: mha}, {kind: lrkv, rank: 4}, {kind: gqa, n_kv_heads: 2}]"


def test_declared_comparisons_load_and_change_no_run_identity(tiny_shards: Path, tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "declared").mkdir()
    plain = protocols.load(micro_protocol(tmp_path / "plain", tiny_shards, arms=ARMS))
    path = micro_protocol(tmp_path / "declared", tiny_shards, arms=ARMS)
    declared = protocols.load(_with(path, "comparisons: {primary: [[lrkv-r4, mha]]}"))
    assert plain.primary == () and declared.primary == (("lrkv-r4", "mha"),)
    assert [r.identity for r in declared.runs] == [r.identity for r in plain.runs]
    assert [r.tags() for r in declared.runs] == [r.tags() for r in plain.runs]


def _with(path: Path, line: str) -> Path:
    text = path.read_text()
    assert "checkpoint_every: 1\n" in text
    path.write_text(text.replace("checkpoint_every: 1\n", f"checkpoint_every: 1\n{line}\n"))
    return path


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("comparisons: {primary: [[lrkv-r16, mha]]}", r"comparisons.primary\[0\] = \[lrkv-r16, mha\]: needs two different arm labels of one size; the arms are gqa-g2, lrkv-r4, mha"),
        ("comparisons: {primary: [[mha, mha]]}", "needs two different arm labels"),
        ("comparisons: {primary: [[mha, lrkv-r4], [lrkv-r4, mha]]}", r"comparisons.primary\[1\] = \[lrkv-r4, mha\] is declared twice"),
        ("comparisons: {primary: [mha]}", r"comparisons.primary\[0\] must be two arm labels"),
        ("comparisons: {secondary: [[mha, lrkv-r4]]}", "`comparisons` must be a mapping with one list `primary`"),
        ("comparisons: [[mha, lrkv-r4]]", "`comparisons` must be a mapping with one list `primary`"),
    ],
    ids=["unknown-label", "same-arm", "twice", "not-a-pair", "other-key", "not-a-mapping"],
)  # fmt: skip
def test_bad_comparisons_are_one_config_error(
    tiny_shards: Path, tmp_path: Path, line: str, message: str
) -> None:
    path = _with(micro_protocol(tmp_path, tiny_shards, arms=ARMS), line)
    with pytest.raises(ConfigError, match=message) as error:
        protocols.load(path)
    assert "\n" not in str(error.value)


# ----- the page and the plot ------------------------------------------------------------------------------
def test_the_page_says_when_no_primary_comparison_was_declared_and_lists_primary_first() -> None:
    runs = three_arms()
    none = readme.pairs_sections(pairwise.pair_table(runs), declared=False)
    assert any("No primary comparison was declared" in line for line in none)
    pairs = pairwise.pair_table(runs, primary=[("lrkv-r16", "gqa-g2")])
    text = "\n".join(readme.pairs_sections(pairs, declared=True))
    assert "1 primary comparison(s) declared" in text
    assert text.index("equal FLOPs: final test CE (the protocol's budget), primary") < text.index(
        "equal FLOPs: final test CE (the protocol's budget), secondary"
    )
    control = text.index("### At equal FLOPs on the validation split: validation CE at each run's last step")
    assert text.index("### At equal tokens") < control and "only the split changes" in text[control:]
    rows = forest.forest_rows(pairs)
    assert list(zip(rows["a"], rows["b"], strict=True)) == [("lrkv-r16", "gqa-g2"), ("gqa-g2", "mha"),
                                                             ("lrkv-r16", "mha")]  # fmt: skip


def test_seed_noise_names_the_range_of_pair_counts_when_an_arm_is_a_seed_short() -> None:
    runs = three_arms()
    full = readme.resolution(report.paired_differences(runs))
    assert "so with 4 pairs a gap" in full
    short = runs[~((runs["label"] == "gqa-g2") & (runs["seed"] == 4))]  # gqa-g2 has 3 seeds, lrkv-r16 4
    assert "so with 3-4 pairs a gap" in readme.resolution(report.paired_differences(short))


# ----- the committed CPU studies ----------------------------------------------------------------------------
def committed(name: str) -> pd.DataFrame:
    return pd.read_csv(ROOT / "results" / name / "evaluations.csv")


def test_cpu_lrkv_r16_is_worse_than_mla_c128_in_every_seed_p_0012_unadjusted() -> None:
    runs = committed("cpu")
    row = pairwise.pair_table(runs).set_index(["view", "a", "b"]).loc[("equal_flops", "lrkv-r16", "mla-c128")]
    assert row["n_pairs"] == 5 and row["p"] == pytest.approx(0.0121, abs=5e-4)
    finals = runs[runs["split"] == "test"].pivot_table(index="seed", columns="label", values="loss")
    assert (finals["lrkv-r16"] > finals["mla-c128"]).all()
    assert row["p_holm"] > 0.05  # one of ten secondary pairs: not resolved after Holm


@pytest.mark.slow
def test_cpu_cache_with_holm_over_the_arm_vs_mha_family_only_mqa_stays_resolved() -> None:
    runs = committed("cpu-cache")
    labels = list(dict.fromkeys(runs["label"]))
    versus_mha = [(label, "mha") for label in labels if label != "mha"]
    pairs = pairwise.pair_table(runs, primary=versus_mha)
    diffs = report.paired_differences(runs, pairs=pairs).set_index("label")
    assert len(diffs) == 7 and set(diffs["family"]) == {"primary"}
    assert list(diffs.index[diffs["resolved"]]) == ["mqa"]
    unadjusted = diffs.index[diffs["p"] < 0.05]
    assert sorted(unadjusted) == ["mla-c224", "mqa"]  # the raw intervals resolved two
    matched = report.cache_matched_differences(runs, pairs=pairs).set_index("label")
    assert matched.loc["mla-c224", "p"] < 0.05 and not matched.loc["mla-c224", "resolved"]
    # Undeclared, all 28 pairs are one secondary family: not even mqa survives.
    assert not report.paired_differences(runs)["resolved"].any()


@pytest.mark.slow
def test_committed_studies_compare_at_equal_tokens_where_both_runs_validated() -> None:
    # The committed runs predate the validation at the last step: each pair is read at the smaller of the
    # two runs' last validations (step 119, 245,760 tokens; mla runs step 99, 204,800 tokens).
    for name in ("cpu", "cpu-cache"):
        tokens = pairwise.pair_table(committed(name)).query("view == 'equal_tokens'")
        arms = committed(name)["label"].nunique()
        assert len(tokens) == math.comb(arms, 2) and (tokens["n_dropped"] == 0).all()
        assert (tokens["n_pairs"] == committed(name)["seed"].nunique()).all()
        mla = tokens["a"].str.startswith("mla") | tokens["b"].str.startswith("mla")
        assert (tokens.loc[mla, "tokens_mean"] == 204800).all() and (
            tokens.loc[~mla, "tokens_mean"] == 245760
        ).all()
        # their last validation is not at their last step: no run has a value for the control, none is guessed
        control = pairwise.pair_table(committed(name)).query("view == 'equal_flops_val'")
        assert (control["n_pairs"] == 0).all() and (
            control["n_dropped"] == tokens["n_pairs"].to_numpy()
        ).all()
        text = "\n".join(readme.pairs_sections(pairwise.pair_table(committed(name)), declared=False))
        assert (
            "### At equal FLOPs on the validation split" in text
            and "seed pairs were dropped because a run" in text
        )
    # the figure the review gave: at equal tokens (205 K) mla-c224 - lrkv-r16 = +0.167, against +0.188 at equal FLOPs
    pairs = pairwise.pair_table(committed("cpu-cache")).set_index(["view", "a", "b"])
    assert pairs.loc[("equal_tokens", "lrkv-r16", "mla-c224"), "diff_mean"] == pytest.approx(
        -0.1665, abs=5e-4
    )
    assert pairs.loc[("equal_flops", "lrkv-r16", "mla-c224"), "diff_mean"] == pytest.approx(-0.1877, abs=5e-4)


def test_the_report_of_the_committed_cpu_ledger_writes_pairs_pooled_and_the_forest_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The report from results/cpu/ alone (its ledger, lightning_modules/study/ledger.py), an empty store. The
    # protocol's identities include the shards' manifest hash, so it needs the shards the runs trained on.
    if not (ROOT / "artifacts/shakespeare/manifest.json").exists():
        pytest.skip("needs the Shakespeare shards (make data)")
    monkeypatch.chdir(
        ROOT
    )  # the data fragment names data_dir relative to the repository, as main.py reads it
    protocol = protocols.load(ROOT / "conf/study/cpu.yaml")
    out = report.write(protocol, f"sqlite:///{tmp_path / 'none.db'}", tmp_path / "out", ROOT / "results/cpu")
    pairs = pd.read_csv(out / "pairs.csv").set_index(["view", "a", "b"])
    assert pairs.loc[("equal_flops", "lrkv-r16", "mla-c128"), "p"] == pytest.approx(0.0121, abs=5e-4)
    assert len(pd.read_csv(out / "pooled.csv")) == 10 and (out / "pairs.png").stat().st_size > 0
    vs_mha = pd.read_csv(out / "vs_mha.csv")
    assert {"p", "p_holm", "family"} <= set(vs_mha.columns)
    page = (out / "README.md").read_text()
    assert "2 primary comparison(s) declared by the protocol" in page and "Pooled arm + seed model" in page
    runs = page[page.index("## Runs (one row per run") :]
    assert runs.count("| cpu-no-native-bf16 |") == 25  # every ledger run with the CPU kind it ran on
    # the page points to the documents' page (python -m lightning_modules score-documents) only once it exists
    assert "documents.md" not in page
    (out / "documents.md").write_text("# Seeds and documents\n")
    report.write(protocol, f"sqlite:///{tmp_path / 'none.db'}", out, ROOT / "results/cpu")
    assert (
        "How far the evaluation documents, not only the seeds, move each gap: `documents.md`"
        in (out / "README.md").read_text()
    )
