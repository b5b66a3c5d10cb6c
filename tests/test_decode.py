"""Cached decoding: equal to the full forward for every attention, with caches as small as the cost model
says, absorbed / exact paths equal to their plainer references, and FLOPs as costs.py counts them."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from lightning_modules import costs
from lightning_modules.attention import REGISTRY
from lightning_modules.attention.cache import LayerCache, caches_nbytes
from lightning_modules.layers import RMSNorm
from lightning_modules.transformer import Transformer
from tests.helpers import KINDS, attn, nano_model, tiny_model

VARIANTS = [(k, {}) for k in KINDS] + [
    ("lrkv", {"lrkv_path": "materialized"}),
    ("mla", {"q_latent_dim": 24}),
    ("gqa", {"n_kv_heads": 1}),
]
SEQ = 64  # tiny_model with a longer context, so that a prefill is followed by many single-token steps


def build(kind: str, seed: int = 0, **knobs: object) -> Transformer:
    """Tiny decoder with a larger init and random norm gains, so logits are O(1) and every weight matters."""
    torch.manual_seed(seed)
    net = Transformer(tiny_model(seq_len=SEQ, init_std=0.1), attn(kind, **knobs)).eval()
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, RMSNorm):
                module.weight.uniform_(0.5, 1.5)
    return net


def tokens(batch: int = 2, length: int = SEQ, seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randint(0, 128, (batch, length))


@torch.no_grad()
def decode_all(
    net: Transformer, toks: torch.Tensor, chunks: list[int], path: str | None = None
) -> torch.Tensor:
    """Prefill in the given chunk lengths, then one token at a time; the logits of every position."""
    caches = net.new_caches(toks.shape[0], toks.shape[1], path=path)
    out, pos = [], 0
    for n in chunks:
        out.append(net.decode(toks[:, pos : pos + n], caches))
        pos += n
    while pos < toks.shape[1]:
        out.append(net.decode(toks[:, pos : pos + 1], caches))
        pos += 1
    assert all(c.length == toks.shape[1] for c in caches)
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("kind,knobs", VARIANTS)
@pytest.mark.parametrize("chunks", [[11], [7, 5], []], ids=["prefill", "chunked-prefill", "steps-only"])
def test_cached_decode_equals_full_forward(kind: str, knobs: dict, chunks: list[int]) -> None:
    net = build(kind, **knobs)
    toks = tokens()
    with torch.no_grad():
        full = net(toks)
    assert full.std() > 0.3  # logits of a size where a 1e-4 error would be a real error
    torch.testing.assert_close(decode_all(net, toks, chunks), full, atol=1e-4, rtol=0)


def test_last_only_gives_the_last_row() -> None:
    net = build("lrkv")
    toks = tokens(length=20)
    with torch.no_grad():
        full = net(toks)
        last = net.decode(toks, net.new_caches(2, 20), last_only=True)
    assert last.shape == (2, 1, full.shape[-1])
    torch.testing.assert_close(last, full[:, -1:], atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind,knobs", VARIANTS)
def test_measured_cache_bytes_equal_the_cost_model(kind: str, knobs: dict) -> None:
    """A bf16 generation's caches hold exactly kv_cache_bytes_per_token x tokens (cost model: bf16)."""
    net = build(kind, **knobs).to(torch.bfloat16)
    m, a = net.config, net.attention_config
    n_tokens, batch = 24, 2
    toks = tokens(batch, n_tokens)
    caches = net.new_caches(batch, n_tokens)
    with torch.no_grad():
        net.decode(toks[:, :8], caches)
        for t in range(8, n_tokens):
            net.decode(toks[:, t : t + 1], caches)
    assert all(b.dtype == torch.bfloat16 for c in caches for b in c.buffers.values())
    assert caches_nbytes(caches) == costs.kv_cache_bytes_per_token(m, a) * n_tokens * batch
    per_layer = REGISTRY[kind].cache_elements_per_token(m, a)
    assert all(c.elements_per_token() == per_layer for c in caches)
    if kind != "mha":  # no variant but mha holds full per-head K/V
        assert caches_nbytes(caches) < costs.mha_cache_bytes_per_token(m) * n_tokens * batch


