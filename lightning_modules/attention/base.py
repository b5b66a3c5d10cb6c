"""The interface every attention variant implements.

A variant maps (B, T, d) to (B, T, d) causally. It also reports, from the config alone and without being
built, what it costs: its parameters, the weights each token multiplies by, the head dims of its scores and
mixing, and the elements it caches per token (DESIGN.md, "The attention family" and "Costs").
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from lightning_modules.attention.cache import LayerCache
from lightning_modules.config import AttentionConfig, ConfigError, ModelConfig
from lightning_modules.layers import RotaryEmbedding


class Attention(nn.Module):
    """Base class: subclasses set `knobs`, implement forward and the cost class methods."""

    knobs: ClassVar[frozenset[str]] = frozenset()
    # Decode paths a variant offers; the first is the default, the one costs.py counts. The others exist so
    # that tests can check the default against a plainer computation (e.g. mla "absorbed" vs "rebuilt").
    decode_paths: ClassVar[tuple[str, ...]] = ()

    def __init__(self, model: ModelConfig, attention: AttentionConfig) -> None:
        super().__init__()
        self.model_config = model
        self.config = attention

    # ----- configuration -------------------------------------------------------------------------
    @classmethod
    def default_knobs(cls, model: ModelConfig) -> dict[str, object]:
        """Values for knobs that neither the attention config nor the size set."""
        return {}

    @classmethod
    def validate(cls, model: ModelConfig, attention: AttentionConfig) -> None:
        """Checks of a resolved attention config against the size; raise ConfigError naming the field."""

    @classmethod
    def rope_dim(cls, model: ModelConfig, attention: AttentionConfig) -> int:
        return model.head_dim

    # ----- costs, per layer, from the config alone ----------------------------------------------
    @classmethod
    def param_counts(cls, model: ModelConfig, attention: AttentionConfig) -> tuple[int, int]:
        """(parameters in matrix products, other parameters such as norm gains)."""
        raise NotImplementedError

    @classmethod
    def train_matmul_flops_per_token(cls, model: ModelConfig, attention: AttentionConfig) -> int:
        """Forward FLOPs per token of the matrix products on the training path, attention scores excluded.
        For a plain projection this is 2 x its weights."""
        return 2 * cls.param_counts(model, attention)[0]

    @classmethod
    def per_forward_flops(cls, model: ModelConfig, attention: AttentionConfig) -> int:
        """Forward FLOPs spent once per forward pass whatever its token count (e.g. building weights)."""
        return 0

    @classmethod
    def score_dims(cls, model: ModelConfig, attention: AttentionConfig) -> tuple[int, int]:
        """(d_qk, d_v): per-head widths of the q.k scores and of the value mixing."""
        return model.head_dim, model.head_dim

    @classmethod
    def cache_elements_per_token(cls, model: ModelConfig, attention: AttentionConfig) -> int:
        raise NotImplementedError

    @classmethod
    def decode_flops_per_token(cls, model: ModelConfig, attention: AttentionConfig, context: int) -> int:
        """Forward FLOPs of this layer's attention for one new token attending to `context` positions
        (itself included), on the path the decoder runs."""
        raise NotImplementedError

    def forward(self, x: Tensor, rope: RotaryEmbedding) -> Tensor:
        raise NotImplementedError

    # ----- decoding with a cache passed in ---------------------------------------------------------
    def cache_layout(self, path: str) -> dict[str, tuple[int, ...]]:
        """What `path` caches per token: buffer name -> per-token shape. Its total size is what
        cache_elements_per_token predicts for the default path (tests/test_decode.py)."""
        raise NotImplementedError

    def new_cache(
        self,
        batch: int,
        max_len: int,
        path: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> LayerCache:
        """An empty cache for `batch` sequences of up to `max_len` positions (prompt + new tokens), on the
        module's device and in its dtype unless told otherwise."""
        path = path or self.decode_paths[0]
        if path not in self.decode_paths:
            raise ValueError(
                f"decode path {path!r} not offered by attention {self.config.kind!r}; "
                f"allowed: {', '.join(self.decode_paths)}"
            )
        weight = next(self.parameters())
        return LayerCache.allocate(
            self.cache_layout(path), batch, max_len, path, device or weight.device, dtype or weight.dtype
        )

    def decode(self, x: Tensor, rope: RotaryEmbedding, cache: LayerCache) -> Tensor:
        """x: (B, T, d), the inputs of T new tokens at positions cache.length .. cache.length + T - 1
        (T > 1 for a prefill, 1 for a step). Appends them to `cache` and returns (B, T, d), equal to what
        forward gives at those positions over the whole sequence."""
        raise NotImplementedError

    def init_weights(self, std: float, out_std: float) -> None:
        """Initialise in place: input projections with `std`, the output projection with `out_std`."""
        raise NotImplementedError

    def muon_blocks(self) -> dict[str, tuple[int, ...]]:
        """Row splits of fused weights into their logical matrices, {parameter name: sizes along dim 0}.
        Muon orthogonalises each logical matrix on its own (optim/muon.py), so fusing projections into
        one product for speed never changes the optimiser's update."""
        return {}


def check_divides(field: str, value: int, n_head: int) -> None:
    if value > n_head or n_head % value:
        allowed = [g for g in range(1, n_head + 1) if n_head % g == 0]
        raise ConfigError(f"{field}={value} must divide model.n_head={n_head}; allowed: {allowed}")


def check_even(field: str, value: int) -> None:
    if value % 2:
        raise ConfigError(f"{field}={value}: RoPE needs an even dimension")
