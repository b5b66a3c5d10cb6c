"""The decode cache of one attention layer: named buffers preallocated to a maximum length.

Caches are passed in, never stored on modules (docs/attentions.md), so one model can serve
several generations at once and the training forward stays untouched. Each variant says what it caches
per token (`Attention.cache_layout`); this class only allocates, appends and counts. A layout gives each
buffer's shape without the batch, with TIME where the positions go: (G, TIME, dh) is a (B, G, max_len, dh)
buffer, head-major, which the attention kernels read without a copy ((TIME, G, dh) would be strided).
Preallocation (rather than torch.cat per step) keeps a step free of copies of the whole cache, and makes
the bytes held a fixed, measurable quantity: sum of the buffers' nbytes = elements per token x max_len.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

TIME = -1  # marks the time axis in a cache layout


@dataclass
class LayerCache:
    """buffers: name -> (B, *shape) with max_len at the buffer's time dim; path: which decode path filled it (a
    variant may have several, e.g. mla "absorbed" and "rebuilt"); length: positions 0 .. length - 1 are filled."""

    buffers: dict[str, Tensor]
    time_dims: dict[str, int]
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
        buffers, time_dims = {}, {}
        for name, shape in layout.items():
            if shape.count(TIME) != 1:
                raise ValueError(f"cache layout {name}={shape}: needs exactly one TIME axis")
            size = [max_len if n == TIME else n for n in shape]
            buffers[name] = torch.zeros(batch, *size, device=device, dtype=dtype)
            time_dims[name] = 1 + shape.index(TIME)
        return cls(buffers, time_dims, path)

    @property
    def max_len(self) -> int:
        name = next(iter(self.buffers))
        return self.buffers[name].shape[self.time_dims[name]]

    def append(self, **new: Tensor) -> dict[str, Tensor]:
        """Write T new positions into every buffer after the filled ones (each value shaped like its buffer,
        with T at the time dim); return each buffer's filled prefix, length + T positions, as a view.
        Every buffer must be given, with the same T."""
        if set(new) != set(self.buffers):
            raise KeyError(f"append needs exactly {sorted(self.buffers)}, got {sorted(new)}")
        name = next(iter(new))
        T = new[name].shape[self.time_dims[name]]
        end = self.length + T
        if end > self.max_len:
            raise ValueError(
                f"cache full: {self.length} positions held + {T} new > max_len {self.max_len}; "
                "allocate the cache for the whole generation (prompt + new tokens)"
            )
        for name, value in new.items():
            self.buffers[name].narrow(self.time_dims[name], self.length, T).copy_(value)
        self.length = end
        return {name: b.narrow(self.time_dims[name], 0, end) for name, b in self.buffers.items()}

    def nbytes(self) -> int:
        """Bytes the cache holds (allocated, whether filled or not)."""
        return sum(b.nbytes for b in self.buffers.values())

    def elements_per_token(self) -> int:
        return sum(b[0].numel() // self.max_len for b in self.buffers.values())


def caches_nbytes(caches: list[LayerCache]) -> int:
    return sum(c.nbytes() for c in caches)
