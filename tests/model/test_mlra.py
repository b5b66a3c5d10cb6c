"""Multi-head low-rank attention (lightning_modules/model/attention/mlra.py) against a float64 reference written
from the MLRA paper's equations (arXiv 2603.02188) head by head and branch by branch; references with a
deliberate error are told apart; cached decode equals the full forward in float64 past seq_len."""

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

SHAPES = {  # (heads, head_dim, d_c, d_R, branches, q_latent_dim)
    "mlra4": (4, 16, 64, 8, 4, 0),
    "mlra2": (4, 16, 32, 8, 2, 0),
    "mlra2-h6-compressed-query": (6, 8, 24, 4, 2, 12),
    "one-branch": (4, 16, 64, 8, 1, 0),  # each head reads one block: GLA-4
    "mlra2-one-head-per-block": (2, 8, 16, 4, 2, 0),  # blocks of a branch == heads
}


def _layer_and_input(shape: tuple[int, ...]) -> tuple[LatentBlockAttention, Tensor]:
    H, dh, d_c, d_r, m, d_cq = shape
    module = float64_layer(
        "mlra", variant_size(H, dh), kv_latent_dim=d_c, rope_head_dim=d_r, mlra_branches=m, q_latent_dim=d_cq
    )
    assert isinstance(module, LatentBlockAttention)
    torch.manual_seed(1)
    return module, torch.randn(2, 24, H * dh, dtype=torch.float64)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_mlra_equals_the_paper_reference_in_float64(shape: tuple[int, ...]) -> None:
    module, x = _layer_and_input(shape)
    out = module(x, exact_rope(shape[3], 24))
    assert out.std() > 0.1
    assert (out - latent_block_reference(module, x)).abs().max().item() < 1e-10


@pytest.mark.parametrize("mistake", ["interleaved heads", "no latent scaling"])
def test_a_reference_with_an_error_is_told_apart(mistake: str) -> None:
    module, x = _layer_and_input(SHAPES["mlra2"])
    out = module(x, exact_rope(8, 24))
    assert (out - latent_block_reference(module, x, mistake)).abs().max().item() > 1e-3


@pytest.mark.parametrize("chunks", [[11], [1, 2, 3, 7], []], ids=["prefill", "chunked", "steps-only"])
@pytest.mark.parametrize("knobs", [{"mlra_branches": 4}, {"mlra_branches": 2}, {"q_latent_dim": 24}])
def test_mlra_decode_equals_forward_in_float64_past_seq_len(chunks: list[int], knobs: dict) -> None:
    assert float64_decode_diff("mlra", chunks, **knobs) < 1e-10


def test_mlra_caches_its_blocks_and_one_rope_key_as_mla_does() -> None:
    m = tiny_model()  # 4 heads of 16
    for branches in (2, 4):
        a = attn("mlra", kv_latent_dim=24, rope_head_dim=8, mlra_branches=branches)
        assert (
            costs.kv_cache_bytes_per_token(m, a)
            == costs.kv_cache_bytes_per_token(m, attn("mla"))
            == 2 * 2 * 32
        )
    assert attn("mlra", mlra_branches=2, kv_latent_dim=24).label() == "mlra-2-c24"


@pytest.mark.parametrize(
    "knobs,message",
    [
        ({"mlra_branches": 3}, r"attention\.mlra_branches=3: must divide the 4 latent blocks"),
        ({"kv_latent_dim": 30}, r"attention\.kv_latent_dim=30: must split into 4 equal latent blocks"),
        ({"rope_head_dim": 5}, r"attention\.rope_head_dim=5: RoPE needs an even dimension"),
    ],
)
def test_mlra_knobs_are_checked(knobs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(tiny_model(), attn("mlra", **knobs))


def test_mlra2_needs_an_even_head_count() -> None:
    size = variant_size(3, 16)
    with pytest.raises(ConfigError, match=r"model\.n_head=3: .* must be a multiple of 2"):
        resolve(size, attn("mlra", mlra_branches=2))
    resolve(size, attn("mlra", mlra_branches=4))  # each block serves every head
