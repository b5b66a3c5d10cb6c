"""LRKV's absorbed decode (lightning_modules/model/attention/lrkv_cached.py) against per-head keys built and
normalised the plain way: the algebra on random tensors, then whole generations in float64 at prefill, chunked
and single-token steps, past seq_len, with and without QK-norm; scores in fp32 whatever the weights."""

from __future__ import annotations

import pytest
import torch

from lightning_modules.model.attention import lrkv_cached as lrkv_decode
from lightning_modules.model.layers import RotaryEmbedding
from lightning_modules.model.transformer import Transformer
from tests.helpers import attn, rms, rope_reference, tiny_model
from tests.model.helpers import build, decode_all, tokens


def test_latent_scores_equal_q_dot_normalised_rotated_keys() -> None:
    """q . R_t(g * (k_s + B_h l_h)) / rms(k_s + B_h l_h), with RoPE and the norm from tests/helpers.py."""
    torch.manual_seed(0)
    B, T, H, S, dh, r = 2, 3, 4, 10, 16, 5
    k_s, l_k = torch.randn(B, S, dh, dtype=torch.float64), torch.randn(B, S, H, r, dtype=torch.float64)
    b_k, gain = torch.randn(H, dh, r, dtype=torch.float64), torch.rand(dh, dtype=torch.float64) + 0.5
    q = torch.randn(B, T, H, dh, dtype=torch.float64)
    keys = rope_reference(
        rms(k_s.unsqueeze(2) + torch.einsum("bshr,hdr->bshd", l_k, b_k), gain)
    )  # (B,S,H,dh)
    expected = torch.einsum("bthd,bshd->bhts", q, keys)

    rope = RotaryEmbedding(dh, S).double()
    angle = torch.arange(S, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(dh // 2, dtype=torch.float64) * 2 / dh
    )
    rope.cos, rope.sin = angle.cos(), angle.sin()  # exact tables, as rope_reference computes them
    rope.basis = torch.cat([rope.cos, rope.sin], dim=-1)
    sigma = lrkv_decode.key_scale(k_s.unsqueeze(2) + torch.einsum("bshr,hdr->bshd", l_k, b_k), 1e-6)
    k_rot = rope((gain * k_s).unsqueeze(2)).squeeze(2)
    c = gain[:, None] * b_k
    basis = lrkv_decode.rope_basis(rope, S, torch.float64)
    latent = lrkv_decode.latent_scores(q, lrkv_decode.query_maps(q, c), k_rot, l_k, sigma, basis)
    rebuilt = lrkv_decode.rebuilt_scores(q, c, k_rot, l_k, sigma, rope)
    torch.testing.assert_close(latent, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(rebuilt, expected, rtol=0, atol=1e-12)


# Chunks of 1 and 2 take the latent form (T r <= d_h at tiny: r 8, d_h 16), longer ones the rebuilt form.
CHUNKS = {"prefill": [11], "chunked": [1, 2, 3, 7], "steps-only": []}


@pytest.mark.slow
@pytest.mark.parametrize("chunks", CHUNKS.values(), ids=CHUNKS.keys())
@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk-norm", "no-qk-norm"])
def test_absorbed_equals_materialised_in_float64_past_seq_len(chunks: list[int], qk_norm: bool) -> None:
    torch.manual_seed(0)
    net = Transformer(tiny_model(seq_len=48, init_std=0.1, qk_norm=qk_norm), attn("lrkv")).eval().double()
    if qk_norm:
        with torch.no_grad():
            for block in net.blocks:
                block.attn.k_norm.weight.uniform_(0.5, 1.5)
    toks = tokens(length=80)  # 32 positions past seq_len: RoPE tables longer than training's
    reference = decode_all(net, toks, chunks, path="materialized")
    assert reference.std() > 0.3
    for path in ("absorbed", "rebuilt"):
        torch.testing.assert_close(decode_all(net, toks, chunks, path=path), reference, rtol=0, atol=1e-10)


def test_the_absorbed_cache_holds_no_per_head_key() -> None:
    net = build("lrkv")
    m, rank = net.config, net.blocks[0].attn.rank
    (cache, *_) = net.new_caches(1, 8)
    shapes = {name: tuple(b.shape[2:]) for name, b in cache.buffers.items()}
    assert shapes == {
        "k_rot": (m.head_dim,),
        "v_s": (m.head_dim,),
        "l_k": (m.n_head, rank),
        "sigma": (m.n_head,),
        "l_v": (8, rank),  # head-major: (H, S, r)
    }
    assert cache.elements_per_token() == 2 * m.head_dim + 2 * m.n_head * rank + m.n_head


@pytest.mark.parametrize("weights", ["bf16", "fp32-under-bf16-autocast"])
def test_scores_are_fp32_whatever_the_weights(weights: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 score can be off by 1/16 at |s| >= 8 before the softmax: the scores are formed in fp32."""
    seen: list[torch.dtype] = []
    latent_scores = lrkv_decode.latent_scores

    def spy(*args: torch.Tensor) -> torch.Tensor:
        out = latent_scores(*args)
        seen.append(out.dtype)
        return out

    monkeypatch.setattr("lightning_modules.model.attention.lrkv.latent_scores", spy)
    net = build("lrkv")
    if weights == "bf16":
        net = net.to(torch.bfloat16)
    toks = tokens(length=12)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=weights != "bf16"):
        decode_all(net, toks, [4])
    assert seen and set(seen) == {torch.float32}
