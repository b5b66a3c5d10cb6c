"""The noise-against-length table (lightning_modules/analysis/noise.py) and its command on synthetic ledgers
with known answers."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from lightning_modules.analysis.noise import half_width, noise_vs_tokens, seeds_needed
from lightning_modules.commands.noise_table import main as noise_main

OFFSETS = {1: 0.01, 2: 0.03, 3: 0.05}  # arm - baseline per seed: mean 0.03, sd 0.02


def evaluations(arm_tokens: tuple[float, ...] = (100.0, 200.0)) -> pd.DataFrame:
    rows = []
    for seed, offset in OFFSETS.items():
        for tokens in (100.0, 200.0):
            base = 6.0 - tokens / 1000 + seed / 10  # the seed moves both arms: pairing removes it
            rows.append({"label": "mha", "seed": seed, "split": "val", "tokens": tokens, "loss": base})
        for tokens in arm_tokens:
            base = 6.0 - tokens / 1000 + seed / 10
            rows.append(
                {"label": "lrkv-r16", "seed": seed, "split": "val", "tokens": tokens, "loss": base + offset}
            )
        rows.append({"label": "mha", "seed": seed, "split": "test", "tokens": 200.0, "loss": 0.0})  # not val
    return pd.DataFrame(rows)


def test_the_paired_sd_half_width_and_seeds_are_the_hand_computed_ones() -> None:
    table = noise_vs_tokens(evaluations(), "lrkv-r16", "mha", target=0.015)
    assert table["tokens"].tolist() == [100.0, 200.0] and table["pairs"].tolist() == [3, 3]
    row = table.iloc[1]
    assert row["mean_diff"] == pytest.approx(0.03) and row["sd_diff"] == pytest.approx(0.02)
    assert row["half_width"] == pytest.approx(4.302653 * 0.02 / math.sqrt(3), rel=1e-6)
    # n = 9: t(8) 2.306 x 0.02 / 3 = 0.0154 > 0.015; n = 10: t(9) 2.262 x 0.02 / 3.162 = 0.0143
    assert row["seeds_for_0.015"] == 10
    assert row["sd_mha"] == pytest.approx(0.1)  # 0.1, 0.2, 0.3
    assert row["sd_lrkv-r16"] == pytest.approx(0.12)  # 0.11, 0.23, 0.35: its seed and its offset add up


def test_the_arm_is_read_at_the_baselines_tokens_and_never_extrapolated() -> None:
    # The arm validated at 50 and 150 only: 100 lies between (interpolated, exact for a linear curve), 200 beyond.
    table = noise_vs_tokens(evaluations(arm_tokens=(50.0, 150.0)), "lrkv-r16", "mha", target=0.015)
    first, second = table.iloc[0], table.iloc[1]
    assert first["pairs"] == 3 and first["mean_diff"] == pytest.approx(0.03)
    assert second["pairs"] == 0 and math.isnan(second["sd_diff"]) and math.isnan(second["seeds_for_0.015"])


def test_helpers_refuse_or_say_nan_where_there_is_no_answer() -> None:
    assert math.isnan(half_width(0.02, 1)) and math.isnan(seeds_needed(math.nan, 0.015))
    assert seeds_needed(0.0, 0.015) == 2
    assert math.isnan(seeds_needed(10.0, 1e-6))  # out of reach: no number to plan with
    with pytest.raises(ValueError, match="must be > 0"):
        seeds_needed(0.02, 0.0)
    with pytest.raises(ValueError, match="no val evaluations of arm 'gqa'.*arms: lrkv-r16, mha"):
        noise_vs_tokens(evaluations(), "gqa", "mha", target=0.015)


def test_the_command_writes_its_files_and_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "pilot"
    ledger.mkdir()
    evaluations().to_csv(ledger / "evaluations.csv", index=False)
    assert noise_main([str(ledger), "--arm", "lrkv-r16"]) == 0
    assert "| 200 | 3 | +0.0300 | 0.0200 | 0.0497 | 10 |" in capsys.readouterr().out
    assert {p.name for p in ledger.iterdir()} >= {"noise.csv", "noise.png"}
    one_seed = tmp_path / "one-seed"  # a partial ledger: no sd yet, the table and figure say so
    one_seed.mkdir()
    evaluations().query("seed == 1").to_csv(one_seed / "evaluations.csv", index=False)
    assert noise_main([str(one_seed), "--arm", "lrkv-r16"]) == 0
    assert "| 200 | 1 | +0.0100 | nan |" in capsys.readouterr().out and (one_seed / "noise.png").is_file()
    assert noise_main([str(tmp_path / "none"), "--arm", "lrkv-r16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "evaluations.csv" in err[0] and "--report" in err[0]
