"""The sweep across protocols (lightning_modules/commands/sweep.py) on synthetic ledgers with known answers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import scipy.stats

from lightning_modules.analysis import sweep_curves, sweep_gaps, sweep_table
from lightning_modules.commands import sweep
from lightning_modules.core.errors import ConfigError

# mha: 0.5x beats 1x by 0.10, 0.12, 0.11 on seeds 1-3; lrkv: 0.5x is worse by 0.02, 0.00, 0.04
LOSSES = {
    "half": {("mha", 1): 5.50, ("mha", 2): 5.60, ("mha", 3): 5.55, ("lrkv", 1): 5.62, ("lrkv", 2): 5.60,
             ("lrkv", 3): 5.68},
    "one": {("mha", 1): 5.60, ("mha", 2): 5.72, ("mha", 3): 5.66, ("lrkv", 1): 5.60, ("lrkv", 2): 5.60,
            ("lrkv", 3): 5.64},
}  # fmt: skip


def ledger(folder: Path, losses: dict[tuple[str, int], float]) -> Path:
    folder.mkdir(parents=True)
    rows = [
        {"identity": f"{k[0]}{k[1]}", "label": k[0], "seed": k[1], "test_loss": v} for k, v in losses.items()
    ]
    pd.DataFrame(rows).to_csv(folder / "runs.csv", index=False)
    return folder


def columns(tmp_path: Path) -> list[sweep_table.Column]:
    return [sweep.parse_column(f"{n}={ledger(tmp_path / n, v)}") for n, v in LOSSES.items()]


def test_each_column_minus_the_reference_is_the_paired_t_test_with_holm(tmp_path: Path) -> None:
    table, diffs = sweep_table.sweep(columns(tmp_path), "one")
    best = table.set_index("label")["best"]
    assert best.to_dict() == {"mha": "half", "lrkv": "one"}
    d = diffs.set_index("label")
    half, one = LOSSES["half"], LOSSES["one"]
    for arm in ("mha", "lrkv"):
        a, b = [half[(arm, s)] for s in (1, 2, 3)], [one[(arm, s)] for s in (1, 2, 3)]
        assert d.loc[arm, "diff_mean"] == pytest.approx(sum(a) / 3 - sum(b) / 3)
        assert d.loc[arm, "p"] == pytest.approx(scipy.stats.ttest_rel(a, b).pvalue, rel=1e-9)
    ps = sorted(d["p"])
    assert sorted(d["p_holm"]) == pytest.approx([2 * ps[0], max(2 * ps[0], ps[1])])
    assert d.loc["mha", "resolved"] and not d.loc["lrkv", "resolved"]


def test_a_column_pools_its_folders_and_counts_a_run_once(tmp_path: Path) -> None:
    one = ledger(tmp_path / "a", {k: v for k, v in LOSSES["one"].items() if k[1] < 3})
    again = ledger(tmp_path / "b", LOSSES["one"])  # seeds 1-2 twice, seed 3 once
    column = sweep.parse_column(f"one={one},{again}")
    assert len(sweep_table.finals(column)) == 6
    # a column with fewer seeds (seeds 1-2 at half) sets the seeds every column is averaged over
    half = sweep.parse_column(
        f"half={ledger(tmp_path / 'h', {k: v for k, v in LOSSES['half'].items() if k[1] < 3})}"
    )
    table, _ = sweep_table.sweep([half, column], "one")
    mha = table.set_index("label").loc["mha"]
    assert mha["seeds"] == "1, 2" and mha["one_seeds"] == 2
    assert mha["one_mean"] == pytest.approx((5.60 + 5.72) / 2)


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cols = [f"--column={c.name}={c.folders[0]}" for c in columns(tmp_path)]
    assert sweep.main([*cols, "--reference", "two", "--out", str(tmp_path / "out")]) == 2
    assert "--reference two: not one of the columns (half, one)" in capsys.readouterr().err
    assert sweep.main(["--column", f"x={tmp_path / 'none'}", "--reference", "x", "--out", str(tmp_path)]) == 2
    assert "no ledger" in capsys.readouterr().err
    assert sweep.main([*cols, "--reference", "one", "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "README.md").read_text()
    assert "| mha | 5.5500 [" in text and "| mha | half |" in text


def _evaluations(folder: Path, curve: dict[tuple[str, int], list[float]]) -> None:
    """Validation losses at steps 10, 20, ... (1,000 tokens a step) and a test row that must not count."""
    rows = [
        {
            "label": arm,
            "seed": seed,
            "split": "val",
            "step": 10 * (i + 1),
            "tokens": 10_000 * (i + 1),
            "loss": v,
        }
        for (arm, seed), losses in curve.items()
        for i, v in enumerate(losses)
    ]
    rows += [{"label": arm, "seed": seed, "split": "test", "step": 99, "tokens": 99_000, "loss": 9.0}
             for arm, seed in curve]  # fmt: skip
    pd.DataFrame(rows).to_csv(folder / "evaluations.csv", index=False)


def test_the_curves_are_each_column_minus_the_reference_at_the_steps_both_evaluated(tmp_path: Path) -> None:
    ref = ledger(tmp_path / "ref", {("mha", 1): 5.0, ("mha", 2): 5.1})
    _evaluations(ref, {("mha", 1): [6.0, 5.5], ("mha", 2): [6.2, 5.6]})
    other = ledger(tmp_path / "other", {("mha", 1): 5.03})
    _evaluations(other, {("mha", 1): [6.01, 5.46, 5.2]})  # one seed, and a step the reference lacks
    cols = [sweep.parse_column(f"ref={ref}"), sweep.parse_column(f"other={other}")]
    curves = sweep_curves.curve_differences(cols, "ref")
    assert list(zip(curves["seed"], curves["step"], strict=True)) == [(1, 10), (1, 20)]
    assert curves["diff"].tolist() == pytest.approx([0.01, -0.04])
    section = "\n".join(sweep_curves.curves_section(curves, "ref"))
    assert "| other | 10 | 10,000 | 1 | +0.0100 | 0.0100 | 0.0100 |" in section
    assert "| other | 20 | 20,000 | 1 | -0.0400 | 0.0400 | 0.0400 |" in section

    out = tmp_path / "out"
    assert (
        sweep.main(
            [f"--column=ref={ref}", f"--column=other={other}", "--reference", "ref", "--out", str(out)]
        )
        == 0
    )
    page = (out / "README.md").read_text()
    # one pair: its difference without an interval or a p-value, never "nan"
    assert "| mha | other | 1 | +0.0300 |  |  | no |" in page and "nan" not in page
    assert "| other | 20 | 20,000 | 1 | -0.0400 |" in page
    assert len(pd.read_csv(out / "curves.csv")) == 2


def test_ledgers_without_evaluations_give_no_curves(tmp_path: Path) -> None:
    assert sweep_curves.curve_differences(columns(tmp_path), "one").empty
    assert (
        sweep_curves.curves_section(sweep_curves.curve_differences(columns(tmp_path / "b"), "one"), "one")
        == []
    )


def test_a_gap_change_is_the_paired_difference_of_differences_with_holm(tmp_path: Path) -> None:
    cols = columns(tmp_path)
    gaps = sweep_gaps.gap_changes(cols, "one")
    (row,) = gaps.to_dict("records")  # two arms: one pair, the later minus the earlier
    assert (row["a"], row["b"], row["column"], row["n_pairs"]) == ("lrkv", "mha", "half", 3)
    half, one = LOSSES["half"], LOSSES["one"]
    gap_half = [half[("lrkv", s)] - half[("mha", s)] for s in (1, 2, 3)]  # +0.12, +0.00, +0.13
    gap_one = [one[("lrkv", s)] - one[("mha", s)] for s in (1, 2, 3)]  # +0.00, -0.12, -0.02
    assert row["gap_reference"] == pytest.approx(sum(gap_one) / 3)
    assert row["gap_column"] == pytest.approx(sum(gap_half) / 3)
    assert row["change"] == pytest.approx(sum(gap_half) / 3 - sum(gap_one) / 3)
    assert row["p"] == pytest.approx(scipy.stats.ttest_rel(gap_half, gap_one).pvalue, rel=1e-9)
    assert row["p_holm"] == pytest.approx(row["p"])  # one comparison


def test_gap_changes_use_only_seeds_with_all_four_runs_and_the_declared_pairs(tmp_path: Path) -> None:
    third = {("gqa", s): 5.0 + s / 100 for s in (1, 2, 3)}
    solo = {("solo", s): 5.3 for s in (1, 2, 3)}  # the reference alone ran it: no gap to compare
    ref = ledger(tmp_path / "ref", {**LOSSES["one"], **third, **solo})
    # the column lacks lrkv seed 3 and shifts gqa by +0.05 on every seed: gqa - mha moves by exactly that
    col_losses = {k: v for k, v in {**LOSSES["one"], **third}.items() if k != ("lrkv", 3)}
    col_losses.update({k: v + 0.05 for k, v in third.items()})
    col = ledger(tmp_path / "col", col_losses)
    cols = [sweep.parse_column(f"ref={ref}"), sweep.parse_column(f"col={col}")]
    gaps = sweep_gaps.gap_changes(cols, "ref").set_index(["a", "b"])
    assert list(gaps.index) == [("lrkv", "mha"), ("gqa", "mha"), ("gqa", "lrkv")]  # none with solo
    assert gaps.loc[("lrkv", "mha"), "seeds"] == "1, 2" and gaps.loc[("gqa", "mha"), "n_pairs"] == 3
    assert gaps.loc[("lrkv", "mha"), "change"] == pytest.approx(0.0)
    assert gaps.loc[("gqa", "mha"), "change"] == pytest.approx(0.05)
    declared = sweep_gaps.gap_changes(cols, "ref", sweep_gaps.parse_pairs("mha:gqa"))
    assert declared[["a", "b"]].values.tolist() == [["mha", "gqa"]]
    assert (
        declared["change"].iloc[0] == pytest.approx(-0.05)
        and declared["p_holm"].iloc[0] == declared["p"].iloc[0]
    )
    with pytest.raises(ConfigError, match="did not run: nope"):
        sweep_gaps.gap_changes(cols, "ref", [("nope", "mha")])
    with pytest.raises(ConfigError, match="give A:B"):
        sweep_gaps.parse_pairs("lrkv-r16")


def test_the_sweep_page_has_the_gaps_and_bad_pairs_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cols = [f"--column={c.name}={c.folders[0]}" for c in columns(tmp_path)]
    out = tmp_path / "out"
    assert sweep.main([*cols, "--reference", "one", "--out", str(out)]) == 0
    text = (out / "README.md").read_text()
    assert "## Gaps between arms: each column against one" in text and "two seeds or more (1;" in text
    assert "| lrkv - mha | half | 3 | -0.0467 | +0.0833 | +0.1300 [" in text
    assert len(pd.read_csv(out / "gaps.csv")) == 1
    assert sweep.main([*cols, "--reference", "one", "--out", str(out), "--pairs", "lrkv"]) == 2
    err = capsys.readouterr().err
    assert "--pairs lrkv: give A:B" in err and len(err.strip().splitlines()) == 1
