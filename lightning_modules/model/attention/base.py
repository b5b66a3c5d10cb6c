"""The interface every attention variant implements.

A variant maps (B, T, d) to (B, T, d) causally, built from a size and its own typed knobs (a frozen
dataclass `Knobs`, resolved by attention/registry.py). It also reports what it costs without being built
for real: parameters and cached elements are read from the module's own shapes, built on the meta device;
FLOPs are hand formulas, checked against torch's FLOP counter (docs/costs.md).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lightning_modules.core.errors import ConfigError
from lightning_modules.model.attention.cache import TIME, LayerCache
from lightning_modules.model.attention.knobs import KnobSpec, NoKnobs, specs
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.layers import RotaryEmbedding

REGISTERED_AS = "_registered_as"  # the class attribute holding the name a class is registered under


class Attention(nn.Module):
    """Base class: subclasses declare `Knobs`, implement forward, decode and the FLOP class methods."""

    # The variant's knobs: a frozen dataclass whose fields are declared with attention.knobs.knob().
    Knobs: ClassVar[type] = NoKnobs
    # Appended to the kind in run names and tables, formatted with the knobs, e.g. "r{rank}" -> lrkv-r8.
    label_suffix: ClassVar[str] = ""
    # Matplotlib line style of the variant in every figure (lightning_modules/analysis/styles.py).
    plot_style: ClassVar[dict[str, str]] = {}
    # The knob that picks between training paths computing the same function, if any (benchmarks time each).
    train_path_knob: ClassVar[str | None] = None
    # Decode paths a variant offers; the first is the default, the one lightning_modules/costs/counts.py counts. The others exist so
    # that tests can check the default against a plainer computation (e.g. mla "absorbed" vs "rebuilt").
    decode_paths: ClassVar[tuple[str, ...]] = ()
    # The fused Triton kernel the default decode path runs for one new token, if any (a name in
    # lightning_modules/kernels/support.py's KERNELS; benchmarks time such a path with and without it).
    fused_decode_kernel: ClassVar[str | None] = None

    def __init__(self, model: ModelConfig, knobs: Any) -> None:
        super().__init__()
        self.model_config = model
        self.knobs = knobs

    @classmethod
    def kind(cls) -> str:
        """The name this class is registered under (its class name if it is not registered). The registry
        writes the name into the class it registers (attention/registry.py `register`), so this module needs
        nothing from the registry."""
        return cls.__dict__.get(REGISTERED_AS, cls.__name__)

    # ----- configuration -------------------------------------------------------------------------
    @classmethod
    def knob_specs(cls) -> tuple[KnobSpec, ...]:
        return specs(cls.Knobs)

    @classmethod
    def train_paths(cls) -> dict[str, dict[str, str]]:
        """{label suffix: knob override} for every training path ({"": {}} for a variant with one)."""
        if cls.train_path_knob is None:
            return {"": {}}
        (spec,) = [s for s in cls.knob_specs() if s.name == cls.train_path_knob]
        return {f" ({c})": {spec.name: c} for c in spec.choices or ()}

    @classmethod
    def default_knobs(cls, model: ModelConfig) -> dict[str, object]:
        """Values for knobs that neither the attention config nor the size set."""
        return {}

    @classmethod
    def validate(cls, model: ModelConfig, knobs: Any) -> None:
        """Checks of resolved knobs against the size; raise ConfigError naming the field. Types, choices and
        minimums are already checked from the Knobs declaration."""

    @classmethod
    def rope_dim(cls, model: ModelConfig, knobs: Any) -> int:
        return model.head_dim

    # ----- costs, per layer ----------------------------------------------------------------------
    @classmethod
    def on_meta(cls, model: ModelConfig, knobs: Any) -> Attention:
        """The layer built on the meta device: real shapes, no memory, no initialisation cost."""
        with torch.device("meta"):
            return cls(model, knobs)

    @classmethod
    def param_counts(cls, model: ModelConfig, knobs: Any) -> tuple[int, int]:
        """(parameters in matrix products, other parameters such as norm gains), from the built shapes: a
        parameter of two or more dimensions is multiplied by every token, a vector is a gain."""
        params = list(cls.on_meta(model, knobs).parameters())
        return sum(p.numel() for p in params if p.ndim >= 2), sum(p.numel() for p in params if p.ndim < 2)

    @classmethod
    def train_matmul_flops_per_token(cls, model: ModelConfig, knobs: Any) -> int:
        """Forward FLOPs per token of the matrix products on the training path, attention scores excluded.
        For a plain projection this is 2 x its weights."""
        return 2 * cls.param_counts(model, knobs)[0]

    @classmethod
    def per_forward_flops(cls, model: ModelConfig, knobs: Any) -> int:
        """Forward FLOPs spent once per forward pass whatever its token count (e.g. building weights)."""
        return 0

    @classmethod
    def score_dims(cls, model: ModelConfig, knobs: Any) -> tuple[int, int]:
        """(d_qk, d_v): per-head widths of the q.k scores and of the value mixing."""
        return model.head_dim, model.head_dim

    @classmethod
    def cache_elements_per_token(cls, model: ModelConfig, knobs: Any) -> int:
        """Elements the default decode path caches per token and layer, read from its cache layout."""
        layout = cls.on_meta(model, knobs).cache_layout(cls.decode_paths[0])
        return sum(math.prod(n for n in shape if n != TIME) for shape in layout.values())

    @classmethod
    def extra_costs(cls, model: ModelConfig, knobs: Any) -> dict[str, float]:
        """Variant-specific columns of the cost row (e.g. a paper's other counting convention)."""
        return {}

    @classmethod
    def decode_flops_per_token(cls, model: ModelConfig, knobs: Any, context: int) -> int:
        """Forward FLOPs of this layer's attention for one new token attending to `context` positions
        (itself included), on the path the decoder runs."""
        raise NotImplementedError

    def forward(self, x: Tensor, rope: RotaryEmbedding) -> Tensor:
        raise NotImplementedError

    # ----- decoding with a cache passed in ---------------------------------------------------------
    def cache_layout(self, path: str) -> dict[str, tuple[int, ...]]:
        """What `path` caches per token: buffer name -> per-token shape. Its total size is what
        cache_elements_per_token predicts for the default path (tests/model/test_decode.py)."""
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
                f"decode path {path!r} not offered by attention {self.kind()!r}; "
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
