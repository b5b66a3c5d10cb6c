"""The decoder's building blocks other than attention: RMSNorm, RoPE and the ReLU^2 MLP (nanochat style,
docs/paper-errata.md, "Recipe": pre-norm RMSNorm, RoPE, ReLU^2 MLP of width 4d, no biases)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension with a learnable gain (no bias)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # The gain follows x's dtype so bf16 activations take the fused kernel under autocast.
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE) over the last dimension, rotating pairs (i, i + dim/2).

    cos/sin tables are non-persistent buffers: they are recomputed, never checkpointed, and carry no
    parameters (the cost model counts none).
    """

    def __init__(self, dim: int, max_seq_len: int, base: float = 10000.0) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"RoPE dimension must be even, got {dim}")
        self.dim = dim
        self.base = base
        self.max_seq_len = max_seq_len
        cos, sin = self._tables(max_seq_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        # [cos | sin] side by side, (max_seq_len, dim): the basis LRKV's decode scores against every step
        # (model/attention/lrkv_cached.py), kept so a step reads a view instead of concatenating per layer.
        self.register_buffer("basis", torch.cat([cos, sin], dim=-1), persistent=False)

    def inv_freq(self, device: torch.device | None = None) -> Tensor:
        """theta_i = base^(-2i / dim), fp32: the angle of pair i at position t is t * theta_i."""
        return 1.0 / (
            self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float32, device=device) / self.dim)
        )

    def _tables(self, length: int, device: torch.device | None = None) -> tuple[Tensor, Tensor]:
        angles = torch.outer(torch.arange(length, dtype=torch.float32, device=device), self.inv_freq(device))
        return angles.cos(), angles.sin()

    def tables(self, end: int) -> tuple[Tensor, Tensor]:
        """fp32 cos and sin, (end or more, dim/2), for positions 0 .. end - 1: the stored tables, or longer ones
        computed the same way when a generation runs past max_seq_len."""
        if end > self.cos.shape[0]:
            return self._tables(end, self.cos.device)
        return self.cos, self.sin

    def basis_table(self, end: int) -> Tensor:
        """[cos | sin] for positions 0 .. end - 1, (end, dim): a view of the stored one, or computed when a
        generation runs past max_seq_len."""
        if end > self.basis.shape[0]:
            return torch.cat(self._tables(end, self.basis.device), dim=-1)
        return self.basis[:end]

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """x: (B, T, heads, dim), positions start .. start + T - 1."""
        T = x.shape[1]
        cos, sin = self.tables(start + T)
        cos = cos[start : start + T, None, :].to(x.dtype)  # (T, 1, dim/2), broadcast over batch and heads
        sin = sin[start : start + T, None, :].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class MLP(nn.Module):
    """Two bias-free projections with a squared ReLU between them (Primer / nanochat)."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, hidden, bias=False)
        self.proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.relu(self.fc(x)).square())
