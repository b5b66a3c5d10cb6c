"""LRKV's absorbed decode step as one Triton kernel (its algebra: model/attention/lrkv_cached.py).

One program per (head, range of cached positions, sequence). Per block of positions it forms the RoPE basis
from the positions (cos and sin of t theta: nothing read), scores the head with the shared key (a row-wise dot
k_rot . q), one product [cos | sin] @ M_h (the head's query map, d_h x r, in two halves) and a row-wise dot
with the key latents, times the 1 / rms scale, then an online softmax (base 2) that mixes v_s and the value
latents. The programs' partial sums are merged by split_kv.combine. So a step reads the compressed cache once
from memory, (2 d_h + 2 H r + H) elements per position; the shared k_rot and v_s are read by the H programs of
a position range, which the grid puts next to each other (head is the fastest axis) so that all but the first
read come from L2.

Why one head per program: with all heads in one program (this kernel's first form) the two map tiles were
(d_h / 2) x (H r) each, 256 KB at 128m, more shared memory than an H100 has (kernels/aot.py), and 6 heads padded
to 16 made the score products 3.7x the useful work. One head keeps the map tiles at (d_h / 2) x r and wastes
nothing on heads; only r is padded, to a power of 2 of at least 16 (tl.dot's smallest tile).

Precision: the basis product takes the cache's dtype (bf16 / fp16, as flash-attn's products do) and
accumulates in fp32; the shared-key dot, the latent dots, the softmax and the sums are fp32 throughout.
"""

import torch
import triton.language as tl
from torch import Tensor

from lightning_modules.kernels.split_kv import LOG2E, combine, splits
from lightning_modules.kernels.support import dot_dtype, dot_precision, launch, next_power_of_2

BLOCK = 64  # cached positions per block
PROGRAMS = 264  # about two programs per SM of an H100 / H200 (132 SMs)
# Arguments that change as a generation grows: one compile serves every length.
VARYING = ("length", "per_split")
NUM_WARPS = 4  # no spills on sm_90 or sm_100 (benchmarks/kernel_resources.py); 8 spilled at 6.3b on sm_100
NUM_STAGES = 2  # loads of the next block in flight while this one computes; 3 buys nothing for a stream