def test_lrkv_materialized_reference_holds_mha_sized_cache() -> None:
    net = build("lrkv")
    caches = net.new_caches(1, 10, path="materialized")
    assert caches_nbytes(caches) == 10 * costs.mha_cache_bytes_per_token(net.config) * 4 // 2  # fp32: 4 bytes


@pytest.mark.parametrize("knobs", [{}, {"q_latent_dim": 24}])
def test_mla_absorbed_equals_rebuilt(knobs: dict) -> None:
    net = build("mla", **knobs)
    toks = tokens()
    absorbed = decode_all(net, toks, [9], path="absorbed")
    rebuilt = decode_all(net, toks, [9], path="rebuilt")
    torch.testing.assert_close(absorbed, rebuilt, atol=1e-5, rtol=0)


@pytest.mark.parametrize("lrkv_path", ["factorized", "materialized"])
def test_lrkv_exact_equals_materialised_per_head_kv(lrkv_path: str) -> None:
    net = build("lrkv", lrkv_path=lrkv_path)
    toks = tokens()
    exact = decode_all(net, toks, [9], path="exact")
    materialised = decode_all(net, toks, [9], path="materialized")
    torch.testing.assert_close(exact, materialised, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind,knobs", VARIANTS)
def test_decode_flops_equal_torch_flop_counter(kind: str, knobs: dict) -> None:
    """One decode step at context S counted by torch equals costs.decode_flops_per_token(S).

    The counter sees nothing of the default CPU SDPA kernel (DESIGN.md "Costs"), so the step runs under the
    math backend, which it counts in full. LRKV's exact path mixes values itself (explicit matmuls) and is
    visible either way. Norms, RoPE, softmax and the embedding lookup are not counted by either side.
    """
    m, a = nano_model(), attn(kind, **knobs)
    torch.manual_seed(0)
    net = Transformer(m, a).eval()
    context = 100
    toks = torch.randint(0, m.vocab_size, (1, context))
    counter = FlopCounterMode(display=False)
    with torch.no_grad():
        caches = net.new_caches(1, context)
        net.decode(toks[:, :-1], caches)
        with sdpa_kernel(SDPBackend.MATH), counter:
            net.decode(toks[:, -1:], caches)
    assert counter.get_total_flops() == pytest.approx(costs.decode_flops_per_token(m, a, context), rel=0.01)


def test_cache_rejects_overflow_and_unknown_path() -> None:
    net = build("gqa")
    caches = net.new_caches(1, 4)
    with torch.no_grad():
        net.decode(tokens(1, 4), caches)
        with pytest.raises(ValueError, match="cache full: 4 positions held \\+ 1 new > max_len 4"):
            net.decode(tokens(1, 1), caches)
    with pytest.raises(
        ValueError, match="decode path 'absorbed' not offered by attention 'gqa'; allowed: kv"
    ):
        net.new_caches(1, 4, path="absorbed")


def test_caches_are_not_stored_on_the_model() -> None:
    """Two generations with their own caches interleave without interfering."""
    net = build("mla")
    a, b = tokens(1, 12, seed=2), tokens(1, 12, seed=3)
    ca, cb = net.new_caches(1, 12), net.new_caches(1, 12)
    with torch.no_grad():
        out_a = [net.decode(a[:, :4], ca)]
        out_b = [net.decode(b[:, :4], cb)]
        for t in range(4, 12):
            out_a.append(net.decode(a[:, t : t + 1], ca))
            out_b.append(net.decode(b[:, t : t + 1], cb))
        torch.testing.assert_close(torch.cat(out_a, 1), net(a), atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.cat(out_b, 1), net(b), atol=1e-4, rtol=0)
    assert isinstance(ca[0], LayerCache) and not any(isinstance(v, LayerCache) for v in vars(net).values())
