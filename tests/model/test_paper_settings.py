"""The paper's per-size attention settings are written once, as each size's attention_defaults in
conf/model/<size>.yaml; this test holds the paper's table (docs/paper-errata.md, "Per-size attention
settings") as a literal and checks the configs, the docs' copy and the paper's main-run labels against it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lightning_modules.analysis import paper
from lightning_modules.core.fragments import fragment
from lightning_modules.model.config import load_model_config

ERRATA = Path(__file__).resolve().parents[2] / "docs" / "paper-errata.md"

# The paper's table: size -> (query heads, GQA kv heads, MLA d_c, LRKV r, LRKV cache as % of MHA's).
PAPER_TABLE = {
    "128m": (6, 3, 128, 46, 52.6),
    "1b": (12, 4, 256, 51, 48.2),
    "2.5b": (18, 6, 384, 55, 48.5),
    "6.3b": (32, 2, 1024, 54, 45.3),
}


def knobs(size: str) -> dict[str, dict[str, int]]:
    _, kv_heads, latent, rank, _ = PAPER_TABLE[size]
    return {"gqa": {"n_kv_heads": kv_heads}, "mla": {"kv_latent_dim": latent}, "lrkv": {"rank": rank}}


def docs_table(heading: str) -> dict[str, list[str]]:
    """The markdown table under `heading` in docs/paper-errata.md: first column -> the other cells."""
    section = ERRATA.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # past the header and rule
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return {row[0]: row[1:] for row in cells}


@pytest.mark.parametrize("size", PAPER_TABLE)
def test_conf_model_attention_defaults_are_the_papers(size: str) -> None:
    model = load_model_config([fragment("model", size)])[0]
    assert model.n_head == PAPER_TABLE[size][0]
    for kind, values in knobs(size).items():
        for knob, value in values.items():
            assert model.attention_defaults[kind][knob] == value, (size, kind, knob)


def test_the_docs_table_is_the_papers() -> None:
    settings = docs_table("Per-size attention settings (each size's `attention_defaults`)")
    heads = docs_table("Sizes (conf/model/)")
    assert set(settings) == set(PAPER_TABLE)
    for size, (n_head, kv_heads, latent, rank, percent) in PAPER_TABLE.items():
        gqa, mla, lrkv, cache = settings[size]
        assert (int(gqa), int(mla), int(lrkv)) == (kv_heads, latent, rank), size
        assert float(re.sub(r"\s*%$", "", cache)) == percent, size
        assert int(heads[size][1]) == n_head, size


def test_the_printed_cache_fractions_are_the_papers() -> None:
    printed = {size: row[4] / 100 for size, row in PAPER_TABLE.items()}
    cache = paper.LRKV_CACHE_VS_MHA  # conf/paper/results.yaml
    assert cache == pytest.approx(printed)


@pytest.mark.parametrize("size", PAPER_TABLE)
def test_main_run_labels_follow_the_settings(size: str) -> None:
    _, kv_heads, latent, rank, _ = PAPER_TABLE[size]
    assert paper.main_label(size, "gqa") == f"gqa-g{kv_heads}"
    assert paper.main_label(size, "mla") == f"mla-c{latent}"
    assert paper.main_label(size, "lrkv") == f"lrkv-r{rank}"
    assert paper.main_label(size, "mha") == "mha"
    assert paper.main_label("long-8k", "lrkv") is None  # outside the table: the paper states no knobs
