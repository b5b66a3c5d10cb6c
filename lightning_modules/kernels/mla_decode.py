"""MLA's absorbed decode step as one Triton kernel (model/attention/mla.py, "absorbed"), as FlashMLA does it.

One program per (group of heads, range of cached positions, sequence): each block of the latent cache
[c ; k^R] is loaded once for the group and serves each of its heads, both as the key (scores q_h . [c ; k^R],
the query already through W^UK_h) and as the value (its first d_c columns). Online softmax in base 2, fp32 sums,
products in the cache's dtype with fp32 accumulation; split_kv.combine merges the programs.

The tile plan (`plan`) keeps a launch within an H100's 227 KB of shared memory at every size in conf/model/
(kernels/aot.py checks it): heads go in groups of 16 (tl.dot's smallest tile), so 6.3b's 32 heads are two
groups that read the cache block each from L2 after the first; a latent of 512 or wider takes blocks of 32
positions and 8 warps, so the (heads x d_c) fp32 accumulator stays in registers.
"""

import torch
import triton.language as tl
from torch import Tensor

from lightning_modules.kernels.split_kv import LOG2E, combine, splits
from lightning_modules.kernels.support import dot_dtype, dot_precision, launch, next_power_of_2

PROGRAMS = 264  # about two programs per SM of an H100 / H200 (132 SMs)
# Arguments that change as a generation grows: one compile serves every length.
VARYING = ("length", "per_split")
GROUP = 16  # heads per program at most


def plan(n_head: int, d_c: int) -> dict[str, int]:
    """Heads per program, positions per block, warps and pipeline stages for a latent of width d_c."""
    width = next_power_of_2(d_c)
    return {
        "HG": min(GROUP, next_power_of_2(n_head)),
        "BLOCK_S": 32 if width >= 512 else 64,
        "num_warps": 8 if width >= 512 else 4,
        "num_stages": 2,
    }


def _partial(
    q_ptr, latent_ptr, part_m_ptr, part_l_ptr, part_o_ptr,
    length, per_split, scale_log2e, s_b, s_s,
    DC: tl.constexpr, DR: tl.constexpr, HG: tl.constexpr, DCP: tl.constexpr,
    DRP: tl.constexpr, BLOCK_S: tl.constexpr, PRECISION: tl.constexpr,
    DOT: tl.constexpr,
) -> None:  # fmt: skip
    group = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)  # int64: B x max_len x (d_c + d_R) passes 2^31 in long contexts
    n_split = tl.num_programs(1)
    n_groups = tl.num_programs(0)
    g = tl.arange(0, HG)
    c = tl.arange(0, DCP)
    e = tl.arange(0, DRP)
    # The query, zero-padded by the host to (groups x HG) heads: its latent part (DCP, HG), RoPE part (DRP, HG).
    q_base = q_ptr + (b * n_groups + group) * (DCP + DRP) * HG
    q_c = tl.load(q_base + c[:, None] * HG + g[None, :]).to(DOT)
    q_r = tl.load(q_base + (DCP + e[:, None]) * HG + g[None, :]).to(DOT)
    m_i = tl.full([HG], float("-inf"), tl.float32)
    l_i = tl.zeros([HG], tl.float32)
    acc = tl.zeros([HG, DCP], tl.float32)
    n_blocks = tl.cdiv(length, BLOCK_S)
    first = split * per_split
    last = tl.minimum(first + per_split, n_blocks)
    for blk in range(first, last):
        t = blk * BLOCK_S + tl.arange(0, BLOCK_S)
        t_ok = t < length
        row = latent_ptr + b * s_b + t[:, None] * s_s
        lat_c = tl.load(row + c[None, :], mask=t_ok[:, None] & (c[None, :] < DC), other=0.0).to(DOT)
        lat_r = tl.load(row + DC + e[None, :], mask=t_ok[:, None] & (e[None, :] < DR), other=0.0).to(DOT)
        scores = tl.dot(lat_c, q_c, input_precision=PRECISION)
        scores = tl.dot(lat_r, q_r, acc=scores, input_precision=PRECISION)  # (BLOCK_S, HG)
        scores = tl.where(t_ok[:, None], scores * scale_log2e, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha[:, None] + tl.dot(tl.trans(p).to(DOT), lat_c, input_precision=PRECISION)
        m_i = m_new
    head = group * HG + g
    part = (b * n_split + split) * (n_groups * HG) + head
    tl.store(part_m_ptr + part, m_i)
    tl.store(part_l_ptr + part, l_i)
    tl.store(part_o_ptr + part[:, None] * DCP + c[None, :], acc)


def decode_step(
    q: Tensor, latent: Tensor, d_c: int, scale: float, block: int | None = None, programs: int = PROGRAMS
) -> Tensor:
    """q: (B, H, d_c + d_R), the absorbed query [q^C_h W^UK_h ; RoPE(q^R_h)]; latent: (B, S, d_c + d_R), the
    cache's held view. Returns the softmax mixture of the cached c per head, (B, H, d_c), fp32. `block`
    overrides the plan's positions per block (the tests use small ones to cover many blocks and splits)."""
    B, H, width = q.shape
    S, d_r = latent.shape[1], width - d_c
    if latent.stride(-1) != 1:
        raise ValueError("mla decode kernel: the latent cache must be contiguous in its last dim")
    tiles = plan(H, d_c)
    HG, planned_block = tiles.pop("HG"), tiles.pop("BLOCK_S")
    block = block or planned_block
    n_groups = -(-H // HG)
    DCP, DRP = next_power_of_2(d_c), next_power_of_2(d_r)
    f32 = dict(device=q.device, dtype=torch.float32)
    q_pad = torch.zeros(B, n_groups * HG, DCP + DRP, **f32)
    q_pad[:, :H, :d_c] = q[..., :d_c]
    q_pad[:, :H, DCP : DCP + d_r] = q[..., d_c:]
    # (B, groups, DCP + DRP, HG): each group's query columns contiguous, as the kernel's q_c and q_r tiles read.
    q_pad = q_pad.view(B, n_groups, HG, DCP + DRP).transpose(2, 3).contiguous()
    n_split, per_split = splits(S, block, B * n_groups, programs)
    part_m = torch.empty(B, n_split, n_groups * HG, **f32)
    part_l = torch.empty(B, n_split, n_groups * HG, **f32)
    part_o = torch.empty(B, n_split, n_groups * HG, DCP, **f32)
    launch(
        _partial, (n_groups, n_split, B),
        q_pad, latent, part_m, part_l, part_o,
        S, per_split, scale * LOG2E, latent.stride(0), latent.stride(1),
        DC=d_c, DR=d_r, HG=HG, DCP=DCP, DRP=DRP, BLOCK_S=block,
        PRECISION=dot_precision(latent.dtype), DOT=dot_dtype(latent.dtype), do_not_specialize=VARYING, **tiles,
    )  # fmt: skip
    (mixed,) = combine(part_m, part_l, part_o)
    return mixed[:, :H, :d_c]
