"""The paper-size cost table beside the paper's printed numbers."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lightning_modules.analysis import paper
from lightning_modules.analysis.cost_tables import costs_beside_paper, flops_beside_paper, sweeps_beside_paper
from lightning_modules.model.attention import names


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return costs_beside_paper()


def test_every_paper_size_and_attention(table: pd.DataFrame) -> None:
    assert len(table) == 5 * len(names())
    assert list(table["size"].drop_duplicates()) == ["128m", "1b", "2.5b", "6.3b", "long-8k"]
    assert list(table["attention"][: len(names())]) == list(names())


def test_lrkv_cache_matches_the_paper_and_losses_are_its(table: pd.DataFrame) -> None:
    lrkv = table[table["attention"] == "lrkv"].set_index("size")
    for size, printed in paper.LRKV_CACHE_VS_MHA.items():
        assert lrkv.loc[size, "paper_kv_cache_vs_mha"] == printed
        assert lrkv.loc[size, "kv_cache_vs_mha_paper_convention"] == pytest.approx(printed, abs=5e-4), size
        assert lrkv.loc[size, "kv_cache_vs_mha"] > printed  # the absorbed decode also caches 1 / rms per head
    row = table[(table["size"] == "2.5b") & (table["attention"] == "lrkv")].iloc[0]
    assert row["paper_test_loss"] == 2.376 and row["paper_name"] == "2.5B"
    mla = table[(table["size"] == "128m") & (table["attention"] == "mla")].iloc[0]
    assert mla["kv_cache_vs_mha_paper_convention"] == pytest.approx(mla["paper_kv_cache_vs_mha"], abs=5e-4)
    assert mla["kv_cache_vs_mha"] > mla["kv_cache_vs_mha_paper_convention"]  # we also cache the RoPE key
    assert math.isnan(
        table[(table["size"] == "1b") & (table["attention"] == "gqa")]["paper_kv_cache_vs_mha"].item()
    )


def test_sweeps_match_the_printed_fractions() -> None:
    sweeps = sweeps_beside_paper()
    assert len(sweeps) == len(paper.LRKV_RANK_SWEEP_128M) + len(paper.MLA_LATENT_SWEEP_128M)
    diff = (sweeps["kv_cache_vs_mha_paper_convention"] - sweeps["paper_kv_cache_vs_mha"]).abs()
    assert diff.max() < 5e-4


def test_flops_implied_by_the_paper_totals(table: pd.DataFrame) -> None:
    flops = flops_beside_paper(table).set_index("size")
    assert flops.loc["128m", "paper_implied_flops_per_token"] == pytest.approx(70e18 / 100e9)
    ours = table[(table["size"] == "128m") & (table["attention"] == "mha")]["train_flops_per_token"].item()
    assert flops.loc["128m", "our_mha_total_exaflops"] == pytest.approx(ours * 100e9 / 1e18)


def test_paper_losses_only_for_the_configurations_it_ran() -> None:
    assert paper.loss_for("128m", "lrkv", "lrkv-r46") == 2.893
    assert paper.loss_for("128m", "lrkv", "lrkv-r8") == 2.908  # the rank sweep
    assert paper.loss_for("1b", "lrkv", "lrkv-r8") is None
    assert paper.loss_for("nano", "mha", "mha") is None
    assert paper.loss_for("long-8k", "gqa", "gqa-g4") == 2.704
