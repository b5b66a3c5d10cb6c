"""MLA's absorbed decode step as one Triton kernel (model/attention/mla.py, "absorbed"), as FlashMLA does it.

One program per (sequence, range of cached positions), all H heads together: each block of the latent cache
[c ; k^R] is loaded once and serves every head, both as the key (scores q_h . [c ; k^R], the query already
through W^UK_h) and as the value (its first d_c columns). Online softmax in base 2, fp32 sums, products in the
cache's dtype with fp32 accumulation (IEEE fp32 for an fp32 cache); split_kv.combine merges the programs.
"""

import torch
import triton.language as tl
from torch import Tensor

from lightning_modules.kernels.split_kv import LOG2E, combine, splits
from lightning_modules.kernels.support import dot_dtype, dot_precision, launch, next_power_of_2

BLOCK = 64
PROGRAMS = 264


def _partial(
    q_ptr, latent_ptr, part_m_ptr, part_l_ptr, part_o_ptr,
    length, scale_log2e, s_b, s_s,
    DC: tl.constexpr, DR: tl.constexpr, HP: tl.constexpr, DCP: tl.constexpr, DRP: tl.constexpr,
    BLOCK_S: tl.constexpr, PER_SPLIT: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr,
) -> None:  # fmt: skip
    b = tl.program_id(0)
    split = tl.program_id(1)
    n_split = tl.num_programs(1)
    h = tl.arange(0, HP)
    c = tl.arange(0, DCP)
    e = tl.arange(0, DRP)
    # The query, padded by the host: its latent part (DCP, HP) and its RoPE part (DRP, HP).
    q_c = tl.load(q_ptr + b * (DCP + DRP) * HP + c[:, None] * HP + h[None, :]).to(DOT)
    q_r = tl.load(q_ptr + b * (DCP + DRP) * HP + (DCP + e[:, None]) * HP + h[None, :]).to(DOT)
    m_i = tl.full([HP], float("-inf"), tl.float32)
    l_i = tl.zeros([HP], tl.float32)
    acc = tl.zeros([HP, DCP], tl.float32)
    n_blocks = tl.cdiv(length, BLOCK_S)
    first = split * PER_SPLIT
    last = tl.minimum(first + PER_SPLIT, n_blocks)
    for blk in range(first, last):
        t = blk * BLOCK_S + tl.arange(0, BLOCK_S)
        t_ok = t < length
        row = latent_ptr + b * s_b + t[:, None] * s_s
        lat_c = tl.load(row + c[None, :], mask=t_ok[:, None] & (c[None, :] < DC), other=0.0).to(DOT)
        lat_r = tl.load(row + DC + e[None, :], mask=t_ok[:, None] & (e[None, :] < DR), other=0.0).to(DOT)
        scores = tl.dot(lat_c, q_c, input_precision=PRECISION)
        scores += tl.dot(lat_r, q_r, input_precision=PRECISION)  # (BLOCK_S, HP)
        scores = tl.where(t_ok[:, None], scores * scale_log2e, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha[:, None] + tl.dot(tl.trans(p).to(DOT), lat_c, input_precision=PRECISION)
        m_i = m_new
    part = b * n_split + split
    tl.store(part_m_ptr + part * HP + h, m_i)
    tl.store(part_l_ptr + part * HP + h, l_i)
    tl.store(part_o_ptr + part * HP * DCP + h[:, None] * DCP + c[None, :], acc)


def decode_step(
    q: Tensor, latent: Tensor, d_c: int, scale: float, block: int = BLOCK, programs: int = PROGRAMS
) -> Tensor:
    """q: (B, H, d_c + d_R), the absorbed query [q^C_h W^UK_h ; RoPE(q^R_h)]; latent: (B, S, d_c + d_R), the
    cache's held view. Returns the softmax mixture of the cached c per head, (B, H, d_c), fp32."""
    B, H, width = q.shape
    S, d_r = latent.shape[1], width - d_c
    if latent.stride(-1) != 1:
        raise ValueError("mla decode kernel: the latent cache must be contiguous in its last dim")
    HP, DCP, DRP = next_power_of_2(H), next_power_of_2(d_c), next_power_of_2(d_r)
    f32 = dict(device=q.device, dtype=torch.float32)
    q_pad = torch.zeros(B, DCP + DRP, HP, **f32)
    q_pad[:, :d_c, :H] = q[..., :d_c].transpose(1, 2)
    q_pad[:, DCP : DCP + d_r, :H] = q[..., d_c:].transpose(1, 2)
    n_split, per_split = splits(S, block, B, programs)
    part_m = torch.empty(B, n_split, HP, **f32)
    part_l = torch.empty(B, n_split, HP, **f32)
    part_o = torch.empty(B, n_split, HP, DCP, **f32)
    launch(
        _partial, (B, n_split),
        q_pad, latent, part_m, part_l, part_o,
        S, scale * LOG2E, latent.stride(0), latent.stride(1),
        DC=d_c, DR=d_r, HP=HP, DCP=DCP, DRP=DRP, BLOCK_S=block, PER_SPLIT=per_split,
        PRECISION=dot_precision(latent.dtype), DOT=dot_dtype(latent.dtype),
    )  # fmt: skip
    (mixed,) = combine(part_m, part_l, part_o)
    return mixed[:, :H, :d_c]
