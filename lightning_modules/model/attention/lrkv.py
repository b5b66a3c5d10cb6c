"""Low-rank key-value attention (LRKV; docs/attentions.md, "lrkv").

Per layer one shared key and one shared value projection W^K_s, W^V_s (d -> d_h) and per head a low-rank
residual: k_h = x W^K_s + (x U^K_h) (B^K_h)^T with U^K_h in R^{d x r}, B^K_h in R^{d_h x r}; values alike.
Queries and the output projection are ordinary per-head MHA. r = 0 would be MQA; r = d_h can express any
MHA layer.

Two training paths compute the same function (tests check it):
- factorized: x W_s and the latents x U (one fused product with q), then B_h per head;
- materialized: W_h = W_s + U_h B_h^T for every head once per forward, then one MHA-sized product.
The FLOP count follows the path that runs (lightning_modules/costs/counts.py); benchmarks/train_throughput.py measures both.

Decoding (docs/attentions.md, "lrkv"; docs/paper-errata.md) caches x W^K_s, x W^V_s (pre-norm, pre-RoPE) and the
latents x U^K_h, x U^V_h: 2 (d_h + H r) per token. It is exact: values are absorbed,
a_h V_h = a_h V_s + (a_h R^V_h)(B^V_h)^T, but keys are rebuilt for every cached position,
K_h = K_s + R^K_h (B^K_h)^T, then QK-norm and RoPE, because RoPE does not commute with B_h and QK-norm is
nonlinear (the paper's key shortcut is not exact). That costs about 2 S H r d_h FLOPs per layer per token at
context S (lightning_modules/costs/counts.py) in exchange for the smaller cache. The "materialized" decode path caches per-head K/V
like MHA; it is the reference the tests compare the exact path with, not something to deploy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_modules.core.errors import ConfigError
from lightning_modules.kernels import support as fused
from lightning_modules.model.attention.base import Attention
from lightning_modules.model.attention.cache import TIME, LayerCache
from lightning_modules.model.attention.kernel import attend, attention_probs, masked_softmax
from lightning_modules.model.attention.knobs import knob
from lightning_modules.model.attention.lrkv_cached import (
    key_scale,
    latent_scores,
    query_maps,
    rebuilt_scores,
    rope_basis,
    score_dtype,
)
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.layers import RMSNorm, RotaryEmbedding


@dataclass(frozen=True)
class LowRankKnobs:
    rank: int = knob("per-head residual rank r (1 <= r <= head_dim)", minimum=1)
    lrkv_path: Literal["factorized", "materialized"] = knob(
        "training path: x W_s + (x U_h) B_h^T, or W_h = W_s + U_h B_h^T built once per forward"
    )
    residual_init: float = knob("||U_h B_h^T|| / ||W_s|| at initialisation", minimum=0.0)


class LowRankKVAttention(Attention):
    Knobs = LowRankKnobs
    label_suffix = "r{rank}"
    plot_style = {"color": "tab:red", "linestyle": "-"}  # a per-head cache: solid, like mha
    decode_paths = ("absorbed", "rebuilt", "materialized")
    fused_decode_kernel = "lrkv"  # lightning_modules/kernels/lrkv_decode.py, on the absorbed path
    train_path_knob = "lrkv_path"

    @classmethod
    def default_knobs(cls, model: ModelConfig) -> dict[str, object]:
        return {"rank": max(1, model.head_dim // 4), "lrkv_path": "factorized", "residual_init": 0.1}

    @classmethod
    def validate(cls, model: ModelConfig, knobs: LowRankKnobs) -> None:
        if not 1 <= knobs.rank <= model.head_dim:
            raise ConfigError(
                f"attention.rank={knobs.rank} out of range; allowed 1..head_dim ({model.head_dim})"
            )

    def __init__(self, model: ModelConfig, knobs: LowRankKnobs) -> None:
        super().__init__(model, knobs)
        self.n_head, self.head_dim, self.rank = model.n_head, model.head_dim, knobs.rank
        self.materialized = knobs.lrkv_path == "materialized"
        self.residual_init = knobs.residual_init
        d, H, dh, r = model.d_model, model.n_head, model.head_dim, knobs.rank
        # Rows: [W_q (H dh) | W^K_s (dh) | W^V_s (dh) | U^K (H r) | U^V (H r)], in nn.Linear's (out, in) layout.
        self.in_proj = nn.Linear(d, H * dh + 2 * dh + 2 * H * r, bias=False)
        self.b_k = nn.Parameter(torch.empty(H, dh, r))  # B^K_h, one (dh, r) matrix per head
        self.b_v = nn.Parameter(torch.empty(H, dh, r))
        self.out = nn.Linear(H * dh, d, bias=False)
        self.q_norm = RMSNorm(dh, model.norm_eps) if model.qk_norm else None
        self.k_norm = RMSNorm(dh, model.norm_eps) if model.qk_norm else None

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.in_proj.weight, std=std)
        # ||U_h B_h^T||_F^2 ~ d dh r std_U^2 std_B^2 and ||W_s||_F^2 ~ d dh std^2; with std_U = std and
        # std_B = residual_init / sqrt(r) the residual starts at residual_init x the shared part (docs/attentions.md).
        nn.init.normal_(self.b_k, std=self.residual_init / math.sqrt(self.rank))
        nn.init.normal_(self.b_v, std=self.residual_init / math.sqrt(self.rank))
        nn.init.normal_(self.out.weight, std=out_std)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                nn.init.ones_(norm.weight)

    def muon_blocks(self) -> dict[str, tuple[int, ...]]:
        # b_k / b_v are (H, dh, r): Muon treats a 3-D parameter as one matrix per head.
        return {"in_proj.weight": tuple(self._split_sizes())}

    def _split_sizes(self) -> list[int]:
        H, dh, r = self.n_head, self.head_dim, self.rank
        return [H * dh, dh, dh, H * r, H * r]

    def per_head_kv_weights(self) -> tuple[Tensor, Tensor]:
        """W^K_h and W^V_h for all heads in (out, in) layout, (H * dh, d) each: W_s + B_h U_h."""
        H, dh, r = self.n_head, self.head_dim, self.rank
        _, w_ks, w_vs, u_k, u_v = self.in_proj.weight.split(self._split_sizes(), dim=0)
        d = w_ks.shape[1]
        w_k = w_ks.unsqueeze(0) + torch.bmm(self.b_k, u_k.view(H, r, d))  # (H, dh, d)
        w_v = w_vs.unsqueeze(0) + torch.bmm(self.b_v, u_v.view(H, r, d))
        return w_k.reshape(H * dh, d), w_v.reshape(H * dh, d)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v as (B, T, H, dh) each, before QK-norm and RoPE."""
        B, T, _ = x.shape
        H, dh, r = self.n_head, self.head_dim, self.rank
        if self.materialized:
            w_q = self.in_proj.weight[: H * dh]
            w_k, w_v = self.per_head_kv_weights()
            q, k, v = F.linear(x, torch.cat([w_q, w_k, w_v], dim=0)).split(H * dh, dim=-1)
            return q.view(B, T, H, dh), k.view(B, T, H, dh), v.view(B, T, H, dh)
        q, k_s, v_s, l_k, l_v = self.in_proj(x).split(self._split_sizes(), dim=-1)
        # k_h = x W^K_s + (x U^K_h) (B^K_h)^T: latents (B, T, H, r) times B_h (H, dh, r) -> (B, T, H, dh)
        k = k_s.view(B, T, 1, dh) + torch.einsum("bthr,hdr->bthd", l_k.view(B, T, H, r), self.b_k)
        v = v_s.view(B, T, 1, dh) + torch.einsum("bthr,hdr->bthd", l_v.view(B, T, H, r), self.b_v)
        return q.view(B, T, H, dh), k, v

    def forward(self, x: Tensor, rope: RotaryEmbedding) -> Tensor:
        B, T, _ = x.shape
        q, k, v = self._qkv(x)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q), rope(k)
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # (B, H, T, dh)
        return self.out(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))

    # ----- decoding ----------------------------------------------------------------------------------
    def cache_layout(self, path: str) -> dict[str, tuple[int, ...]]:
        H, dh, r = self.n_head, self.head_dim, self.rank
        if path == "materialized":  # per-head K (after norm and RoPE) and V, as MHA
            return {"k": (H, TIME, dh), "v": (H, TIME, dh)}
        if path == "rebuilt":  # x W_s and the latents; keys rebuilt from them every step
            return {"k_s": (TIME, dh), "v_s": (TIME, dh), "l_k": (H, TIME, r), "l_v": (H, TIME, r)}
        # absorbed (lrkv_decode.py): the shared key already gained and rotated, 1 / rms per head when there is
        # QK-norm, key latents position-major ((B, S, H r) is the row-wise dot's layout), value latents
        # head-major ((B, H, S, r) is what the probabilities multiply without a copy).
        layout = {"k_rot": (TIME, dh), "l_k": (TIME, H, r), "v_s": (TIME, dh), "l_v": (H, TIME, r)}
        if self.k_norm is not None:
            layout["sigma"] = (TIME, H)
        return layout

    def decode(self, x: Tensor, rope: RotaryEmbedding, cache: LayerCache) -> Tensor:
        if cache.path == "materialized":
            return self._decode_materialized(x, rope, cache)
        if cache.path == "rebuilt":
            return self._decode_rebuilt(x, rope, cache)
        B, T, _ = x.shape
        H, dh, r = self.n_head, self.head_dim, self.rank
        start = cache.length
        # The decode projection is the factorised one whatever lrkv_path trains with: the cache needs x W_s
        # and the latents, not per-head K/V.
        q, k_s, v_s, l_k, l_v = self.in_proj(x).split(self._split_sizes(), dim=-1)
        q, l_k = q.view(B, T, H, dh), l_k.view(B, T, H, r)
        new = {"v_s": v_s, "l_k": l_k, "l_v": l_v.view(B, T, H, r).transpose(1, 2)}
        acc = score_dtype(x.dtype)  # everything a score is made of, in fp32 (lrkv_decode.py)
        gain = torch.ones(dh, device=x.device, dtype=acc)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)
            gain = self.k_norm.weight.to(acc)
            # 1 / rms of each new token's per-head key, the only per-head key quantity a step needs.
            latent_part = torch.einsum("bthr,hdr->bthd", l_k.to(acc), self.b_k.to(acc))
            new["sigma"] = key_scale(k_s.view(B, T, 1, dh).to(acc) + latent_part, self.k_norm.eps)
        new["k_rot"] = rope((gain * k_s.to(acc)).view(B, T, 1, dh), start).view(B, T, dh)
        held = cache.append(**new)
        q = rope(q, start).to(acc)  # (B, T, H, dh)
        c = gain[:, None] * self.b_k.to(acc)  # C_h = diag(g) B^K_h: (H, dh, r)
        sigma = held.get("sigma")
        if T == 1 and fused.usable("lrkv", x, held["v_s"].dtype):
            out = fused.attempt("lrkv", lambda: self._decode_fused(q, c, held, rope))
            if out is not None:  # None: the device cannot launch the kernel; the plain path below
                return out
        with torch.autocast(x.device.type, enabled=False):  # autocast would lower these products to bf16
            if T * r <= dh:  # the latent form's (B, S, T, H, r) product is no larger than the keys
                basis = rope_basis(rope, cache.length, acc)
                scores = latent_scores(q, query_maps(q, c), held["k_rot"], held["l_k"], sigma, basis)
            else:
                scores = rebuilt_scores(q, c, held["k_rot"], held["l_k"], sigma, rope)
        a = masked_softmax(scores / math.sqrt(dh)).to(v_s.dtype)  # (B, H, T, S)
        return self._mix_values(a, held["v_s"], held["l_v"])

    def _decode_fused(self, q: Tensor, c: Tensor, held: dict[str, Tensor], rope: RotaryEmbedding) -> Tensor:
        """One query per sequence through the fused kernel (lightning_modules/kernels/lrkv_decode.py): the same
        scores and mixtures in one pass over the compressed cache."""
        from lightning_modules.kernels import lrkv_decode as kernel  # triton is optional: only where it runs

        B, _, H, dh = q.shape
        maps = query_maps(q, c)[:, 0]  # (B, H, dh, r)
        mixed_v, mixed_lv = kernel.decode_step(
            q[:, 0], maps, held["k_rot"], held.get("sigma"), held["l_k"], held["v_s"], held["l_v"],
            rope.inv_freq(q.device), 1.0 / math.sqrt(dh),
        )  # fmt: skip
        y = mixed_v + torch.einsum("bhr,hdr->bhd", mixed_lv, self.b_v.float())  # (B, H, dh)
        return self.out(y.to(self.out.weight.dtype).reshape(B, 1, H * dh))

    def _mix_values(self, a: Tensor, v_s: Tensor, l_v: Tensor) -> Tensor:
        """Values absorbed, exactly: a_h V_h = a_h V_s + (a_h R^V_h) (B^V_h)^T. a: (B, H, T, S); v_s: (B, S, dh);
        l_v: (B, H, S, r). Returns the output projection's result, (B, T, d)."""
        B, H, T, _ = a.shape
        y = torch.matmul(a, v_s.unsqueeze(1))  # (B, H, T, S) @ (B, 1, S, dh) -> (B, H, T, dh)
        mixed_latents = torch.matmul(a, l_v)  # (B, H, T, S) @ (B, H, S, r) -> (B, H, T, r)
        y = y + torch.einsum("bhtr,hdr->bhtd", mixed_latents, self.b_v)
        return self.out(y.transpose(1, 2).reshape(B, T, H * self.head_dim))

    def _decode_rebuilt(self, x: Tensor, rope: RotaryEmbedding, cache: LayerCache) -> Tensor:
        """Reference for the tests: the per-head keys of all S held positions rebuilt from x W_s and the
        latents every step, then QK-norm and RoPE over them (about six times MHA's bytes per step)."""
        B, T, _ = x.shape
        H, dh, r = self.n_head, self.head_dim, self.rank
        start = cache.length
        q, k_s, v_s, l_k, l_v = self.in_proj(x).split(self._split_sizes(), dim=-1)
        held = cache.append(
            k_s=k_s,
            v_s=v_s,
            l_k=l_k.view(B, T, H, r).transpose(1, 2),
            l_v=l_v.view(B, T, H, r).transpose(1, 2),
        )
        k = torch.einsum("bhsr,hdr->bhsd", held["l_k"], self.b_k).add_(held["k_s"].unsqueeze(1))
        q = q.view(B, T, H, dh)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = rope(q, start).transpose(1, 2)  # (B, H, T, dh)
        k = rope(k.transpose(1, 2)).transpose(1, 2)  # RoPE reads (B, S, H, dh): keys at positions 0 .. S - 1
        a = attention_probs(q, k, scale=1.0 / math.sqrt(dh))  # (B, H, T, S)
        return self._mix_values(a, held["v_s"], held["l_v"])

    def _decode_materialized(self, x: Tensor, rope: RotaryEmbedding, cache: LayerCache) -> Tensor:
        """Reference for the tests: per-head K/V built and cached as MHA would (an MHA-sized cache)."""
        B, T, _ = x.shape
        start = cache.length
        q, k, v = self._qkv(x)  # (B, T, H, dh) each
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        held = cache.append(k=rope(k, start).transpose(1, 2), v=v.transpose(1, 2))  # (B, H, S, dh) each
        y = attend(rope(q, start).transpose(1, 2), held["k"], held["v"])  # (B, H, T, dh)
        return self.out(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))

    # ----- costs ------------------------------------------------------------------------------------
    @classmethod
    def train_matmul_flops_per_token(cls, model: ModelConfig, knobs: LowRankKnobs) -> int:
        if knobs.lrkv_path != "materialized":
            return 2 * cls.param_counts(model, knobs)[0]
        # One MHA-sized product per token; building W_h = W_s + B_h U_h is a per-forward cost that
        # lightning_modules/costs/counts.py amortises over the tokens of a step (see costs.train_flops_per_token).
        d, H, dh = model.d_model, model.n_head, model.head_dim
        return 2 * (d * 3 * H * dh + H * dh * d)

    @classmethod
    def per_forward_flops(cls, model: ModelConfig, knobs: LowRankKnobs) -> int:
        """Forward FLOPs spent once per forward pass, independent of the token count."""
        if knobs.lrkv_path != "materialized":
            return 0
        d, H, dh = model.d_model, model.n_head, model.head_dim
        return 2 * 2 * H * dh * knobs.rank * d  # B_h U_h for keys and for values

    @classmethod
    def extra_costs(cls, model: ModelConfig, knobs: LowRankKnobs) -> dict[str, float]:
        # The paper counts x W^K_s, x W^V_s and the latents, 1/H + r/d_h of MHA's (docs/paper-errata.md); the
        # absorbed decode caches 1 / rms per head too (H more elements per token, lrkv_decode.py).
        return {"kv_cache_vs_mha_paper_convention": 1 / model.n_head + knobs.rank / model.head_dim}

    @classmethod
    def decode_flops_per_token(cls, model: ModelConfig, knobs: LowRankKnobs, context: int) -> int:
        """Absorbed decode (lrkv_decode.py), the matrix products: new token's projections; per cached position
        and head the RoPE basis times M_h (2 r d_h) and the shared key's score (2 d_h); values absorbed,
        a_h V_s + (a_h R^V_h)(B^V_h)^T. The row-wise dot of F M_h with the latents (2 r per position and head, 1/d_h
        of the product before it) is elementwise and, like norms and softmax, not counted (docs/costs.md)."""
        d, H, dh = model.d_model, model.n_head, model.head_dim
        r = knobs.rank
        projections = 2 * d * (H * dh + 2 * dh + 2 * H * r) + 2 * H * dh * d
        low_rank_scores = 2 * context * H * r * dh
        scores = 2 * context * H * dh
        values = 2 * context * H * (dh + r) + 2 * H * r * dh
        return projections + low_rank_scores + scores + values
