"""Bad configurations fail at construction, naming the field and what is allowed."""

from __future__ import annotations

import pytest

from lightning_modules.core.errors import ConfigError
from lightning_modules.model.attention import AttentionConfig, names, resolve
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.transformer import Transformer
from tests.helpers import attn, tiny_model


def test_unknown_attention_kind() -> None:
    allowed = ", ".join(sorted(names()))  # every registered kind, sorted
    with pytest.raises(ConfigError, match=rf"attention\.kind.*'flash'.*allowed: {allowed}$"):
        AttentionConfig(kind="flash")


def test_heads_not_divisible_by_kv_heads() -> None:
    with pytest.raises(
        ConfigError, match=r"attention\.n_kv_heads=3 must divide model\.n_head=4; allowed: \[1, 2, 4\]"
    ):
        Transformer(tiny_model(), attn("gqa", n_kv_heads=3))


@pytest.mark.parametrize("rank", [0, -2])
def test_rank_below_one(rank: int) -> None:
    with pytest.raises(ConfigError, match=r"attention\.rank=.*below 1"):
        attn("lrkv", rank=rank)


def test_rank_above_head_dim() -> None:
    with pytest.raises(ConfigError, match=r"attention\.rank=17 out of range; allowed 1\.\.head_dim \(16\)"):
        Transformer(tiny_model(), attn("lrkv", rank=17))


@pytest.mark.parametrize(
    "kind,knob",
    [
        ("gqa", {"rank": 8}),
        ("mha", {"n_kv_heads": 2}),
        ("mqa", {"n_kv_heads": 1}),
        ("lrkv", {"kv_latent_dim": 64}),
        ("mla", {"rank": 4}),
        ("gqa", {"lrkv_path": "factorized"}),
    ],
)
def test_knob_given_to_a_kind_that_does_not_use_it(kind: str, knob: dict) -> None:
    (name,) = knob
    with pytest.raises(ConfigError, match=rf"attention\.{name} is not used by attention kind '{kind}'"):
        attn(kind, **knob)


def test_size_defaults_for_a_kind_must_be_its_knobs() -> None:
    with pytest.raises(ConfigError, match=r"model\.attention_defaults\.gqa: \['rank'\] not used by 'gqa'"):
        resolve(tiny_model(attention_defaults={"gqa": {"rank": 4}}), attn("gqa"))


def test_d_model_inconsistent_with_heads() -> None:
    with pytest.raises(
        ConfigError,
        match=r"model\.d_model=100 is inconsistent with model\.n_head x model\.head_dim = 4 x 16 = 64",
    ):
        ModelConfig(d_model=100, n_head=4, head_dim=16)


def test_odd_rope_dimension() -> None:
    with pytest.raises(ConfigError, match=r"model\.head_dim=15: RoPE needs an even dimension"):
        ModelConfig(d_model=60, n_head=4, head_dim=15)
    with pytest.raises(ConfigError, match=r"attention\.rope_head_dim=7: RoPE needs an even dimension"):
        Transformer(tiny_model(), attn("mla", rope_head_dim=7))


def test_bad_lrkv_path() -> None:
    with pytest.raises(
        ConfigError, match=r"attention\.lrkv_path='fast': allowed values are 'factorized', 'materialized'"
    ):
        attn("lrkv", lrkv_path="fast")


def test_explicit_knob_overrides_size_default() -> None:
    net = Transformer(tiny_model(), attn("lrkv", rank=2))
    assert net.attention_config.rank == 2
    assert Transformer(tiny_model(), attn("lrkv")).attention_config.rank == 4  # tiny_model's default


def test_vocab_is_padded_to_a_multiple_of_64() -> None:
    assert ModelConfig(vocab_size=50257, n_head=4, d_model=128, head_dim=32).padded_vocab_size == 50304
    assert tiny_model(vocab_size=128).padded_vocab_size == 128


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"lr": 0.0}, r"optimizer\.lr=0\.0: must be > 0"),
        ({"head_lr": -1.0}, r"optimizer\.head_lr=-1\.0: must be > 0"),
        ({"warmup_steps": -1}, r"optimizer\.warmup_steps=-1: must be >= 0"),
        ({"min_lr_ratio": 1.5}, r"optimizer\.min_lr_ratio=1\.5: must be in \[0, 1\]"),
    ],
)
def test_bad_optimizer_values(fields: dict, message: str) -> None:
    from lightning_modules.optim.setup import OptimizerConfig

    with pytest.raises(ConfigError, match=message):
        OptimizerConfig(**fields)


def test_bad_budget_values() -> None:
    from lightning_modules.costs.budget import Budget

    with pytest.raises(ConfigError, match=r"model\.budget\.flops=0\.0: must be > 0"):
        Budget(flops=0.0)
    with pytest.raises(ConfigError, match=r"model\.budget\.tokens=-5: must be > 0"):
        Budget(tokens=-5)


def test_unknown_size_fragment_lists_the_allowed_ones() -> None:
    from lightning_modules.costs import counts as costs

    with pytest.raises(ConfigError, match=r"no conf/model/3b\.yaml; allowed: .*128m.*nano"):
        costs.fragment("model", "3b")
