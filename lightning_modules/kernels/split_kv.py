"""The combine step of a split-KV decode: each program of a kernel attends to one range of cached positions
and leaves its running max m (base 2), its sum l of exp2(s - m) and its unnormalised outputs; the exact softmax
over all positions is their log-sum-exp merge, done here in fp32."""

from __future__ import annotations

import math

import torch
from torch import Tensor

LOG2E = 1.0 / math.log(2.0)  # kernels use exp2(s * log2(e)) = exp(s)


def splits(n_positions: int, block: int, batch: int, target_programs: int) -> tuple[int, int]:
    """(splits, blocks per split): enough programs (batch x splits) to fill the device, every split holding at
    least one block of real positions, so no split's max is -inf."""
    n_blocks = max(1, -(-n_positions // block))
    wanted = max(1, min(n_blocks, -(-target_programs // max(1, batch))))
    per_split = -(-n_blocks // wanted)
    return -(-n_blocks // per_split), per_split


def combine(part_m: Tensor, part_l: Tensor, *parts: Tensor) -> list[Tensor]:
    """part_m, part_l: (B, splits, H); each of parts: (B, splits, H, n). Returns each part merged and normalised,
    (B, H, n)."""
    m = part_m.amax(dim=1, keepdim=True)
    weight = torch.exp2(part_m - m)  # (B, splits, H)
    total = (weight * part_l).sum(dim=1)  # (B, H)
    return [(weight.unsqueeze(-1) * p).sum(dim=1) / total.unsqueeze(-1) for p in parts]
