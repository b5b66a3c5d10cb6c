"""Mean and t-interval over seeds, against values computed by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lightning_modules.analysis.stats import mean_ci, summarise

# Student's t quantiles from tables: t_{0.975, 1}, t_{0.975, 2}, t_{0.95, 2}.
T_975_DF1 = 12.706204736174707
T_975_DF2 = 4.302652729749464
T_95_DF2 = 2.919985580355516


def test_interval_of_known_values() -> None:
    ci = mean_ci([1.0, 2.0, 3.0])  # mean 2, sample sd 1, standard error 1/sqrt(3)
    half = T_975_DF2 / math.sqrt(3)
    assert (ci.mean, ci.n) == (2.0, 3)
    assert ci.low == pytest.approx(2 - half, rel=1e-12)
    assert ci.high == pytest.approx(2 + half, rel=1e-12)
    assert ci.half_width == pytest.approx(half, rel=1e-12)


def test_interval_follows_the_confidence_level() -> None:
    assert mean_ci([1.0, 2.0, 3.0], confidence=0.90).half_width == pytest.approx(T_95_DF2 / math.sqrt(3))


def test_two_seeds_use_one_degree_of_freedom_and_nan_is_dropped() -> None:
    ci = mean_ci([1.0, math.nan, 3.0])  # sd sqrt(2), se 1
    assert ci.n == 2 and ci.mean == 2.0
    assert ci.half_width == pytest.approx(T_975_DF1)


def test_one_value_has_no_interval_and_none_has_no_mean() -> None:
    one = mean_ci([2.5])
    assert one.mean == 2.5 and one.n == 1 and math.isnan(one.low) and math.isnan(one.high)
    empty = mean_ci([])
    assert empty.n == 0 and math.isnan(empty.mean)


def test_confidence_outside_zero_one_is_refused() -> None:
    with pytest.raises(ValueError, match="confidence"):
        mean_ci([1.0, 2.0], confidence=95)


def test_summarise_groups_in_order_of_appearance() -> None:
    table = pd.DataFrame({"label": ["b", "a", "b", "b"], "loss": [1.0, 5.0, 2.0, 3.0]})
    out = summarise(table, ["label"], "loss")
    assert list(out.columns) == ["label", "loss_mean", "loss_ci_low", "loss_ci_high", "n"]
    assert list(out["label"]) == ["b", "a"]
    b, a = out.iloc[0], out.iloc[1]
    assert b["loss_mean"] == 2.0 and b["n"] == 3
    assert b["loss_ci_high"] == pytest.approx(2 + T_975_DF2 / math.sqrt(3))
    assert a["loss_mean"] == 5.0 and a["n"] == 1 and math.isnan(a["loss_ci_low"])