def _partial(
    q_ptr, maps_ptr, inv_freq_ptr,
    k_rot_ptr, sigma_ptr, l_k_ptr, v_s_ptr, l_v_ptr,
    part_m_ptr, part_l_ptr, part_v_ptr, part_lv_ptr,
    length, per_split, scale_log2e,
    s_kb, s_ks, s_sb, s_ss, s_lkb, s_lks, s_vb, s_vs, s_lvb, s_lvh, s_lvs,
    H: tl.constexpr, DH: tl.constexpr, R: tl.constexpr, HALF: tl.constexpr, DHP: tl.constexpr,
    RP: tl.constexpr, BLOCK_S: tl.constexpr, HAS_SIGMA: tl.constexpr,
    PRECISION: tl.constexpr, DOT: tl.constexpr,
) -> None:  # fmt: skip
    h = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)  # int64: b x a sequence's stride passes 2^31 in long, wide caches
    n_split = tl.num_programs(1)
    d = tl.arange(0, DHP)
    i = tl.arange(0, HALF)
    j = tl.arange(0, RP)
    d_ok = d < DH
    j_ok = j < R
    bh = b * H + h
    # The query side, zero-padded by the host: q (DHP,), fp32; M_h's cos rows and sin rows, (HALF, RP) each.
    q = tl.load(q_ptr + bh * DHP + d)
    maps = maps_ptr + bh * (2 * HALF * RP) + i[:, None] * RP + j[None, :]
    cos_map = tl.load(maps).to(DOT)
    sin_map = tl.load(maps + HALF * RP).to(DOT)
    inv_freq = tl.load(inv_freq_ptr + i)
    k_rot_row = k_rot_ptr + b * s_kb
    sigma_row = sigma_ptr + b * s_sb + h
    l_k_row = l_k_ptr + b * s_lkb + h * R
    v_s_row = v_s_ptr + b * s_vb
    l_v_row = l_v_ptr + b * s_lvb + h * s_lvh

    m_i = tl.max(tl.full([BLOCK_S], float("-inf"), tl.float32), axis=0)  # a 0-d fp32 running max
    l_i = tl.sum(tl.zeros([BLOCK_S], tl.float32), axis=0)
    acc_v = tl.zeros([DHP], tl.float32)
    acc_lv = tl.zeros([RP], tl.float32)
    n_blocks = tl.cdiv(length, BLOCK_S)
    first = split * per_split
    last = tl.minimum(first + per_split, n_blocks)
    for blk in range(first, last):
        t = blk * BLOCK_S + tl.arange(0, BLOCK_S)
        t_ok = t < length
        k_rot = tl.load(
            k_rot_row + t[:, None] * s_ks + d[None, :], mask=t_ok[:, None] & d_ok[None, :], other=0.0
        ).to(tl.float32)
        scores = tl.sum(k_rot * q[None, :], axis=1)  # (BLOCK_S,): the shared key's part
        angle = t.to(tl.float32)[:, None] * inv_freq[None, :]  # (BLOCK_S, HALF), as RoPE's tables
        projected = tl.dot(tl.cos(angle).to(DOT), cos_map, input_precision=PRECISION)
        projected = tl.dot(tl.sin(angle).to(DOT), sin_map, acc=projected, input_precision=PRECISION)
        l_k = tl.load(
            l_k_row + t[:, None] * s_lks + j[None, :], mask=t_ok[:, None] & j_ok[None, :], other=0.0
        ).to(tl.float32)
        scores += tl.sum(projected * l_k, axis=1)
        if HAS_SIGMA:
            scores = scores * tl.load(sigma_row + t * s_ss, mask=t_ok, other=0.0).to(tl.float32)
        scores = tl.where(t_ok, scores * scale_log2e, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new)  # (BLOCK_S,)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        v_s = tl.load(
            v_s_row + t[:, None] * s_vs + d[None, :], mask=t_ok[:, None] & d_ok[None, :], other=0.0
        ).to(tl.float32)
        acc_v = acc_v * alpha + tl.sum(p[:, None] * v_s, axis=0)
        l_v = tl.load(
            l_v_row + t[:, None] * s_lvs + j[None, :], mask=t_ok[:, None] & j_ok[None, :], other=0.0
        ).to(tl.float32)
        acc_lv = acc_lv * alpha + tl.sum(p[:, None] * l_v, axis=0)
        m_i = m_new
    part = (b * n_split + split) * H + h
    tl.store(part_m_ptr + part, m_i)
    tl.store(part_l_ptr + part, l_i)
    tl.store(part_v_ptr + part * DHP + d, acc_v)
    tl.store(part_lv_ptr + part * RP + j, acc_lv)


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
    (lrkv_cached.query_maps); k_rot (B, S, d_h), sigma (B, S, H) or None, l_k (B, S, H, r), v_s (B, S, d_h),
    l_v (B, H, S, r): the cache's held views; inv_freq (d_h / 2,): RoPE's frequencies. Returns the softmax
    mixtures of v_s, (B, H, d_h), and of the value latents, (B, H, r), in fp32."""
    B, H, dh = q.shape
    S, r = k_rot.shape[1], l_k.shape[-1]
    if l_k.stride(-1) != 1 or l_v.stride(-1) != 1 or l_k.stride(-2) != r:
        raise ValueError("lrkv decode kernel: latents must be contiguous in (head, rank)")
    if k_rot.stride(-1) != 1 or v_s.stride(-1) != 1:
        raise ValueError("lrkv decode kernel: k_rot and v_s must be contiguous in their last dim")
    DHP, RP, HALF = next_power_of_2(dh), next_power_of_2(r), next_power_of_2(dh // 2)
    f32 = dict(device=q.device, dtype=torch.float32)
    q_pad = torch.zeros(B, H, DHP, **f32)
    q_pad[..., :dh] = q
    maps_pad = torch.zeros(B, H, 2, HALF, RP, **f32)  # per head: cos rows, then sin rows of M_h
    maps_pad[..., : dh // 2, :r] = maps.reshape(B, H, 2, dh // 2, r)
    freq = torch.zeros(HALF, **f32)
    freq[: dh // 2] = inv_freq
    n_split, per_split = splits(S, block, B * H, programs)
    part_m = torch.empty(B, n_split, H, **f32)
    part_l = torch.empty(B, n_split, H, **f32)
    part_v = torch.empty(B, n_split, H, DHP, **f32)
    part_lv = torch.empty(B, n_split, H, RP, **f32)
    sig = sigma if sigma is not None else k_rot  # never read without HAS_SIGMA; any tensor stands in
    launch(
        _partial, (H, n_split, B),
        q_pad, maps_pad, freq,
        k_rot, sig, l_k, v_s, l_v,
        part_m, part_l, part_v, part_lv,
        S, per_split, scale * LOG2E,
        k_rot.stride(0), k_rot.stride(1), sig.stride(0), sig.stride(1), l_k.stride(0), l_k.stride(1),
        v_s.stride(0), v_s.stride(1), l_v.stride(0), l_v.stride(1), l_v.stride(2),
        H=H, DH=dh, R=r, HALF=HALF, DHP=DHP, RP=RP, BLOCK_S=block,
        HAS_SIGMA=sigma is not None, PRECISION=dot_precision(k_rot.dtype), DOT=dot_dtype(k_rot.dtype),
        num_warps=NUM_WARPS, num_stages=NUM_STAGES, do_not_specialize=VARYING,
    )  # fmt: skip
    mixed_v, mixed_lv = combine(part_m, part_l, part_v, part_lv)
    return mixed_v[..., :dh], mixed_lv[..., :r]
