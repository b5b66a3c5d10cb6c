"""Multi-head, grouped-query and multi-query attention: one class with a number of KV heads G.

Head h uses kv head h // (H / G). MHA is G = H, MQA is G = 1 (DESIGN.md table). K and V are never repeated
to H heads: the kernel takes grouped heads natively (kernel.attend).
"""

from __future__ import annotations

from torch import Tensor, nn

from lightning_modules.attention.base import Attention, check_divides
from lightning_modules.attention.cache import TIME, LayerCache
from lightning_modules.attention.kernel import attend
from lightning_modules.config import AttentionConfig, ModelConfig
from lightning_modules.layers import RMSNorm, RotaryEmbedding


class GroupedQueryAttention(Attention):
    knobs = frozenset({"n_kv_heads"})
    decode_paths = ("kv",)  # K (after QK-norm and RoPE) and V per kv head

    @classmethod
    def kv_heads(cls, model: ModelConfig, attention: AttentionConfig) -> int:
        assert attention.n_kv_heads is not None, "resolve_attention fills n_kv_heads"
        return attention.n_kv_heads

    @classmethod
    def default_knobs(cls, model: ModelConfig) -> dict[str, object]:
        return {"n_kv_heads": model.n_head // 2 if model.n_head % 2 == 0 else 1}

    @classmethod
    def validate(cls, model: ModelConfig, attention: AttentionConfig) -> None:
        if "n_kv_heads" in cls.knobs:
            check_divides("attention.n_kv_heads", cls.kv_heads(model, attention), model.n_head)

    def __init__(self, model: ModelConfig, attention: AttentionConfig) -> None:
        super().__init__(model, attention)
        self.n_head, self.head_dim = model.n_head, model.head_dim
        self.n_kv = self.kv_heads(model, attention)
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
    def param_counts(cls, model: ModelConfig, attention: AttentionConfig) -> tuple[int, int]:
        d, H, dh, G = model.d_model, model.n_head, model.head_dim, cls.kv_heads(model, attention)
        matmul = d * (H + 2 * G) * dh + H * dh * d
        return matmul, (2 * dh if model.qk_norm else 0)

    @classmethod
    def cache_elements_per_token(cls, model: ModelConfig, attention: AttentionConfig) -> int:
        return 2 * cls.kv_heads(model, attention) * model.head_dim

    @classmethod
    def decode_flops_per_token(cls, model: ModelConfig, attention: AttentionConfig, context: int) -> int:
        """The new token's projections (as in training) + q.k and mixing over `context` cached positions."""
        H, dh = model.n_head, model.head_dim
        return cls.train_matmul_flops_per_token(model, attention) + 2 * context * H * 2 * dh


class MultiHeadAttention(GroupedQueryAttention):
    knobs = frozenset()

    @classmethod
    def kv_heads(cls, model: ModelConfig, attention: AttentionConfig) -> int:
        return model.n_head

    @classmethod
    def default_knobs(cls, model: ModelConfig) -> dict[str, object]:
        return {}


class MultiQueryAttention(GroupedQueryAttention):
    knobs = frozenset()

    @classmethod
    def kv_heads(cls, model: ModelConfig, attention: AttentionConfig) -> int:
        return 1

    @classmethod
    def default_knobs(cls, model: ModelConfig) -> dict[str, object]:
        return {}
