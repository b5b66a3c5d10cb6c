"""Multi-head, grouped-query and multi-query attention: one class with a number of KV heads G.

Head h uses kv head h // (H / G). MHA is G = H, MQA is G = 1 (docs/attentions.md). K and V are never repeated
to H heads: the kernel takes grouped heads natively (kernel.attend).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from lightning_modules.model.attention.base import Attention, check_divides
from lightning_modules.model.attention.cache import TIME, LayerCache
from lightning_modules.model.attention.kernel import attend
from lightning_modules.model.attention.knobs import NoKnobs, knob
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.layers import RMSNorm, RotaryEmbedding


@dataclass(frozen=True)
class GroupedQueryKnobs:
    n_kv_heads: int = knob("number of key/value heads G; must divide n_head", minimum=1)


class GroupedQueryAttention(Attention):
    Knobs = GroupedQueryKnobs
    label_suffix = "g{n_kv_heads}"
    plot_style = {"color": "tab:orange", "linestyle": "--"}  # the sharing baselines dashed
    decode_paths = ("kv",)  # K (after QK-norm and RoPE) and V per kv head

    @classmethod
    def kv_heads(cls, model: ModelConfig, knobs: Any) -> int:
        return knobs.n_kv_heads

    @classmethod
    def default_knobs(cls, model: ModelConfig) -> dict[str, object]:
        return {"n_kv_heads": model.n_head // 2 if model.n_head % 2 == 0 else 1}

    @classmethod
    def validate(cls, model: ModelConfig, knobs: Any) -> None:
        check_divides("attention.n_kv_heads", cls.kv_heads(model, knobs), model.n_head)

    def __init__(self, model: ModelConfig, knobs: Any) -> None:
        super().__init__(model, knobs)
        self.n_head, self.head_dim = model.n_head, model.head_dim
        self.n_kv = self.kv_heads(model, knobs)
        d, H, G, dh = model.d_model, self.n_head, self.n_kv, self.head_dim
        self.qkv = nn.Linear(d, (H + 2 * G) * dh, bias=False)  # fused: one product for q, k, v
        self.out = nn.Linear(H * dh, d, bias=False)
        self.q_norm = RMSNorm(dh, model.norm_eps) if model.qk_norm else None
        self.k_norm = RMSNorm(dh, model.norm_eps) if model.qk_norm else None

    def _qkv(self, x: Tensor, rope: RotaryEmbedding, start: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, T, H, dh), k and v (B, T, G, dh) at positions start .., after QK-norm and RoPE."""
        B, T, _ = x.shape
        H, G, dh = self.n_head, self.n_kv, self.head_dim
        q, k, v = self.qkv(x).split([H * dh, G * dh, G * dh], dim=-1)
        q, k, v = q.view(B, T, H, dh), k.view(B, T, G, dh), v.view(B, T, G, dh)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return rope(q, start), rope(k, start), v

    def forward(self, x: Tensor, rope: RotaryEmbedding) -> Tensor:
        B, T, _ = x.shape
        q, k, v = self._qkv(x, rope)
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # (B, H, T, dh)
        return self.out(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))

    def cache_layout(self, path: str) -> dict[str, tuple[int, ...]]:
        return {"k": (self.n_kv, TIME, self.head_dim), "v": (self.n_kv, TIME, self.head_dim)}

    def decode(self, x: Tensor, rope: RotaryEmbedding, cache: LayerCache) -> Tensor:
        B, T, _ = x.shape
        q, k, v = self._qkv(x, rope, start=cache.length)
        held = cache.append(k=k.transpose(1, 2), v=v.transpose(1, 2))  # (B, G, S, dh), S = positions held
        y = attend(q.transpose(1, 2), held["k"], held["v"])  # (B, H, T, dh)
        return self.out(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.qkv.weight, std=std)
        nn.init.normal_(self.out.weight, std=out_std)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                nn.init.ones_(norm.weight)

    def muon_blocks(self) -> dict[str, tuple[int, ...]]:
        H, G, dh = self.n_head, self.n_kv, self.head_dim
        return {"qkv.weight": (H * dh, G * dh, G * dh)}

    @classmethod
    def decode_flops_per_token(cls, model: ModelConfig, knobs: Any, context: int) -> int:
        """The new token's projections (as in training) + q.k and mixing over `context` cached positions."""
        H, dh = model.n_head, model.head_dim
        return cls.train_matmul_flops_per_token(model, knobs) + 2 * context * H * 2 * dh


class MultiHeadAttention(GroupedQueryAttention):
    Knobs = NoKnobs
    label_suffix = ""
    plot_style = {"color": "tab:blue", "linestyle": "-"}  # a per-head cache: solid

    @classmethod
    def kv_heads(cls, model: ModelConfig, knobs: Any) -> int:
        return model.n_head

    @classmethod
    def default_knobs(cls, model: ModelConfig) -> dict[str, object]:
        return {}

    @classmethod
    def validate(cls, model: ModelConfig, knobs: Any) -> None:
        pass


class MultiQueryAttention(MultiHeadAttention):
    plot_style = {"color": "tab:green", "linestyle": "--"}

    @classmethod
    def kv_heads(cls, model: ModelConfig, knobs: Any) -> int:
        return 1
