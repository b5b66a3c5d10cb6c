"""The one place that chooses the attention kernel, separately from the attention variant.

Every variant hands `attend` queries, keys and values in (B, heads, T, dim) layout; keys and values may have
fewer heads than queries (grouped KV heads, H % G == 0) and values may have a different head dim than
queries and keys (MLA). flash-attn is used when it is installed and usable (CUDA, fp16/bf16, equal q/k/v
head dims <= 256); otherwise torch's scaled_dot_product_attention with `enable_gqa`, so K/V are never
repeated in memory on either path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

try:  # optional extra: pip install .[flash] on CUDA machines
    from flash_attn import flash_attn_func  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - flash-attn cannot be built without CUDA
    flash_attn_func = None

# The kernel each call used last, so that training can log which one ran.
last_kernel: str = "none"


def flash_usable(q: Tensor, k: Tensor, v: Tensor) -> bool:
    return (
        flash_attn_func is not None
        and q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and q.shape[-1] == k.shape[-1] == v.shape[-1]
        and q.shape[-1] <= 256
    )


def attend(q: Tensor, k: Tensor, v: Tensor, causal: bool = True, scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale + causal mask) v.

    q: (B, H, Tq, d_qk); k: (B, G, Tk, d_qk); v: (B, G, Tk, d_v) with H % G == 0. Returns (B, H, Tq, d_v).
    With Tq < Tk (decoding after a prefill) the causal mask is aligned to the end: query i sees keys
    0 .. Tk - Tq + i.
    """
    global last_kernel
    Tq, Tk = q.shape[2], k.shape[2]
    if flash_usable(q, k, v):
        last_kernel = "flash_attn"
        # flash-attn wants (B, T, heads, dim) and handles G < H natively; its causal mask is bottom-right
        # aligned, which is what decoding needs.
        out = flash_attn_func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal, softmax_scale=scale
        )
        return out.transpose(1, 2)
    last_kernel = "sdpa"
    grouped = q.shape[1] != k.shape[1]
    if not causal or Tq == 1:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=grouped)
    if Tq == Tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=grouped)
    # SDPA's is_causal is top-left aligned; build the bottom-right mask for a chunk after a cache.
    mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(diagonal=Tk - Tq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=grouped)


def attention_probs(q: Tensor, k: Tensor, scale: float, causal: bool = True) -> Tensor:
    """softmax(q k^T * scale + causal mask) as an explicit (B, H, Tq, Tk) tensor, for decode paths that mix
    values themselves (LRKV's absorbed values, DESIGN.md). q: (B, H, Tq, d); k: (B, H, Tk, d). The causal
    mask is aligned to the end, as in `attend`. The softmax runs in fp32 and returns q's dtype."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, H, Tq, Tk)
    Tq, Tk = q.shape[2], k.shape[2]
    if causal and Tq > 1:
        mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(diagonal=Tk - Tq)
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
