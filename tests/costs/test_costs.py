"""The cost model equals what is built and what torch counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from lightning_modules.commands.cost_report import main as costs_main
from lightning_modules.costs import counts as costs
from lightning_modules.model.transformer import Transformer
from tests.helpers import KINDS, attn, nano_model

VARIANTS = [(k, {}) for k in KINDS] + [
    ("lrkv", {"lrkv_path": "materialized"}),
    ("mla", {"q_latent_dim": 48}),
    ("gqa", {"n_kv_heads": 1}),
]


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("kind,knobs", VARIANTS)
def test_param_counts_equal_the_built_nano_model(kind: str, knobs: dict) -> None:
    m, a = nano_model(), attn(kind, **knobs)
    net = Transformer(m, a)
    counts = costs.param_counts(m, a)
    assert counts.total == numel(net)
    assert counts.attention == sum(numel(b.attn) for b in net.blocks)
    assert counts.embedding == numel(net.embed) + numel(net.head)
    assert counts.non_embedding == counts.total - counts.embedding


@pytest.mark.parametrize("size", costs.PAPER_SIZES + ("20m", "long-8k"))
@pytest.mark.parametrize("kind", KINDS)
def test_param_counts_equal_paper_sizes_built_on_meta(size: str, kind: str) -> None:
    m, a = costs.load_configs([costs.fragment("model", size)])[0], attn(kind)
    with torch.device("meta"):
        net = Transformer(m, a)
    assert costs.param_counts(m, a).total == numel(net)
    assert costs.param_counts(m, a).attention == sum(numel(b.attn) for b in net.blocks)


@pytest.mark.parametrize("kind,knobs", VARIANTS)
def test_train_flops_equal_torch_flop_counter(kind: str, knobs: dict) -> None:
    m, a = nano_model(), attn(kind, **knobs)
    torch.manual_seed(0)
    net = Transformer(m, a)
    batch = 2
    tokens = torch.randint(0, m.vocab_size, (batch, m.seq_len + 1))
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        logits = net(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    measured = counter.get_total_flops() / (batch * m.seq_len)
    predicted = costs.train_flops_per_token(m, a, tokens_per_forward=batch * m.seq_len)
    assert measured == pytest.approx(predicted, rel=0.01)


@pytest.mark.parametrize("size,expected", [("128m", 52.6), ("1b", 48.2), ("2.5b", 48.5), ("6.3b", 45.3)])
def test_lrkv_cache_fraction_at_paper_ranks(size: str, expected: float) -> None:
    """The paper's convention (1/H + r/d_h) gives its printed figures; ours adds 1 / rms per head (H of 2 H d_h)."""
    m, a = costs.load_configs([costs.fragment("model", size), costs.fragment("attention", "lrkv")])
    row = costs.cost_row(m, a)
    assert round(100 * row["kv_cache_vs_mha_paper_convention"], 1) == expected
    assert row["kv_cache_vs_mha"] == pytest.approx(
        row["kv_cache_vs_mha_paper_convention"] + 1 / (2 * m.head_dim)
    )


def test_cache_bytes_per_variant_at_nano() -> None:
    m = nano_model()  # 4 layers, 4 heads of 32, bf16
    expected = {
        "mha": 2 * 4 * 32,
        "mqa": 2 * 32,
        "gqa": 2 * 2 * 32,
        "mla": 64 + 16,
        "lrkv": 2 * (32 + 4 * 8) + 4,
    }  # lrkv: + 1 / rms per head
    for kind, elements in expected.items():
        assert costs.kv_cache_bytes_per_token(m, attn(kind)) == 2 * 4 * elements


def test_mla_reports_the_paper_convention_beside_ours() -> None:
    m, a = costs.load_configs([costs.fragment("model", "128m"), costs.fragment("attention", "mla")])
    row = costs.cost_row(m, a)
    assert row["kv_cache_vs_mha_paper_convention"] == pytest.approx(128 / (2 * 6 * 128))  # 8.3 %
    assert row["kv_cache_vs_mha"] == pytest.approx((128 + 64) / (2 * 6 * 128))


def test_cli_json_covers_every_size_and_attention(capsys: pytest.CaptureFixture[str]) -> None:
    assert costs_main(["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["size"], r["attention"]) for r in rows} == {(s, k) for s in costs.TABLE_SIZES for k in KINDS}
    for row in rows:
        assert {
            "size",
            "attention",
            "params",
            "kv_cache_bytes_per_token",
            "train_flops_per_token",
            "kv_cache_vs_mha",
        } <= set(row)


def test_cli_config_fragments_select_one_row(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--config", "conf/model/128m.yaml", "--config", "conf/attention/lrkv.yaml", "--json"]
    assert costs_main(args) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["size"], row["label"]) == ("128m", "lrkv-r46")


@pytest.mark.slow
def test_cli_table_and_bad_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert costs_main([]) == 0
    out = capsys.readouterr().out
    assert "lrkv-r46" in out and "52.6%" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  attention:\n    kind: gqa\n    rank: 4\n")
    assert costs_main(["--config", str(bad)]) == 2
    assert "attention.rank is not used by attention kind 'gqa'" in capsys.readouterr().err
