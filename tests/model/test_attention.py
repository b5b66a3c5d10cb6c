"""Every attention variant: shapes, causality, gradients, and equivalences with copied weights."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lightning_modules.model.attention import resolve
from lightning_modules.model.attention.gqa import GroupedQueryAttention
from lightning_modules.model.attention.lrkv import LowRankKVAttention
from lightning_modules.model.attention.mla import MultiHeadLatentAttention
from lightning_modules.model.layers import RotaryEmbedding
from lightning_modules.model.transformer import Transformer
from tests.helpers import KINDS, attn, causal_attention_reference, rms, rope_reference, tiny_model


def build(kind: str, seed: int = 0, **knobs: object) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_model(), attn(kind, **knobs))


def layer(kind: str, seed: int = 0, **knobs: object) -> torch.nn.Module:
    """One attention layer of the tiny size, with random (not identity) norm gains so that copying them
    is part of what the equivalences check."""
    m = tiny_model()
    resolved = resolve(m, attn(kind, **knobs))
    torch.manual_seed(seed)
    module = resolved.variant(m, resolved.knobs)
    module.init_weights(0.1, 0.1)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return module


def rope_for(module: torch.nn.Module) -> RotaryEmbedding:
    m = tiny_model()
    return RotaryEmbedding(type(module).rope_dim(m, module.knobs), m.seq_len)


def x_input(seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(2, tiny_model().seq_len, tiny_model().d_model)


@pytest.mark.parametrize("kind", KINDS)
def test_output_shape(kind: str) -> None:
    net = build(kind)
    tokens = torch.randint(0, 128, (3, 17))
    assert net(tokens).shape == (3, 17, 128)


@pytest.mark.parametrize("kind", KINDS)
def test_causality_is_bit_exact(kind: str) -> None:
    net = build(kind).eval()
    tokens = torch.randint(0, 128, (2, 32))
    changed = tokens.clone()
    changed[:, 20:] = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        a, b = net(tokens), net(changed)
    assert torch.equal(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])  # the change is visible where it should be


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_reach_every_parameter(kind: str) -> None:
    net = build(kind)
    tokens = torch.randint(0, 128, (2, 32))
    logits = net(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    for name, p in net.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, f"zero gradient for {name}"


def gqa_reference(module: GroupedQueryAttention, x: torch.Tensor) -> torch.Tensor:
    """Per-head attention written out: head h reads kv head h // (H / G)."""
    B, T, _ = x.shape
    H, G, dh = module.n_head, module.n_kv, module.head_dim
    w_q, w_k, w_v = module.qkv.weight.split([H * dh, G * dh, G * dh])
    q = (x @ w_q.T).view(B, T, H, dh)
    k = (x @ w_k.T).view(B, T, G, dh)
    v = (x @ w_v.T).view(B, T, G, dh)
    q, k = rms(q, module.q_norm.weight), rms(k, module.k_norm.weight)
    q, k = rope_reference(q), rope_reference(k)
    index = torch.arange(H) // (H // G)
    y = causal_attention_reference(q, k[:, :, index], v[:, :, index])
    return y.reshape(B, T, H * dh) @ module.out.weight.T


@pytest.mark.parametrize("kind,knobs", [("mha", {}), ("gqa", {"n_kv_heads": 2}), ("mqa", {})])
def test_grouped_attention_matches_reference(kind: str, knobs: dict) -> None:
    module = layer(kind, **knobs)
    x = x_input()
    torch.testing.assert_close(module(x, rope_for(module)), gqa_reference(module, x), atol=1e-5, rtol=1e-5)


def test_gqa_with_all_heads_equals_mha() -> None:
    mha = layer("mha")
    gqa = layer("gqa", seed=5, n_kv_heads=4)
    gqa.load_state_dict(mha.state_dict())
    x = x_input()
    torch.testing.assert_close(gqa(x, rope_for(gqa)), mha(x, rope_for(mha)), atol=0, rtol=0)


