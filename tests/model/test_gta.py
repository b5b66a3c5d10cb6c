"""Grouped-tied attention (lightning_modules/model/attention/gta.py) against a float64 reference written from
the GTA paper's equations (arXiv 2505.21487) head by head; a reference with a deliberate error is told apart;
cached decode equals the full forward in float64 past seq_len."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from lightning_modules.core.errors import ConfigError
from lightning_modules.model.attention import resolve
from lightning_modules.model.attention.gta import GroupedTiedAttention
from tests.helpers import attn, rope_reference, tiny_model
from tests.model.helpers import exact_rope, float64_decode_diff, float64_layer, variant_size


def gta_reference(module: GroupedTiedAttention, x: Tensor, mistake: str = "") -> Tensor:
    """For every head h of group g = h // (H / G): q_h = x W^Q_h, t_g = x W^T_g, k^R = x W^KR;
    k_h = [t_g[:d_h - d_R] ; RoPE(k^R)], v_h = t_g, q_h's last d_R entries rotated; causal softmax of
    q_h . k_h / sqrt(d_h); outputs concatenated over heads and projected. `mistake` plants one error."""
    B, T, _ = x.shape
    H, G, dh, d_r = module.n_head, module.n_kv, module.head_dim, module.d_r
    d_n = dh - d_r
    w_q, w_t, w_kr = module.in_proj.weight.split([H * dh, G * dh, d_r])
    k_rope = rope_reference((x @ w_kr.T).view(B, T, 1, d_r))[:, :, 0]  # (B, T, d_R)
    heads = []
    for h in range(H):
        g = h % G if mistake == "interleaved groups" else h // (H // G)
        q = x @ w_q[h * dh : (h + 1) * dh].T  # (B, T, dh)
        tied = x @ w_t[g * dh : (g + 1) * dh].T
        if mistake == "rope first":  # the rotated part at the front of the head instead of its end
            q = torch.cat([rope_reference(q[:, :, None, :d_r])[:, :, 0], q[:, :, d_r:]], dim=-1)
            k = torch.cat([k_rope, tied[..., d_r:]], dim=-1)
        else:
            q = torch.cat([q[..., :d_n], rope_reference(q[:, :, None, d_n:])[:, :, 0]], dim=-1)
            k = torch.cat([tied[..., :d_n], k_rope], dim=-1)
        v = tied
        scores = torch.einsum("btd,bsd->bts", q, k) / math.sqrt(dh)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        heads.append(torch.einsum("bts,bsd->btd", scores.masked_fill(~mask, -math.inf).softmax(-1), v))
    return torch.cat(heads, dim=-1) @ module.out.weight.T


SHAPES = {  # (heads, head_dim, groups, d_R): one group, groups == heads, odd head counts, a narrow RoPE part
    "h4-g2": (4, 16, 2, 8),
    "one-group": (4, 16, 1, 8),
    "groups-eq-heads": (4, 16, 4, 4),
    "h6-g3": (6, 8, 3, 2),
    "h6-g6-wide-rope": (6, 8, 6, 6),
}


def _layer_and_input(shape: tuple[int, int, int, int]) -> tuple[GroupedTiedAttention, Tensor]:
    H, dh, G, d_r = shape
    module = float64_layer("gta", variant_size(H, dh), n_kv_heads=G, rope_head_dim=d_r)
    assert isinstance(module, GroupedTiedAttention)
    torch.manual_seed(1)
    return module, torch.randn(2, 24, H * dh, dtype=torch.float64)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_gta_equals_the_paper_reference_in_float64(shape: tuple[int, int, int, int]) -> None:
    module, x = _layer_and_input(shape)
    out = module(x, exact_rope(shape[3], 24))
    assert out.std() > 0.1
    assert (out - gta_reference(module, x)).abs().max().item() < 1e-10


@pytest.mark.parametrize("mistake", ["interleaved groups", "rope first"])
def test_a_reference_with_an_error_is_told_apart(mistake: str) -> None:
    module, x = _layer_and_input(SHAPES["h4-g2"])
    out = module(x, exact_rope(8, 24))
    assert (out - gta_reference(module, x, mistake)).abs().max().item() > 1e-3


@pytest.mark.parametrize("chunks", [[11], [1, 2, 3, 7], []], ids=["prefill", "chunked", "steps-only"])
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_gta_decode_equals_forward_in_float64_past_seq_len(chunks: list[int], groups: int) -> None:
    assert float64_decode_diff("gta", chunks, n_kv_heads=groups) < 1e-10


def test_gta_caches_one_tied_state_per_group_and_one_rope_key() -> None:
    m = tiny_model()  # 4 heads of 16
    module = GroupedTiedAttention.on_meta(m, resolve(m, attn("gta", n_kv_heads=2)).knobs)
    assert module.cache_layout("tied") == {"tied": (2, -1, 16), "k_rope": (-1, 8)}
    assert GroupedTiedAttention.cache_elements_per_token(m, module.knobs) == 2 * 16 + 8  # gqa-g2: 2 x 2 x 16


@pytest.mark.parametrize(
    "knobs,message",
    [
        ({"n_kv_heads": 3}, r"attention\.n_kv_heads=3 must divide model\.n_head=4"),
        ({"rope_head_dim": 5}, r"attention\.rope_head_dim=5: RoPE needs an even dimension"),
        ({"rope_head_dim": 16}, r"attention\.rope_head_dim=16: must be below head_dim \(16\)"),
    ],
)
def test_gta_knobs_are_checked(knobs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(tiny_model(), attn("gta", **knobs))
