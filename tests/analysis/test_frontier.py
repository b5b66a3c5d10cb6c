"""The cache frontier: Pareto flags and ordering on points whose answer is known."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from lightning_modules.analysis import paper
from lightning_modules.analysis.analysis_errors import MissingMetricsError
from lightning_modules.analysis.frontier import (
    cache_frontier,
    paper_frontier_128m,
    pareto_mask,
    plot_cache_frontier,
)
from lightning_modules.analysis.styles import attention_style
from lightning_modules.analysis.tidy import load_runs
from tests.analysis import synthetic

matplotlib.use("Agg")


def test_pareto_mask_on_known_points() -> None:
    # (1, 3) cheapest; (2, 2) better loss; (3, 2.5) dominated by (2, 2); (4, 1) best loss.
    assert pareto_mask([1, 2, 3, 4], [3, 2, 2.5, 1]).tolist() == [True, True, False, True]


def test_pareto_ties_and_equal_cost() -> None:
    assert pareto_mask([1, 1], [2, 2]).tolist() == [True, True]  # identical points dominate neither
    assert pareto_mask([1, 1], [2, 3]).tolist() == [True, False]  # same cache, worse loss
    assert pareto_mask([1, 2], [2, 2]).tolist() == [True, False]  # same loss, more cache


@pytest.fixture(scope="module")
def runs(synthetic_store: str) -> pd.DataFrame:
    return load_runs(synthetic_store)


@pytest.mark.slow
def test_frontier_of_the_synthetic_store(runs: pd.DataFrame) -> None:
    frontier = cache_frontier(runs)
    nano = frontier[frontier["size"] == "nano"]
    # Sorted by cache within a size; sizes in the fixed order.
    assert list(frontier["size"].drop_duplicates()) == ["nano", "20m"]
    assert np.all(np.diff(nano["kv_cache_bytes_per_token"]) >= 0)
    # The synthetic offsets (mla-c32 +.005, mqa +.02, mla-c64 -.01, lrkv-r8 -.03, gqa-g2 +.01, lrkv-r16 -.04,
    # mha 0) at caches 384, 512, 640, 1024, 1024, 1536, 2048 bytes make these the optimal ones:
    assert list(nano.loc[nano["pareto"], "label"]) == ["mla-c32", "mla-c64", "lrkv-r8", "lrkv-r16"]
    big = frontier[frontier["size"] == "20m"]
    assert list(big.loc[big["pareto"], "label"]) == ["mqa", "mla-c128", "lrkv-r16"]


def test_frontier_losses_are_the_seed_means_of_the_test_loss(runs: pd.DataFrame) -> None:
    frontier = cache_frontier(runs).set_index(["size", "label"])
    tokens = synthetic.EVAL_STEPS["nano"][-1] * synthetic.TOKENS_PER_STEP["nano"]
    # Two seeds with opposite noise: the mean is the noise-free curve; one seed keeps its noise.
    clean = synthetic.FLOOR["nano"] + 2 / math.sqrt(1 + tokens / 1e5) + synthetic.TEST_GAP
    mha = frontier.loc[("nano", "mha")]
    assert mha["loss_mean"] == pytest.approx(clean + synthetic.OFFSET["mha"])
    assert mha["n"] == 2 and mha["loss_ci_low"] < mha["loss_mean"] < mha["loss_ci_high"]
    r16 = frontier.loc[("nano", "lrkv-r16")]
    assert r16["n"] == 1 and math.isnan(r16["loss_ci_low"])
    assert r16["loss_mean"] == pytest.approx(clean - 0.04 + synthetic.SEED_SCALE["lrkv"])
    assert mha["kv_cache_bytes_per_token"] == 2048 and mha["kv_cache_vs_mha"] == 1.0


def test_frontier_needs_cache_costs(runs: pd.DataFrame) -> None:
    broken = runs.copy()
    broken.loc[broken["label"] == "mqa", "kv_cache_bytes_per_token"] = math.nan
    with pytest.raises(MissingMetricsError, match="kv_cache_bytes_per_token"):
        cache_frontier(broken)


def test_frontier_refuses_one_label_with_two_caches(runs: pd.DataFrame) -> None:
    broken = runs.copy()
    broken.loc[(broken["label"] == "mqa") & (broken["seed"] == 8), "kv_cache_bytes_per_token"] = 1.0
    with pytest.raises(MissingMetricsError, match="different KV-cache"):
        cache_frontier(broken)


def test_paper_frontier_reproduces_the_printed_cache_fractions() -> None:
    points = paper_frontier_128m().set_index("label")
    for rank, printed, _ in paper.LRKV_RANK_SWEEP_128M:
        assert points.loc[f"lrkv-r{rank}", "kv_cache_vs_mha"] == pytest.approx(printed, abs=5e-4)
    for latent, printed, _ in paper.MLA_LATENT_SWEEP_128M:
        assert points.loc[f"mla-c{latent}", "kv_cache_vs_mha"] == pytest.approx(printed, abs=5e-4)
    assert points.loc["lrkv-r46", "kv_cache_vs_mha"] == pytest.approx(
        paper.LRKV_CACHE_VS_MHA["128m"], abs=5e-4
    )
    # docs/paper-errata.md: below about 40 % cache MLA is on the frontier, above it LRKV.
    optimal = list(points.index[points["pareto"]])
    assert optimal == ["mla-c128", "mla-c192", "mla-c384", "lrkv-r46", "lrkv-r64", "lrkv-r128"]


def test_each_label_sits_at_its_own_point_in_its_colour(runs: pd.DataFrame) -> None:
    frontier = cache_frontier(runs)
    fig = plot_cache_frontier(frontier)
    ax = next(a for a in fig.axes if a.get_title() == "nano")
    rows = frontier[frontier["size"] == "nano"].set_index("label")
    assert len(ax.texts) == len(rows)
    for text in ax.texts:
        label = text.get_text().split(" ")[0]
        assert text.xy == pytest.approx(
            (100 * rows.loc[label, "kv_cache_vs_mha"], rows.loc[label, "loss_mean"])
        )
        assert to_rgba(text.get_color()) == to_rgba(attention_style(rows.loc[label, "attention"])["color"])
