"""A sixth attention written only for tests/model/test_registry.py: multi-head attention whose values are narrower
than its keys (d_v < d_h), with one knob of its own. It exists to prove that registering a variant is all it
takes for the generic suites, the cost table, the CLI and the analysis to cover it.

Also a pytest plugin (`-p tests.toy_attention`): loading it registers the toy before collection, so every
suite parametrised over the registry (tests/helpers.KINDS) collects a "toy" case.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from lightning_modules.core.errors import ConfigError
from lightning_modules.model.attention import register
from lightning_modules.model.attention.base import Attention
from lightning_modules.model.attention.cache import TIME, LayerCache
from lightning_modules.model.attention.kernel import attend
from lightning_modules.model.attention.knobs import knob
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.layers import RMSNorm, RotaryEmbedding

NAME = "toy"


@dataclass(frozen=True)
class NarrowValueKnobs:
    value_dim: int = knob("per-head value width d_v (<= head_dim)", minimum=1)


class NarrowValueAttention(Attention):
    Knobs = NarrowValueKnobs
    label_suffix = "v{value_dim}"
    decode_paths = ("kv",)

    @classmethod
    def default_knobs(cls, model: ModelConfig) -> dict[str, object]:
        return {"value_dim": model.head_dim // 2}

    @classmethod
    def validate(cls, model: ModelConfig, knobs: NarrowValueKnobs) -> None:
        if knobs.value_dim > model.head_dim:
            raise ConfigError(f"attention.value_dim={knobs.value_dim}: above head_dim {model.head_dim}")

    def __init__(self, model: ModelConfig, knobs: NarrowValueKnobs) -> None:
        super().__init__(model, knobs)
        self.n_head, self.head_dim, self.value_dim = model.n_head, model.head_dim, knobs.value_dim
        H, dh, dv = self.n_head, self.head_dim, self.value_dim
        self.qkv = nn.Linear(model.d_model, H * (2 * dh + dv), bias=False)
        self.out = nn.Linear(H * dv, model.d_model, bias=False)
        self.q_norm = RMSNorm(dh, model.norm_eps) if model.qk_norm else None
        self.k_norm = RMSNorm(dh, model.norm_eps) if model.qk_norm else None

    def _qkv(self, x: Tensor, rope: RotaryEmbedding, start: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        B, T, _ = x.shape
        H, dh, dv = self.n_head, self.head_dim, self.value_dim
        q, k, v = self.qkv(x).split([H * dh, H * dh, H * dv], dim=-1)
        q, k, v = q.view(B, T, H, dh), k.view(B, T, H, dh), v.view(B, T, H, dv)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return rope(q, start).transpose(1, 2), rope(k, start).transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: Tensor, rope: RotaryEmbedding) -> Tensor:
        B, T, _ = x.shape
        y = attend(*self._qkv(x, rope))  # (B, H, T, dv)
        return self.out(y.transpose(1, 2).reshape(B, T, self.n_head * self.value_dim))

    def cache_layout(self, path: str) -> dict[str, tuple[int, ...]]:
        return {"k": (self.n_head, TIME, self.head_dim), "v": (self.n_head, TIME, self.value_dim)}

    def decode(self, x: Tensor, rope: RotaryEmbedding, cache: LayerCache) -> Tensor:
        B, T, _ = x.shape
        q, k, v = self._qkv(x, rope, start=cache.length)
        held = cache.append(k=k, v=v)
        y = attend(q, held["k"], held["v"])
        return self.out(y.transpose(1, 2).reshape(B, T, self.n_head * self.value_dim))

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.qkv.weight, std=std)
        nn.init.normal_(self.out.weight, std=out_std)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                nn.init.ones_(norm.weight)

    def muon_blocks(self) -> dict[str, tuple[int, ...]]:
        H, dh, dv = self.n_head, self.head_dim, self.value_dim
        return {"qkv.weight": (H * dh, H * dh, H * dv)}

    @classmethod
    def score_dims(cls, model: ModelConfig, knobs: NarrowValueKnobs) -> tuple[int, int]:
        return model.head_dim, knobs.value_dim

    @classmethod
    def decode_flops_per_token(cls, model: ModelConfig, knobs: NarrowValueKnobs, context: int) -> int:
        return cls.train_matmul_flops_per_token(model, knobs) + 2 * context * model.n_head * (
            model.head_dim + knobs.value_dim
        )


def pytest_configure(config: object) -> None:
    """Plugin hook: register the toy once, before the test modules are collected."""
    register(NAME, NarrowValueAttention)
