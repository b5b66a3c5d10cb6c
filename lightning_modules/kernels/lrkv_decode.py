"""LRKV's absorbed decode step as one Triton kernel (its algebra: model/attention/lrkv_cached.py).

One program per (sequence, range of cached positions), all H heads together, so the shared key k_rot and the
shared value v_s of a position are loaded once for every head. Per block of positions it forms the RoPE basis
from the positions (cos and sin of t theta: nothing read), scores every head with two products, k_rot @ q and
[cos | sin] @ M (M: the query maps, r padded to a power of 2, at least 16, for the tensor cores), a row-wise
dot with the key latents and the 1 / rms scale, then an online softmax (base 2) that mixes v_s and the value
latents. The programs' partial sums are merged by split_kv.combine. So a step reads the compressed cache once:
(2 d_h + 2 H r + H) elements per position.

Precision: products accumulate in fp32; their inputs are the cache's dtype (bf16 on a GPU, as flash-attn's
are), fp32 with IEEE products when the cache is fp32. The softmax and the sums are fp32 throughout.
"""

import torch
import triton.language as tl
from torch import Tensor

from lightning_modules.kernels.split_kv import LOG2E, combine, splits
from lightning_modules.kernels.support import dot_dtype, dot_precision, launch, next_power_of_2

BLOCK = 64  # cached positions per block
PROGRAMS = 264  # about two programs per SM of an H100 / H200 (132 SMs)


def _partial(
    q_ptr, cos_map_ptr, sin_map_ptr, inv_freq_ptr,
    k_rot_ptr, sigma_ptr, l_k_ptr, v_s_ptr, l_v_ptr,
    part_m_ptr, part_l_ptr, part_v_ptr, part_lv_ptr,
    length, scale_log2e,
    s_kb, s_ks, s_sb, s_ss, s_lkb, s_lks, s_vb, s_vs, s_lvb, s_lvh, s_lvs,
    H: tl.constexpr, DH: tl.constexpr, R: tl.constexpr,
    HP: tl.constexpr, HALF: tl.constexpr, DHP: tl.constexpr, RP: tl.constexpr,
    BLOCK_S: tl.constexpr, PER_SPLIT: tl.constexpr, HAS_SIGMA: tl.constexpr, PRECISION: tl.constexpr,
    DOT: tl.constexpr,
) -> None:  # fmt: skip
    b = tl.program_id(0)
    split = tl.program_id(1)
    n_split = tl.num_programs(1)
    h = tl.arange(0, HP)
    d = tl.arange(0, DHP)
    i = tl.arange(0, HALF)
    j = tl.arange(0, RP)
    hr = tl.arange(0, HP * RP)
    # The query side, padded with zeros by the host: q (DHP, HP); maps (HALF, HP RP) for cos and for sin.
    q = tl.load(q_ptr + b * DHP * HP + d[:, None] * HP + h[None, :]).to(DOT)
    cos_map = tl.load(cos_map_ptr + b * HALF * HP * RP + i[:, None] * HP * RP + hr[None, :]).to(DOT)
    sin_map = tl.load(sin_map_ptr + b * HALF * HP * RP + i[:, None] * HP * RP + hr[None, :]).to(DOT)
    inv_freq = tl.load(inv_freq_ptr + i)
    head_ok = h < H
    lat_ok = (h[:, None] < H) & (j[None, :] < R)  # (HP, RP)

    m_i = tl.full([HP], float("-inf"), tl.float32)
    l_i = tl.zeros([HP], tl.float32)
    acc_v = tl.zeros([HP, DHP], tl.float32)
    acc_lv = tl.zeros([HP, RP], tl.float32)
    n_blocks = tl.cdiv(length, BLOCK_S)
    first = split * PER_SPLIT
    last = tl.minimum(first + PER_SPLIT, n_blocks)
    for blk in range(first, last):
        t = blk * BLOCK_S + tl.arange(0, BLOCK_S)
        t_ok = t < length
        k_rot = tl.load(
            k_rot_ptr + b * s_kb + t[:, None] * s_ks + d[None, :],
            mask=t_ok[:, None] & (d[None, :] < DH), other=0.0,
        ).to(DOT)  # fmt: skip
        scores = tl.dot(k_rot, q, input_precision=PRECISION)  # (BLOCK_S, HP): the shared key's part
        angle = t.to(tl.float32)[:, None] * inv_freq[None, :]  # (BLOCK_S, HALF), as RoPE's tables
        projected = tl.dot(tl.cos(angle).to(DOT), cos_map, input_precision=PRECISION)
        projected += tl.dot(tl.sin(angle).to(DOT), sin_map, input_precision=PRECISION)
        l_k = tl.load(
            l_k_ptr + b * s_lkb + t[:, None, None] * s_lks + h[None, :, None] * R + j[None, None, :],
            mask=t_ok[:, None, None] & lat_ok[None, :, :], other=0.0,
        ).to(tl.float32)  # fmt: skip
        scores += tl.sum(tl.reshape(projected, (BLOCK_S, HP, RP)) * l_k, axis=2)
        if HAS_SIGMA:
            sigma = tl.load(
                sigma_ptr + b * s_sb + t[:, None] * s_ss + h[None, :],
                mask=t_ok[:, None] & head_ok[None, :], other=0.0,
            ).to(tl.float32)  # fmt: skip
            scores = scores * sigma
        scores = tl.where(t_ok[:, None], scores * scale_log2e, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[None, :])  # (BLOCK_S, HP)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        v_s = tl.load(
            v_s_ptr + b * s_vb + t[:, None] * s_vs + d[None, :],
            mask=t_ok[:, None] & (d[None, :] < DH), other=0.0,
        ).to(DOT)  # fmt: skip
        acc_v = acc_v * alpha[:, None] + tl.dot(tl.trans(p).to(DOT), v_s, input_precision=PRECISION)
        l_v = tl.load(
            l_v_ptr + b * s_lvb + h[None, :, None] * s_lvh + t[:, None, None] * s_lvs + j[None, None, :],
            mask=t_ok[:, None, None] & lat_ok[None, :, :], other=0.0,
        ).to(tl.float32)  # fmt: skip
        acc_lv = acc_lv * alpha[:, None] + tl.sum(p[:, :, None] * l_v, axis=0)
        m_i = m_new
    part = b * n_split + split
    tl.store(part_m_ptr + part * HP + h, m_i)
    tl.store(part_l_ptr + part * HP + h, l_i)
    tl.store(part_v_ptr + part * HP * DHP + h[:, None] * DHP + d[None, :], acc_v)
    tl.store(part_lv_ptr + part * HP * RP + h[:, None] * RP + j[None, :], acc_lv)


