"""Tokens-to-target on straight-line curves, whose crossings are known exactly."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lightning_modules.analysis.stats import mean_ci
from lightning_modules.analysis.targets import (
    reach_point,
    saved_matrix,
    tokens_to_target,
    tokens_to_target_per_seed,
)
from tests.analysis.synthetic import tidy_table

XS = [100.0 * i for i in range(1, 11)]  # evaluations every 100 tokens up to a budget of 1000


def line(slope: float) -> list[tuple[float, float]]:
    return [(x, 4.0 - slope * x / 1000) for x in XS]


def straight_runs(extra: dict | None = None, flops: dict[str, float] | None = None) -> pd.DataFrame:
    # mha ends at 4 - 2 = 2.0. lrkv falls faster: seed 7 reaches 2.0 at 2 / 2.4 x 1000 = 833.33 tokens
    # (between the evaluations at 800 and 900), seed 8 at 2 / 2.5 x 1000 = 800 (exactly at one).
    curves = {
        ("nano", "mha", "mha", 7): line(2.0),
        ("nano", "mha", "mha", 8): line(2.0),
        ("nano", "lrkv", "lrkv-r8", 7): line(2.4),
        ("nano", "lrkv", "lrkv-r8", 8): line(2.5),
    }
    curves.update(extra or {})
    return tidy_table(curves, flops or {"mha": 1.0, "lrkv-r8": 1.0, "mqa": 1.0})


def test_reach_point_interpolates_linearly_between_evaluations() -> None:
    assert reach_point([100, 200], [3.0, 2.0], 2.5) == pytest.approx(150.0)
    assert reach_point(XS, [y for _, y in line(2.4)], 2.0) == pytest.approx(1000 / 1.2)
    assert reach_point([200, 100, 300], [2.0, 3.0, 1.0], 2.5) == pytest.approx(150.0)  # sorts by x first


def test_reach_point_never_reached_and_already_below() -> None:
    assert math.isnan(reach_point([100, 200], [3.0, 2.9], 2.0))
    assert reach_point([100, 200], [1.0, 0.5], 2.0) == 100.0  # at or before the first evaluation


def test_fraction_saved_per_seed_on_straight_lines() -> None:
    per_seed = tokens_to_target_per_seed(straight_runs())
    row = per_seed[(per_seed["baseline"] == "mha") & (per_seed["label"] == "lrkv-r8")].set_index("seed")
    assert row.loc[7, "target_loss"] == pytest.approx(2.0) and row.loc[7, "budget"] == 1000.0
    assert row.loc[7, "reached_at"] == pytest.approx(1000 / 1.2)
    assert row.loc[7, "saved"] == pytest.approx(1 / 6)
    assert row.loc[8, "saved"] == pytest.approx(0.2)


def test_summary_is_the_mean_and_interval_over_seed_pairs() -> None:
    summary = tokens_to_target(straight_runs())
    row = summary[(summary["baseline"] == "mha") & (summary["label"] == "lrkv-r8")].iloc[0]
    expected = mean_ci([1 / 6, 0.2])
    assert row["n"] == 2 and row["n_reached"] == 2
    assert row["saved_mean"] == pytest.approx((1 / 6 + 0.2) / 2)
    assert row["saved_ci_low"] == pytest.approx(expected.low)
    assert row["saved_ci_high"] == pytest.approx(expected.high)


def test_a_curve_that_never_reaches_gives_no_mean() -> None:
    summary = tokens_to_target(straight_runs())
    # lrkv's final losses are 1.6 and 1.5; mha never gets below 2.0.
    row = summary[(summary["baseline"] == "lrkv-r8") & (summary["label"] == "mha")].iloc[0]
    assert row["n_reached"] == 0 and row["n"] == 2 and math.isnan(row["saved_mean"])
    assert saved_matrix(summary, "nano").loc["mha", "lrkv-r8"] == "not reached 2/2"


def test_a_mean_needs_every_pair_to_reach() -> None:
    # Seed 8 of mqa never reaches mha's 2.0; averaging seed 7 alone would flatter mqa.
    runs = straight_runs({("nano", "mqa", "mqa", 7): line(2.4), ("nano", "mqa", "mqa", 8): line(1.0)})
    row = tokens_to_target(runs).query("baseline == 'mha' and label == 'mqa'").iloc[0]
    assert (row["n"], row["n_reached"]) == (2, 1)
    assert math.isnan(row["saved_mean"]) and math.isnan(row["saved_ci_low"])
    assert saved_matrix(tokens_to_target(runs), "nano").loc["mqa", "mha"] == "not reached 1/2"


def test_compute_to_target_measures_against_the_baseline_flops() -> None:
    # lrkv costs half the FLOPs per token: it reaches mha's final loss at 833.33 x 1 FLOPs of mha's 1000 x 2.
    per_seed = tokens_to_target_per_seed(straight_runs(flops={"mha": 2.0, "lrkv-r8": 1.0}), x="flops")
    row = per_seed[
        (per_seed["baseline"] == "mha") & (per_seed["label"] == "lrkv-r8") & (per_seed["seed"] == 7)
    ]
    assert row["budget"].item() == 2000.0
    assert row["saved"].item() == pytest.approx(1 - (1000 / 1.2) / 2000)


def test_labels_without_a_shared_seed_are_not_paired() -> None:
    runs = straight_runs({("nano", "mqa", "mqa", 9): line(3.0)})
    per_seed = tokens_to_target_per_seed(runs)
    assert not ((per_seed["label"] == "mqa") | (per_seed["baseline"] == "mqa")).any()


def test_saved_matrix_cells() -> None:
    summary = tokens_to_target(straight_runs())
    matrix = saved_matrix(summary, "nano")
    assert list(matrix.index) == ["mha", "lrkv-r8"] and list(matrix.columns) == ["mha", "lrkv-r8"]
    ci = mean_ci([1 / 6, 0.2])
    assert matrix.loc["lrkv-r8", "mha"] == f"18.3 % [{100 * ci.low:.1f}, {100 * ci.high:.1f}]"


def test_unknown_axis_is_refused() -> None:
    with pytest.raises(ValueError, match="tokens"):
        tokens_to_target(straight_runs(), x="steps")
