"""The fused-kernel launches one decode step makes at a real size, recorded on the meta device (no memory).

One layer of the model is built on `meta`, its cache allocated there in the decode dtype and marked filled to
`context - 1` positions, and one token decoded while lightning_modules/kernels/support.py captures launches:
the records hold the real shapes, strides and dtypes that a GPU decode would pass, which
lightning_modules/kernels/aot.py compiles for a GPU target. Nothing here imports Triton.
"""

from __future__ import annotations

import dataclasses

import torch

from lightning_modules.core.fragments import fragment
from lightning_modules.kernels import support
from lightning_modules.model.attention import AttentionConfig
from lightning_modules.model.attention.registry import load_configs
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.transformer import Transformer


def decode_launches(
    model: ModelConfig,
    attention: AttentionConfig,
    batch: int,
    context: int,
    dtype: torch.dtype,
    max_len: int | None = None,
) -> list[support.Launch]:
    """The launches of one single-token decode step of one layer, attending to `context` positions of a cache
    allocated for max_len (default: context), weights and cache in dtype; [] for an attention without a fused
    kernel."""
    one_layer = dataclasses.replace(model, n_layer=1)
    with torch.device("meta"):
        net = Transformer(one_layer, attention).to(dtype)
    attn = net.blocks[0].attn
    if attn.fused_decode_kernel is None:
        return []
    cache = attn.new_cache(batch, max(context, max_len or 0), device="meta", dtype=dtype)
    cache.length = context - 1
    x = torch.empty(batch, 1, model.d_model, device="meta", dtype=dtype)
    with support.capture() as launches, torch.no_grad():
        attn.decode(x, net.rope, cache)
    if not launches:
        raise RuntimeError(f"{attention.kind}: the decode step launched no fused kernel on meta tensors")
    return list(launches)


def launches_at(
    size: str, kind: str, dtype: torch.dtype, batch: int, context: int, max_len: int | None = None
) -> list[support.Launch]:
    """decode_launches for conf/model/<size>.yaml with conf/attention/<kind>.yaml."""
    model, attention = load_configs([fragment("model", size), fragment("attention", kind)])
    return decode_launches(model, attention, batch, context, dtype, max_len)