def decode_step(
    q: Tensor,
    maps: Tensor,
    k_rot: Tensor,
    sigma: Tensor | None,
    l_k: Tensor,
    v_s: Tensor,
    l_v: Tensor,
    inv_freq: Tensor,
    scale: float,
    block: int = BLOCK,
    programs: int = PROGRAMS,
) -> tuple[Tensor, Tensor]:
    """One query per sequence against the S held positions. q: (B, H, d_h) after norm and RoPE; maps: (B, H, d_h, r)
    (lrkv_decode.query_maps); k_rot (B, S, d_h), sigma (B, S, H) or None, l_k (B, S, H, r), v_s (B, S, d_h),
    l_v (B, H, S, r): the cache's held views; inv_freq (d_h / 2,): RoPE's frequencies. Returns the softmax
    mixtures of v_s, (B, H, d_h), and of the value latents, (B, H, r), in fp32."""
    B, H, dh = q.shape
    S, r = k_rot.shape[1], l_k.shape[-1]
    if l_k.stride(-1) != 1 or l_v.stride(-1) != 1 or l_k.stride(-2) != r:
        raise ValueError("lrkv decode kernel: latents must be contiguous in (head, rank)")
    HP, DHP, RP = next_power_of_2(H), next_power_of_2(dh), next_power_of_2(r, floor=1)
    HALF = next_power_of_2(dh // 2)
    f32 = dict(device=q.device, dtype=torch.float32)
    q_pad = torch.zeros(B, DHP, HP, **f32)
    q_pad[:, :dh, :H] = q.transpose(1, 2)
    # [cos rows ; sin rows] of M as two contiguous (B, HALF, HP RP) tensors: the kernel steps by HALF HP RP per sequence.
    maps_pad = torch.zeros(2, B, HALF, HP, RP, **f32)
    maps_pad[:, :, : dh // 2, :H, :r] = maps.view(B, H, 2, dh // 2, r).permute(2, 0, 3, 1, 4)
    cos_map, sin_map = maps_pad.view(2, B, HALF, HP * RP).unbind(0)
    freq = torch.zeros(HALF, **f32)
    freq[: dh // 2] = inv_freq
    n_split, per_split = splits(S, block, B, programs)
    part_m = torch.empty(B, n_split, HP, **f32)
    part_l = torch.empty(B, n_split, HP, **f32)
    part_v = torch.empty(B, n_split, HP, DHP, **f32)
    part_lv = torch.empty(B, n_split, HP, RP, **f32)
    sig = sigma if sigma is not None else k_rot  # never read without HAS_SIGMA; any tensor stands in
    launch(
        _partial, (B, n_split),
        q_pad, cos_map, sin_map, freq,
        k_rot, sig, l_k, v_s, l_v,
        part_m, part_l, part_v, part_lv,
        S, scale * LOG2E,
        k_rot.stride(0), k_rot.stride(1), sig.stride(0), sig.stride(1), l_k.stride(0), l_k.stride(1),
        v_s.stride(0), v_s.stride(1), l_v.stride(0), l_v.stride(1), l_v.stride(2),
        H=H, DH=dh, R=r, HP=HP, HALF=HALF, DHP=DHP, RP=RP, BLOCK_S=block, PER_SPLIT=per_split,
        HAS_SIGMA=sigma is not None, PRECISION=dot_precision(k_rot.dtype), DOT=dot_dtype(k_rot.dtype),
    )  # fmt: skip
    mixed_v, mixed_lv = combine(part_m, part_l, part_v, part_lv)
    return mixed_v[:, :H, :dh], mixed_lv[:, :H, :r]
