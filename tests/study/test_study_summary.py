"""A study's summary numbers: cache-matched differences paired by seed, the results index (results/README.md)
built from the tables, rewritten whole, and the committed index agreeing with the committed results/."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from lightning_modules.analysis import pairwise
from lightning_modules.analysis.tidy import COLUMNS
from lightning_modules.reporting import readme, report, results_index

ROOT = Path(__file__).resolve().parents[2]
MHA_CACHE = 4096.0

# label -> (attention, KV-cache bytes per token, test loss for seeds 1, 2, 3)
ARMS = {
    "mha": ("mha", MHA_CACHE, [3.00, 3.10, 3.05]),
    "lrkv-r16": ("lrkv", 2048.0, [2.90, 3.02, 2.97]),
    "gqa-g2": ("gqa", 2048.0, [2.95, 3.06, 3.00]),  # lrkv better by 0.05, 0.04, 0.03: resolved
    "mla-c224": ("mla", 2048.0, [2.91, 3.00, 2.99]),  # +0.01, -0.02, +0.02 against lrkv: not resolved
    "lrkv-r4": ("lrkv", 1280.0, [3.10, 3.20, 3.12]),
    "mqa": ("mqa", 1024.0, [3.20, 3.30, 3.25]),  # no lrkv arm caches 1,024 bytes: not matched
}


def finals_table() -> pd.DataFrame:
    rows = []
    for label, (attention, cache, losses) in ARMS.items():
        for seed, loss in enumerate(losses, start=1):
            row = {c: math.nan for c in COLUMNS}
            row.update(run_id=f"{label}-{seed}", run_name=f"5m-{label}-seed{seed}", status="FINISHED", size="5m",
                       attention=attention, label=label, seed=seed, budget="7e12 FLOPs", git_commit="abc",
                       kv_cache_bytes_per_token=cache, kv_cache_vs_mha=cache / MHA_CACHE, split="test", step=100,
                       tokens=250_000.0, flops=7e12, loss=loss, bpb=loss / 2, params=5e6)  # fmt: skip
            rows.append(row)
    return pd.DataFrame(rows)


def test_cache_matched_pairs_every_other_attention_with_the_lrkv_arm_of_equal_cache() -> None:
    runs = finals_table()
    # The two cache-matched pairs declared primary: Holm over those two (undeclared, over all 15 pairs)
    primary = [("gqa-g2", "lrkv-r16"), ("mla-c224", "lrkv-r16")]
    matched = report.cache_matched_differences(runs, pairs=pairwise.pair_table(runs, primary)).set_index(
        "label"
    )
    assert sorted(matched.index) == ["gqa-g2", "mla-c224"]  # mha, mqa and lrkv-r4 have no equal-cache partner
    assert set(matched["baseline"]) == {"lrkv-r16"} and set(matched["n_pairs"]) == {3}
    assert matched.loc["gqa-g2", "loss_diff_mean"] == pytest.approx(0.04)
    assert matched.loc["gqa-g2", "resolved"] and not matched.loc["mla-c224", "resolved"]
    assert matched.loc["mla-c224", "loss_diff_mean"] == pytest.approx(1 / 300)
    assert matched.loc["gqa-g2", "kv_cache_vs_mha"] == 0.5
    assert matched.loc["gqa-g2", "p_holm"] == pytest.approx(
        2 * matched.loc["gqa-g2", "p"]
    )  # the smaller of two
    undeclared = report.cache_matched_differences(runs).set_index("label")
    assert not undeclared.loc["gqa-g2", "resolved"]  # p = 0.02 does not survive Holm over all 15 pairs


def test_a_matched_table_of_an_older_report_has_no_p_columns_and_a_new_one_has_holm_p() -> None:
    matched = report.cache_matched_differences(finals_table())
    old = matched.drop(columns=["p", "p_holm", "family"])
    assert "Holm p" not in readme.matched_view(old).columns
    view = readme.matched_view(matched).set_index("arm")
    assert view.loc["gqa-g2", "resolved (Holm p < 0.05)"] == "no"  # Holm over all 15 undeclared pairs
    assert view.loc["gqa-g2", "test CE diff"].startswith("+0.0400 [")


def study_folder(tmp_path: Path, name: str = "cpu-cache") -> Path:
    """A results folder as the report writes it, from the synthetic runs, and its protocol file."""
    runs = finals_table()
    primary = [("lrkv-r16", "mha"), ("gqa-g2", "lrkv-r16")]
    folder = tmp_path / "results" / name
    folder.mkdir(parents=True)
    report.arm_table(runs).to_csv(folder / "arms.csv", index=False)
    pairwise.pair_table(runs, primary).to_csv(folder / "pairs.csv", index=False)
    pd.DataFrame({"test_loss": [1.0] * 17 + [math.nan]}).to_csv(folder / "runs.csv", index=False)
    conf = tmp_path / "conf"
    conf.mkdir(exist_ok=True)
    (conf / f"{name}.yaml").write_text(
        "description: >-\n  six arms at 5m; primary lrkv against mha. More words.\n"
        "sizes: [5m]\narms: [{kind: mha}, {kind: lrkv}, {kind: gqa}, {kind: mla}, {kind: lrkv}, {kind: mqa}]\n"
        "seeds: [1, 2, 3]\n"
    )
    return folder


def test_the_index_row_has_the_question_arms_seeds_headline_and_progress(tmp_path: Path) -> None:
    folder = study_folder(tmp_path)
    row = results_index.study_row(folder, tmp_path / "conf" / "cpu-cache.yaml")
    assert row["question"] == "six arms at 5m"
    assert row["arms"] == ", ".join(ARMS) and row["seeds"] == "3"
    assert row["tokens per run (mha)"] == "0.25 M"
    pairs = pd.read_csv(folder / "pairs.csv")
    first = pairs[(pairs["view"] == "equal_flops") & (pairs["family"] == "primary")].iloc[0]
    assert row["headline (nats, test CE)"].startswith(
        f"{first['a']} - {first['b']}: {first['diff_mean']:+.4f} ["
    )
    assert row["runs done"] == "17 of 18"  # one run without a test loss is not done


def test_the_index_is_rewritten_whole_and_only_when_it_changes(tmp_path: Path) -> None:
    folder = study_folder(tmp_path)
    results, conf = folder.parent, tmp_path / "conf"
    assert results_index.write_index(results, conf) is True
    text = (results / "README.md").read_text()
    assert "[cpu-cache](cpu-cache/README.md)" in text and text.startswith("# Results")
    assert results_index.write_index(results, conf) is False
    assert sorted(p.name for p in results.iterdir()) == ["README.md", "cpu-cache"]  # no temporary file left


def test_report_into_another_folder_leaves_its_parent_alone(
    tiny_shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out elsewhere writes the study's folder only: a README.md beside it is the user's, not the index."""
    from lightning_modules.commands.run_study import main as study_main
    from tests.study.helpers import micro_protocol

    path = micro_protocol(tmp_path, tiny_shards)
    theirs = tmp_path / "README.md"
    theirs.write_text("the user's own notes\n")
    study_main([str(path), "--report", "--out", str(tmp_path / "out")])
    assert theirs.read_text() == "the user's own notes\n"


def test_the_committed_index_is_what_the_committed_results_give() -> None:
    committed = (ROOT / "results" / "README.md").read_text()
    assert committed == results_index.index(ROOT / "results", ROOT / "conf" / "study"), (
        "results/README.md is stale: python -m lightning_modules study conf/study/<p>.yaml --report rebuilds it"
    )