def test_mqa_equals_gqa_with_one_kv_head() -> None:
    mqa = layer("mqa")
    gqa = layer("gqa", seed=5, n_kv_heads=1)
    gqa.load_state_dict(mqa.state_dict())
    x = x_input()
    torch.testing.assert_close(gqa(x, rope_for(gqa)), mqa(x, rope_for(mqa)), atol=0, rtol=0)


def lrkv_weights(module: LowRankKVAttention) -> tuple[torch.Tensor, ...]:
    return module.in_proj.weight.split(module._split_sizes())


def test_lrkv_without_residuals_is_single_kv_head_attention() -> None:
    lrkv = layer("lrkv", rank=4)
    with torch.no_grad():
        lrkv.b_k.zero_()
        lrkv.b_v.zero_()
    mqa = layer("mqa", seed=3)
    w_q, w_ks, w_vs, _, _ = lrkv_weights(lrkv)
    with torch.no_grad():
        mqa.qkv.weight.copy_(torch.cat([w_q, w_ks, w_vs]))
        mqa.out.weight.copy_(lrkv.out.weight)
        mqa.q_norm.weight.copy_(lrkv.q_norm.weight)
        mqa.k_norm.weight.copy_(lrkv.k_norm.weight)
    x = x_input()
    torch.testing.assert_close(lrkv(x, rope_for(lrkv)), mqa(x, rope_for(mqa)), atol=1e-6, rtol=1e-5)


def test_lrkv_full_rank_reproduces_random_mha() -> None:
    """Factor each head's K/V weights into shared + residual: W_h = mean_h W + B_h U_h with B_h = I."""
    mha = layer("mha", seed=11)
    m = tiny_model()
    H, dh = m.n_head, m.head_dim
    lrkv = layer("lrkv", rank=dh)
    w_q, w_k, w_v = mha.qkv.weight.split(H * dh)
    per_head_k, per_head_v = w_k.view(H, dh, -1), w_v.view(H, dh, -1)
    shared_k, shared_v = per_head_k.mean(0), per_head_v.mean(0)
    with torch.no_grad():
        lrkv.in_proj.weight.copy_(
            torch.cat(
                [
                    w_q,
                    shared_k,
                    shared_v,
                    (per_head_k - shared_k).flatten(0, 1),
                    (per_head_v - shared_v).flatten(0, 1),
                ]
            )
        )
        lrkv.b_k.copy_(torch.eye(dh).expand(H, dh, dh))
        lrkv.b_v.copy_(torch.eye(dh).expand(H, dh, dh))
        lrkv.out.weight.copy_(mha.out.weight)
        lrkv.q_norm.weight.copy_(mha.q_norm.weight)
        lrkv.k_norm.weight.copy_(mha.k_norm.weight)
    x = x_input()
    torch.testing.assert_close(lrkv(x, rope_for(lrkv)), mha(x, rope_for(mha)), atol=1e-5, rtol=1e-5)


def test_lrkv_paths_agree() -> None:
    factorized = layer("lrkv", lrkv_path="factorized")
    materialized = layer("lrkv", seed=9, lrkv_path="materialized")
    materialized.load_state_dict(factorized.state_dict())
    x = x_input()
    torch.testing.assert_close(
        materialized(x, rope_for(materialized)), factorized(x, rope_for(factorized)), atol=1e-5, rtol=1e-5
    )


def test_lrkv_residual_starts_near_a_tenth_of_shared() -> None:
    """docs/attentions.md: ||U_h B_h^T|| starts near 0.1 ||W_s||, at the paper's 128M shape."""
    from lightning_modules.model.config import ModelConfig

    m = ModelConfig(name="p", vocab_size=64, seq_len=8, n_layer=1, n_head=6, d_model=768, head_dim=128)
    knobs = resolve(m, attn("lrkv", rank=46)).knobs
    torch.manual_seed(0)
    module = LowRankKVAttention(m, knobs)
    module.init_weights(0.02, 0.02)
    _, w_ks, _, u_k, _ = lrkv_weights(module)
    shared = w_ks.norm()
    ratios = [(module.b_k[h] @ u_k.view(6, 46, -1)[h]).norm() / shared for h in range(6)]
    for ratio in ratios:
        assert 0.08 < ratio < 0.12, ratios


