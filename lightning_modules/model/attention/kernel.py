"""The one place that chooses the attention kernel, separately from the attention variant (docs/attentions.md).

Every variant hands `attend` queries, keys and values in (B, heads, T, dim) layout; keys and values may have
fewer heads than queries (grouped KV heads, H % G == 0) and values may have a different head dim than
queries and keys (MLA). flash-attn (`pip install .[flash]`) runs when it is installed and usable: a CUDA
tensor on an Ampere or newer GPU, fp16/bf16 (directly, or fp32 under an fp16/bf16 autocast, which is what
SDPA would compute in too), equal q/k/v head dims of at most 256 (flash-attn 2's `flash_attn_func`). It
takes grouped KV heads natively. Everything else, MLA's unequal q/k and v head dims included, goes to
torch's scaled_dot_product_attention with `enable_gqa`; so K/V are never repeated in memory on either path.

`last_kernel` and `last_reason` record what the latest call ran and why, so that training can log it
(LanguageModel tags its MLflow run with `attention_kernel` after the first step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

try:  # optional extra: pip install .[flash] on CUDA machines
    from flash_attn import flash_attn_func  # type: ignore[import-not-found]
except ImportError:  # flash-attn cannot be built without CUDA
    flash_attn_func = None

FLASH_MAX_HEAD_DIM = 256
FLASH_MIN_CAPABILITY = (8, 0)  # flash-attn 2: Ampere, Ada, Hopper

# The kernel the latest call used ("flash_attn" or "sdpa") and why, so that training can log which one ran.
last_kernel: str = "none"
last_reason: str = "no call yet"


def flash_device(t: Tensor) -> bool:
    """Whether t lives on a GPU that flash-attn 2 supports."""
    return t.is_cuda and torch.cuda.get_device_capability(t.device) >= FLASH_MIN_CAPABILITY


def compute_dtype(t: Tensor) -> torch.dtype:
    """The dtype attention runs in: t's own, or the autocast dtype when autocast would lower t's fp32."""
    if t.dtype == torch.float32 and torch.is_autocast_enabled(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return t.dtype


def flash_unusable_reason(q: Tensor, k: Tensor, v: Tensor) -> str | None:
    """None when flash-attn can run this call, else why not."""
    if flash_attn_func is None:
        return "flash-attn not installed"
    if not flash_device(q):
        return f"device {q.device} is not a CUDA GPU of compute capability >= 8.0"
    if compute_dtype(q) not in (torch.float16, torch.bfloat16):
        return f"dtype {compute_dtype(q)} (flash-attn needs fp16 or bf16)"
    if not q.shape[-1] == k.shape[-1] == v.shape[-1]:
        return f"unequal head dims q/k {q.shape[-1]}, v {v.shape[-1]}"
    if q.shape[-1] > FLASH_MAX_HEAD_DIM:
        return f"head dim {q.shape[-1]} > {FLASH_MAX_HEAD_DIM}"
    return None


def flash_usable(q: Tensor, k: Tensor, v: Tensor) -> bool:
    return flash_unusable_reason(q, k, v) is None


def attend(q: Tensor, k: Tensor, v: Tensor, causal: bool = True, scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale + causal mask) v.

    q: (B, H, Tq, d_qk); k: (B, G, Tk, d_qk); v: (B, G, Tk, d_v) with H % G == 0. Returns (B, H, Tq, d_v).
    With Tq < Tk (decoding after a prefill) the causal mask is aligned to the end: query i sees keys
    0 .. Tk - Tq + i.
    """
    global last_kernel, last_reason
    Tq, Tk = q.shape[2], k.shape[2]
    reason = flash_unusable_reason(q, k, v)
    if reason is None:
        last_kernel, last_reason = "flash_attn", "installed and usable"
        dtype = compute_dtype(q)  # flash-attn is not an autocast op: cast as autocast would for SDPA
        # flash-attn wants (B, T, heads, dim) and takes G < H natively; its causal mask is bottom-right
        # aligned (flash-attn >= 2.1), which is what decoding needs.
        out = flash_attn_func(
            q.transpose(1, 2).to(dtype),
            k.transpose(1, 2).to(dtype),
            v.transpose(1, 2).to(dtype),
            causal=causal,
            softmax_scale=scale,
        )
        return out.transpose(1, 2)
    last_kernel, last_reason = "sdpa", reason
    grouped = q.shape[1] != k.shape[1]
    if Tq == 1 and grouped:
        # A decode step: the H / G query heads sharing a kv head become H / G query rows of that head, so SDPA
        # never expands K/V to H heads (on CPU at S = 4096: 2x faster for MQA, 8x for MLA's absorbed latent).
        # Head h reads kv head h // (H / G), so consecutive heads form a group: (B, H, 1, d) -> (B, G, H/G, d).
        B, H, _, d = q.shape
        G = k.shape[1]
        out = F.scaled_dot_product_attention(q.reshape(B, G, H // G, d), k, v, scale=scale)
        return out.reshape(B, H, 1, v.shape[-1])
    if not causal or Tq == 1:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=grouped)
    if Tq == Tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=grouped)
    # SDPA's is_causal is top-left aligned; build the bottom-right mask for a chunk after a cache.
    mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(diagonal=Tk - Tq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=grouped)


def masked_softmax(scores: Tensor, causal: bool = True) -> Tensor:
    """softmax over the last dim of (B, H, Tq, Tk) scores, in fp32 (or wider for wider scores), with the causal mask aligned to the end as
    in `attend` (query i sees keys 0 .. Tk - Tq + i)."""
    Tq, Tk = scores.shape[-2], scores.shape[-1]
    if causal and Tq > 1:
        mask = torch.ones(Tq, Tk, dtype=torch.bool, device=scores.device).tril(diagonal=Tk - Tq)
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))


def attention_probs(q: Tensor, k: Tensor, scale: float, causal: bool = True) -> Tensor:
    """softmax(q k^T * scale + causal mask) as an explicit (B, H, Tq, Tk) tensor, for decode paths that mix
    values themselves (LRKV's absorbed values, docs/attentions.md). q: (B, H, Tq, d); k: (B, H, Tk, d). The causal
    mask is aligned to the end, as in `attend`. The softmax runs in fp32 and returns q's dtype."""
    return masked_softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, causal).to(q.dtype)
