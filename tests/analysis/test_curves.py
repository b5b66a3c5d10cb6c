"""Loss curves: seed means and intervals, one panel per size, fixed styles, readable units."""

from __future__ import annotations

import math

import matplotlib
import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from lightning_modules.analysis.curves import mean_curves, plot_loss_curves
from lightning_modules.analysis.stats import mean_ci
from lightning_modules.analysis.tidy import load_runs
from lightning_modules.analysis.units import axis_label, flops_unit, tokens_unit
from tests.analysis import synthetic
from tests.analysis.synthetic import tidy_table

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def runs(synthetic_store: str) -> pd.DataFrame:
    return load_runs(synthetic_store)


def test_mean_curves_average_seeds_at_each_evaluation(runs: pd.DataFrame) -> None:
    curves = mean_curves(runs, x="tokens")
    mha = curves[(curves["size"] == "nano") & (curves["label"] == "mha")]
    assert list(mha["step"]) == list(synthetic.EVAL_STEPS["nano"]) and set(mha["n"]) == {2}
    first = mha.iloc[0]
    tokens = synthetic.EVAL_STEPS["nano"][0] * synthetic.TOKENS_PER_STEP["nano"]
    spec7, spec8 = (s for s in synthetic.specs() if s.size == "nano" and s.label == "mha")
    expected = mean_ci([synthetic.loss_at(spec7, tokens), synthetic.loss_at(spec8, tokens)])
    assert first["tokens"] == tokens
    assert first["loss_mean"] == pytest.approx(expected.mean)
    assert first["loss_ci_high"] == pytest.approx(expected.high)
    single = curves[curves["label"] == "lrkv-r16"]
    assert math.isnan(single[single["size"] == "nano"]["loss_ci_low"].iloc[0])


def panel_lines(fig: Figure, title: str) -> tuple[Axes, dict[str, Line2D]]:
    ax = next(a for a in fig.axes if a.get_title() == title)
    return ax, {line.get_label().split(" ")[0]: line for line in ax.get_lines()}


def test_one_panel_per_size_with_fixed_styles(runs: pd.DataFrame) -> None:
    fig = plot_loss_curves(runs, x="tokens")
    assert [a.get_title() for a in fig.axes if a.get_visible()] == ["nano", "20m"]
    ax, lines = panel_lines(fig, "nano")
    expected = {
        "mha": ("tab:blue", "-"),
        "lrkv-r8": ("tab:red", "-"),
        "mqa": ("tab:green", "--"),
        "gqa-g2": ("tab:orange", "--"),
        "mla-c64": ("tab:purple", ":"),
    }
    for label, (color, style) in expected.items():
        assert to_rgba(lines[label].get_color()) == to_rgba(color), label
        assert lines[label].get_linestyle() == style, label
    # The sweep shares its attention's colour and is told apart by a marker.
    assert to_rgba(lines["lrkv-r16"].get_color()) == to_rgba("tab:red")
    assert lines["lrkv-r16"].get_marker() != lines["lrkv-r8"].get_marker()
    assert ax.get_xlabel() == "training tokens (millions)"
    assert lines["mha"].get_label() == "mha (n=2)"
    # A band per label with two seeds (mha, mqa, gqa-g2, mla-c64, lrkv-r8), none for the one-seed sweep.
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 5


def test_compute_axis_names_its_unit(runs: pd.DataFrame) -> None:
    fig = plot_loss_curves(runs, x="flops")
    ax, lines = panel_lines(fig, "nano")
    assert ax.get_xlabel() == "cumulative training compute (TeraFLOPs)"
    flops = runs[(runs["run_name"] == "nano-mha-seed7") & (runs["split"] == "val")]["flops"]
    assert lines["mha"].get_xdata()[-1] == pytest.approx(flops.iloc[-1] / 1e12)


def test_zoom_keeps_the_end_of_the_runs_in_view(runs: pd.DataFrame) -> None:
    fig = plot_loss_curves(runs, x="tokens", zoom=0.5)
    ax, _ = panel_lines(fig, "nano")
    curves = mean_curves(runs)
    nano = curves[curves["size"] == "nano"]
    low, high = ax.get_ylim()
    assert low < nano["loss_ci_low"].min() and high < nano["loss_mean"].max()  # the first evaluations are off
    full = plot_loss_curves(runs, x="tokens", zoom=None)
    assert panel_lines(full, "nano")[0].get_ylim()[1] >= nano["loss_mean"].max()


def test_units() -> None:
    assert flops_unit(7e19) == flops_unit(1e18) and flops_unit(7e19).name == "ExaFLOPs"
    assert flops_unit(1.2e13).name == "TeraFLOPs" and flops_unit(1.2e13).scale == 1e12
    assert flops_unit(5.0).name == "FLOPs"
    assert tokens_unit(5e10).name == "billions" and tokens_unit(999).scale == 1.0
    assert axis_label("flops", 1.75e21)[1] == "cumulative training compute (ExaFLOPs)"
    with pytest.raises(ValueError, match="tokens"):
        axis_label("steps", 1.0)


def test_a_run_validated_once_is_still_drawn() -> None:
    # A short run (the demo's budget with a long validation interval) has one evaluation per label.
    runs = tidy_table(
        {("nano", "mha", "mha", 1): [(100.0, 3.0)], ("nano", "lrkv", "lrkv-r8", 1): [(100.0, 2.9)]},
        {"mha": 1.0, "lrkv-r8": 1.0},
    )
    _, lines = panel_lines(plot_loss_curves(runs), "nano")
    assert lines["mha"].get_marker() not in (None, "None", "") and len(lines["mha"].get_xdata()) == 1