def test_mla_matches_reference() -> None:
    module = layer("mla")
    assert isinstance(module, MultiHeadLatentAttention)
    x = x_input()
    B, T, _ = x.shape
    H, dh, d_c, d_r = module.n_head, module.head_dim, module.d_c, module.d_r
    w_q, w_dkv, w_kr = module.in_proj.weight.split([H * (dh + d_r), d_c, d_r])
    c = rms(x @ w_dkv.T, module.kv_norm.weight)
    w_uk, w_uv = module.kv_up.weight.split(H * dh)
    k_c, v = (c @ w_uk.T).view(B, T, H, dh), (c @ w_uv.T).view(B, T, H, dh)
    k_r = rope_reference((x @ w_kr.T).view(B, T, 1, d_r)).expand(B, T, H, d_r)
    q = (x @ w_q.T).view(B, T, H, dh + d_r)
    q = torch.cat([q[..., :dh], rope_reference(q[..., dh:])], -1)
    y = causal_attention_reference(q, torch.cat([k_c, k_r], -1), v, scale=1 / math.sqrt(dh + d_r))
    expected = y.reshape(B, T, H * dh) @ module.out.weight.T
    torch.testing.assert_close(module(x, rope_for(module)), expected, atol=1e-5, rtol=1e-5)


def _mla_key_value_std(latent: int, latent_init: str) -> float:
    """The std of mla's per-head keys and values at init, at the 5m shape (d_model 256), on a normal input."""
    from lightning_modules.model.config import ModelConfig

    m = ModelConfig(name="p", vocab_size=64, seq_len=8, n_layer=1, n_head=4, d_model=256, head_dim=64)
    knobs = resolve(m, attn("mla", kv_latent_dim=latent, rope_head_dim=32, latent_init=latent_init)).knobs
    torch.manual_seed(0)
    module = MultiHeadLatentAttention(m, knobs)
    module.init_weights(0.02, 0.02)
    x = torch.randn(64, 8, 256)
    _, c, _ = module.in_proj(x).split([module.in_proj.out_features - latent - 32, latent, 32], dim=-1)
    return module.kv_up(module.kv_norm(c)).std().item()


@pytest.mark.parametrize("latent", [128, 224])
def test_mla_latent_init_sets_the_key_and_value_scale(latent: int) -> None:
    """docs/attentions.md "mla": fixed init gives keys and values std 0.02 sqrt(d_c), growing with the latent;
    fan_in gives 0.02 sqrt(d_model) whatever d_c."""
    fixed, fan_in = _mla_key_value_std(latent, "fixed"), _mla_key_value_std(latent, "fan_in")
    assert fixed == pytest.approx(0.02 * math.sqrt(latent), rel=0.05)
    assert fan_in == pytest.approx(0.02 * math.sqrt(256), rel=0.05)


def test_mla_default_init_is_the_fixed_one_bit_for_bit() -> None:
    """Adding the knob changed no earlier run: the default draws the same weights as latent_init=fixed."""
    default, fixed = build("mla", seed=3), build("mla", seed=3, latent_init="fixed")
    for (name, a), (_, b) in zip(default.state_dict().items(), fixed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    fan_in = build("mla", seed=3, latent_init="fan_in")
    assert not torch.equal(fan_in.blocks[0].attn.kv_up.weight, fixed.blocks[0].attn.kv_up.weight)
    assert torch.equal(fan_in.blocks[0].attn.in_proj.weight, fixed.blocks[0].attn.in_proj.weight)


def test_mla_with_query_compression_runs_and_counts() -> None:
    net = build("mla", q_latent_dim=24)
    assert net(torch.randint(0, 128, (1, 8))).shape == (1, 8, 128)
