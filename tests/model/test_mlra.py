"""Multi-head low-rank attention (lightning_modules/model/attention/mlra.py) against a float64 reference written
from the MLRA paper's equations (arXiv 2603.02188) head by head and branch by branch; references with a
deliberate error are told apart; cached decode equals the full forward in float64 past seq_len."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from lightning_modules.core.errors import ConfigError
from lightning_modules.costs import counts as costs
from lightning_modules.model.attention import resolve
from lightning_modules.model.attention.mlra import LatentBlockAttention
from tests.helpers import attn, rms, rope_reference, tiny_model
from tests.model.helpers import exact_rope, float64_decode_diff, float64_layer, variant_size


def latent_block_reference(module: LatentBlockAttention, x: Tensor, mistake: str = "") -> Tensor:
    """n latent blocks c_b = RMSNorm_b(x W^DKV_b) sqrt(d / w), dealt to m branches of P = n / m blocks; head h
    reads block b = i P + h // (H / P) in branch i, as row hh = h mod (H / P) of that block's up-projections:
    k_{i,h} = [c_b W^UK_{b,hh} ; RoPE(x W^KR)], v_{i,h} = c_b W^UV_{b,hh}, q_h = [q^C_h ; RoPE(q^R_h)] (through
    W^UQ(RMSNorm(x W^DQ) sqrt(d / d_cq)) when compressed); y_h = sum_i softmax(q_h . k_{i,h} / sqrt(d_h + d_R))
    v_{i,h} / sqrt(m). `mistake` plants one error."""
    B, T, d = x.shape
    H, dh, d_r, d_c, d_cq = module.n_head, module.head_dim, module.d_r, module.d_c, module.d_cq
    n, m = module.n_blocks, module.n_branches
    P, w = n // m, d_c // n
    q_rows = module.in_proj.out_features - d_c - d_r
    w_q, w_dkv, w_kr = module.in_proj.weight.split([q_rows, d_c, d_r])
    q_all = x @ w_q.T
    if d_cq:
        q_all = (rms(q_all, module.q_norm.weight) * math.sqrt(d / d_cq)) @ module.q_up.weight.T
    q_all = q_all.view(B, T, H, dh + d_r)
    scale = 1.0 if mistake == "no latent scaling" else math.sqrt(d / w)
    latent = x @ w_dkv.T
    c = [rms(latent[..., b * w : (b + 1) * w], module.kv_norms[b].weight) * scale for b in range(n)]
    k_rope = rope_reference((x @ w_kr.T)[:, :, None])[:, :, 0]  # (B, T, d_R)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    heads = []
    for h in range(H):
        q = torch.cat([q_all[:, :, h, :dh], rope_reference(q_all[:, :, h : h + 1, dh:])[:, :, 0]], dim=-1)
        y = torch.zeros(B, T, dh, dtype=x.dtype)
        for i in range(m):
            j = h % P if mistake == "interleaved heads" else h // (H // P)
            b, hh = i * P + j, h % (H // P)
            k = torch.cat([c[b] @ module.w_uk[b, hh * dh : (hh + 1) * dh].T, k_rope], dim=-1)
            v = c[b] @ module.w_uv[b, hh * dh : (hh + 1) * dh].T
            scores = torch.einsum("btd,bsd->bts", q, k) / math.sqrt(dh + d_r)
            y = y + torch.einsum("bts,bsd->btd", scores.masked_fill(~mask, -math.inf).softmax(-1), v)
        heads.append(y / math.sqrt(m))
    return torch.cat(heads, dim=-1) @ module.out.weight.T


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
