"""The decode cache of one attention layer: named buffers preallocated to a maximum length.

Caches are passed in, never stored on modules (DESIGN.md "The attention family"), so one model can serve
several generations at once and the training forward stays untouched. Each variant says what it caches
per token (`Attention.cache_layout`); this class only allocates, appends and counts. A buffer is
(B, max_len, *per_token_shape): time on dim 1, like the (B, T, heads, dim) layout of the layers.
Preallocation (rather than torch.cat per step) keeps a step free of copies of the whole cache, and makes
the bytes held a fixed, measurable quantity: sum of the buffers' nbytes = elements per token x max_len.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LayerCache:
    """buffers: name -> (B, max_len, *shape); path: which decode path filled it (a variant may have several,
    e.g. mla "absorbed" and "rebuilt"); length: positions 0 .. length - 1 are filled."""

    buffers: dict[str, Tensor]
    path: str
    length: int = 0

    @classmethod
    def allocate(
        cls,
        layout: dict[str, tuple[int, ...]],
        batch: int,
        max_len: int,
        path: str,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> LayerCache:
        buffers = {
            name: torch.zeros(batch, max_len, *shape, device=device, dtype=dtype)
            for name, shape in layout.items()
        }
        return cls(buffers, path)

    @property
    def max_len(self) -> int:
        return next(iter(self.buffers.values())).shape[1]

    def append(self, **new: Tensor) -> dict[str, Tensor]:
        """Write T new positions into every buffer after the filled ones; return each buffer's filled prefix
        (B, length + T, *shape) as a view. Every buffer must be given, with the same T."""
        if set(new) != set(self.buffers):
            raise KeyError(f"append needs exactly {sorted(self.buffers)}, got {sorted(new)}")
        T = next(iter(new.values())).shape[1]
        end = self.length + T
        if end > self.max_len:
            raise ValueError(
                f"cache full: {self.length} positions held + {T} new > max_len {self.max_len}; "
                "allocate the cache for the whole generation (prompt + new tokens)"
            )
        for name, value in new.items():
            self.buffers[name][:, self.length : end] = value
        self.length = end
        return {name: buffer[:, :end] for name, buffer in self.buffers.items()}

    def nbytes(self) -> int:
        """Bytes the cache holds (allocated, whether filled or not)."""
        return sum(b.nbytes for b in self.buffers.values())

    def elements_per_token(self) -> int:
        return sum(math.prod(b.shape[2:]) for b in self.buffers.values())


def caches_nbytes(caches: list[LayerCache]) -> int:
    return sum(c.nbytes() for c in caches)
