"""LRKV's exact decode scores from the compressed cache, keys never rebuilt (docs/attentions.md, "lrkv decode").

Head h's normalised, rotated key at position t is

    key_h(t) = sigma_h(t) * R_t(g * (k_s(t) + B_h l_h(t))),  sigma_h(t) = 1 / rms(k_s(t) + B_h l_h(t)),

with g QK-norm's gain and R_t RoPE. sigma_h(t) depends on token t alone, so it is computed once when t is
appended (H scalars per token), and so is the shared part k_rot(t) = R_t(g * k_s(t)) (d_h per token, one for all
heads). For a query q (normalised and rotated) the low-rank part q . R_t(C_h l_h(t)), C_h = diag(g) B_h, is
linear in l_h(t): with RoPE's pairs (i, i + d_h/2) and the basis F(t) = [cos(t theta) ; sin(t theta)],

    q . R_t(C_h l) = F(t) . (M_h l),   M_h = [q1 * C1 + q2 * C2 ; q2 * C1 - q1 * C2]   (d_h x r),

where q1, q2 and C1, C2 are the halves of q and of C_h's rows. So a step builds M_h once per query and head and
scores every cached position with one product of the basis with M (S x d_h times d_h x H r) and a row-wise dot
with the cached latents: the bytes read are the compressed cache, and the FLOPs stay about r d_h per position
and head (RoPE's geometric frequencies leave no shortcut). Everything here runs in fp32, whatever the cache
holds: the scores feed an fp32 softmax, and a score rounded to bf16 before it can be off by 1/16 at |s| >= 8.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_modules.model.layers import RotaryEmbedding


def score_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32, or wider when the model runs wider (float64 in the equivalence tests)."""
    return torch.promote_types(dtype, torch.float32)


def rope_basis(rope: RotaryEmbedding, end: int, dtype: torch.dtype) -> Tensor:
    """F(t) = [cos(t theta) ; sin(t theta)] for t = 0 .. end - 1: (end, d_h), from RoPE's own fp32 tables."""
    return rope.basis_table(end).to(dtype)  # a view when the dtype is the tables' own


def query_maps(q: Tensor, c: Tensor) -> Tensor:
    """M (B, T, H, d_h, r) such that q_h . R_t(c_h l) = F(t) . (M_h l). q: (B, T, H, d_h) after norm and RoPE;
    c: (H, d_h, r), the gain folded into B^K_h."""
    half = q.shape[-1] // 2
    q1, q2 = q[..., :half, None], q[..., half:, None]  # (B, T, H, d_h/2, 1)
    c1, c2 = c[:, :half], c[:, half:]  # (H, d_h/2, r)
    return torch.cat([q1 * c1 + q2 * c2, q2 * c1 - q1 * c2], dim=-2)


def latent_scores(
    q: Tensor, maps: Tensor, k_rot: Tensor, l_k: Tensor, sigma: Tensor | None, basis: Tensor
) -> Tensor:
    """q . key_h(t) for every query and held position, keys never formed: (B, H, T, S), fp32, unscaled.

    q: (B, T, H, d_h), in the dtype the scores are computed in; maps: query_maps(q, c); k_rot: (B, S, d_h); l_k: (B, S, H, r); sigma: (B, S, H) or None
    (no QK-norm); basis: (S, d_h). Memory: one (B, S, T, H, r) product, so this suits a few queries at a time."""
    B, T, H, dh, r = maps.shape
    S = k_rot.shape[1]
    # One product of the RoPE basis with every query's M: (S, d_h) @ (B, d_h, T H r) -> (B, S, T H r).
    projected = torch.matmul(basis, maps.permute(0, 3, 1, 2, 4).reshape(B, dh, T * H * r))
    low = (projected.view(B, S, T, H, r) * l_k.to(q.dtype).unsqueeze(2)).sum(-1)  # (B, S, T, H)
    shared = torch.matmul(k_rot.to(q.dtype), q.permute(0, 3, 1, 2).reshape(B, dh, T * H)).view(B, S, T, H)
    scores = shared + low
    if sigma is not None:
        scores = scores * sigma.to(q.dtype).unsqueeze(2)
    return scores.permute(0, 3, 2, 1)


def rebuilt_scores(
    q: Tensor, c: Tensor, k_rot: Tensor, l_k: Tensor, sigma: Tensor | None, rope: RotaryEmbedding
) -> Tensor:
    """The same scores with each held key formed from the compressed cache, for chunks of many queries (a
    prefill after a cache), where the latent form's (B, S, T, H, r) product would outgrow the keys: (B, H, T, S)."""
    low = rope(torch.einsum("bshr,hdr->bshd", l_k.to(q.dtype), c))  # R_t(C_h l_h(t)), positions 0 .. S - 1
    keys = k_rot.to(q.dtype).unsqueeze(2) + low  # (B, S, H, d_h)
    if sigma is not None:
        keys = keys * sigma.to(q.dtype).unsqueeze(-1)
    return torch.matmul(q.transpose(1, 2), keys.permute(0, 2, 3, 1))


def key_scale(k: Tensor, eps: float) -> Tensor:
    """sigma = 1 / rms(k) over the last dim: (..., H, d_h) -> (..., H). The same quantity F.rms_norm multiplies
    by, so sigma * g * k is QK-norm's output."""
    return torch.rsqrt(k.pow(2).mean(-1) + eps)
