"""Shared test helpers: small configs, a naive reference attention written independently of the package, a free port."""

from __future__ import annotations

import math
import socket

import torch
from torch import Tensor

from lightning_modules.model.attention import AttentionConfig, names
from lightning_modules.model.config import ModelConfig


class _Registered:
    """The registered attentions, read when iterated: a variant registered by a test (tests/model/test_registry.py)
    is part of every suite parametrised over KINDS collected after it."""

    def __iter__(self):  # noqa: ANN204
        return iter(names())

    def __len__(self) -> int:
        return len(names())


KINDS = _Registered()

NANO_DEFAULTS = {
    "gqa": {"n_kv_heads": 2},
    "mla": {"kv_latent_dim": 64, "rope_head_dim": 16},
    "lrkv": {"rank": 8},
}


def tiny_model(**overrides: object) -> ModelConfig:
    """A model small enough for exact equivalence tests: 2 layers, 4 heads of 16, vocab 128, 32 tokens."""
    fields: dict[str, object] = dict(
        name="tiny",
        vocab_size=128,
        seq_len=32,
        n_layer=2,
        n_head=4,
        d_model=64,
        head_dim=16,
        attention_defaults={
            "gqa": {"n_kv_heads": 2},
            "mla": {"kv_latent_dim": 24, "rope_head_dim": 8},
            "lrkv": {"rank": 4},
        },
    )
    fields.update(overrides)
    return ModelConfig(**fields)  # type: ignore[arg-type]


def nano_model() -> ModelConfig:
    return ModelConfig(attention_defaults=NANO_DEFAULTS)


def attn(kind: str, **knobs: object) -> AttentionConfig:
    return AttentionConfig(kind=kind, **knobs)  # type: ignore[arg-type]


def rope_reference(x: Tensor, base: float = 10000.0) -> Tensor:
    """RoPE on (B, T, heads, dim), rotating pairs (i, i + dim/2), written out independently."""
    B, T, _, dim = x.shape
    half = dim // 2
    freq = base ** (-torch.arange(half, dtype=torch.float64) * 2 / dim)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * freq[None, :]
    cos, sin = angle.cos().to(x.dtype)[None, :, None, :], angle.sin().to(x.dtype)[None, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def rms(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def causal_attention_reference(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
    """q, k, v: (B, T, H, d) with k, v already expanded per query head. Returns (B, T, H, d_v)."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("bthd,bshd->bhts", q, k) * scale
    T = q.shape[1]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (gloo rendezvous, a test server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
