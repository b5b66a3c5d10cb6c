"""The study's front-page numbers: cache-matched differences paired by seed, the README block built from the
tables, its rewrite between markers only, and the committed README agreeing with the committed results/."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from lightning_modules.analysis import pairwise
from lightning_modules.analysis.runs import COLUMNS
from lightning_modules.study import report, summary

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


def test_block_has_every_arm_its_difference_to_mha_and_the_matched_table() -> None:
    runs = finals_table()
    text = summary.block("cpu-cache", report.arm_table(runs), report.paired_differences(runs),
                         report.cache_matched_differences(runs))  # fmt: skip
    assert text.startswith(summary.begin_marker("cpu-cache")) and text.endswith(
        summary.end_marker("cpu-cache")
    )
    for label in ARMS:
        assert f"| 5m | {label} |" in text
    assert "| 5m | lrkv-r16 | 50.0 % | 250,000 | 3 | 2.9633 [" in text
    assert "-0.0867 [" in text  # lrkv-r16 - mha, mean of -0.10, -0.08, -0.08
    assert "| 5m | gqa-g2 | lrkv-r16 | 50.0 % | 3 | +0.0400 [" in text


def readme_with_blocks(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "README.md"
    path.write_text(
        "# Project\n\nbefore\n\n"
        f"{summary.begin_marker('cpu')}\nold numbers\n{summary.end_marker('cpu')}\n\n"
        f"{summary.begin_marker('cpu-cache')}\nother study\n{summary.end_marker('cpu-cache')}\n\n{body}"
    )
    return path


def test_update_readme_rewrites_only_its_own_block_and_is_idempotent(tmp_path: Path) -> None:
    path = readme_with_blocks(tmp_path, "after\n")
    before = path.read_text()
    new = f"{summary.begin_marker('cpu')}\nnew numbers\n{summary.end_marker('cpu')}"
    assert summary.update_readme(path, "cpu", new) is True
    after = path.read_text()
    assert after == before.replace("old numbers", "new numbers")
    assert summary.update_readme(path, "cpu", new) is False and path.read_text() == after
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]  # the temporary file is gone


@pytest.mark.parametrize(
    "text",
    ["no markers at all\n", f"{summary.end_marker('cpu')}\n{summary.begin_marker('cpu')}\n",
     f"{summary.begin_marker('cpu')}\n{summary.begin_marker('cpu')}\n{summary.end_marker('cpu')}\n"],
    ids=["missing", "reversed", "doubled"],
)  # fmt: skip
def test_a_readme_without_one_marker_pair_is_refused_and_left_alone(tmp_path: Path, text: str) -> None:
    path = tmp_path / "README.md"
    path.write_text(text)
    with pytest.raises(summary.ReadmeBlockError, match="exactly one pair of markers for study 'cpu'"):
        summary.update_readme(path, "cpu", "whatever")
    assert path.read_text() == text


def test_report_refuses_a_readme_it_cannot_update_before_writing_anything(
    tiny_shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_modules.study.__main__ import main as study_main
    from tests.study.test_study import micro_protocol

    path = micro_protocol(tmp_path, tiny_shards)
    out = tmp_path / "results"
    for readme, expected in (
        (tmp_path / "missing.md", "missing.md: cannot read it"),
        (readme_with_blocks(tmp_path, ""), "exactly one pair of markers for study 'micro'"),
    ):
        assert study_main([str(path), "--report", "--readme", str(readme), "--out", str(out)]) == 2
        assert expected in capsys.readouterr().err
        assert not out.exists()  # fmt: skip


def committed_results() -> list[Path]:
    return sorted(p.parent for p in (ROOT / "results").glob("*/arms.csv"))


def test_every_readme_block_has_its_results_folder_and_every_folder_its_block() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"<!-- study (\S+): begin", readme)
    assert sorted(blocks) == [p.name for p in committed_results()]


@pytest.mark.parametrize("folder", committed_results(), ids=lambda p: p.name)
def test_readme_numbers_are_what_the_committed_results_give(folder: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    assert summary.current_block(readme, folder.name) == summary.block_from_results(folder), (
        f"README.md's block for {folder.name} is stale: python -m lightning_modules.study "
        f"conf/study/{folder.name}.yaml --report --readme README.md"
    )
