"""Grouped latent attention (lightning_modules/model/attention/gla.py) against a float64 reference written from
the GLA paper's equations (arXiv 2505.21487), head by head (tests/model/helpers.py latent_block_reference with
one branch and no latent scaling); references with a deliberate error are told apart; cached decode equals the
full forward in float64 past seq_len."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from lightning_modules.core.errors import ConfigError
from lightning_modules.costs import counts as costs
from lightning_modules.model.attention import resolve
from lightning_modules.model.attention.mlra import LatentBlockAttention
from tests.helpers import attn, tiny_model
from tests.model.helpers import (
    exact_rope,
    float64_decode_diff,
    float64_layer,
    latent_block_reference,
    variant_size,
)

SHAPES = {  # (heads, head_dim, d_c, d_R, groups, q_latent_dim)
    "gla2": (4, 16, 32, 8, 2, 0),
    "one-group": (4, 16, 32, 8, 1, 0),  # mla with a per-layer latent norm
    "groups-eq-heads": (4, 16, 32, 8, 4, 0),
    "gla3-h6-compressed-query": (6, 8, 24, 4, 3, 12),
}


def _layer_and_input(shape: tuple[int, ...]) -> tuple[LatentBlockAttention, Tensor]:
    H, dh, d_c, d_r, g, d_cq = shape
    module = float64_layer(
        "gla", variant_size(H, dh), kv_latent_dim=d_c, rope_head_dim=d_r, gla_groups=g, q_latent_dim=d_cq
    )
    assert isinstance(module, LatentBlockAttention)
    torch.manual_seed(1)
    return module, torch.randn(2, 24, H * dh, dtype=torch.float64)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_gla_equals_the_paper_reference_in_float64(shape: tuple[int, ...]) -> None:
    module, x = _layer_and_input(shape)
    out = module(x, exact_rope(shape[3], 24))
    assert out.std() > 0.1
    assert (out - latent_block_reference(module, x, latent_scaling=False)).abs().max().item() < 1e-10


@pytest.mark.parametrize("mistake", ["interleaved heads", "mlra's latent scaling"])
def test_a_reference_with_an_error_is_told_apart(mistake: str) -> None:
    module, x = _layer_and_input(SHAPES["gla2"])
    out = module(x, exact_rope(8, 24))
    if mistake == "interleaved heads":
        wrong = latent_block_reference(module, x, mistake, latent_scaling=False)
    else:
        wrong = latent_block_reference(module, x, latent_scaling=True)
    assert (out - wrong).abs().max().item() > 1e-3


@pytest.mark.parametrize("chunks", [[11], [1, 2, 3, 7], []], ids=["prefill", "chunked", "steps-only"])
@pytest.mark.parametrize("knobs", [{"gla_groups": 2}, {"gla_groups": 4}, {"q_latent_dim": 24}])
def test_gla_decode_equals_forward_in_float64_past_seq_len(chunks: list[int], knobs: dict) -> None:
    assert float64_decode_diff("gla", chunks, **knobs) < 1e-10


def test_gla_caches_its_latent_heads_and_one_rope_key_as_mla_does() -> None:
    m = tiny_model()  # 4 heads of 16
    a = attn("gla", kv_latent_dim=24, rope_head_dim=8)
    assert (
        costs.kv_cache_bytes_per_token(m, a) == costs.kv_cache_bytes_per_token(m, attn("mla")) == 2 * 2 * 32
    )
    assert resolve(m, a).config.label() == "gla-2-c24"  # GLA-2 unless gla_groups says otherwise


@pytest.mark.parametrize(
    "knobs,message",
    [
        ({"gla_groups": 3, "kv_latent_dim": 48}, r"model\.n_head=4: .* must be a multiple of 3"),
        ({"kv_latent_dim": 25}, r"attention\.kv_latent_dim=25: must split into 2 equal latent blocks"),
    ],
)
def test_gla_knobs_are_checked(knobs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(tiny_model(), attn("gla", **knobs))
