"""Grouped-tied attention (GTA; Zadouri, Strauss, Dao, arXiv 2505.21487; docs/attentions.md, "gta").

G groups of query heads, as in GQA (head h reads group h // (H / G)), but each group caches one tied state
t_g = x W^T_g in R^{d_h} that serves as both its key and its value: v_g = t_g, and the key is the tied state's
first d_h - d_R entries followed by one RoPE key shared by every head, k_g = [t_g[:d_h - d_R] ; RoPE(x W^KR)].
Queries are per head, q_h = [q^N_h ; RoPE(q^R_h)] with the same split. Scores q_h . k_g / sqrt(d_h).

Conventions the paper leaves open follow the authors' code (Dao-AILab/grouped-latent-attention,
modeling_llama_GTA): the non-RoPE key part is the *first* d_h - d_R entries of the tied state, the RoPE key
has its own projection shared across groups, d_R = d_h / 2 by default, the scale is 1 / sqrt(d_h), and there is
no QK-norm (a norm on the key would have to leave the value, the same tied state, untouched; as for mla the
model's qk_norm does not apply here).

Decode caches t_g (G d_h) and the rotated RoPE key (d_R) per token: G d_h + d_R elements, about half GQA's
2 G d_h at the same G. A step scores the query's two parts against the cached parts and mixes the tied states:
no key is ever formed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lightning_modules.core.errors import ConfigError
from lightning_modules.model.attention.base import Attention, check_divides, check_even
from lightning_modules.model.attention.cache import TIME, LayerCache
from lightning_modules.model.attention.kernel import attend, masked_softmax
from lightning_modules.model.attention.knobs import knob
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.layers import RotaryEmbedding


@dataclass(frozen=True)
class TiedKnobs:
    n_kv_heads: int = knob("number of key/value heads G; must divide n_head", minimum=1)
    rope_head_dim: int = knob("decoupled RoPE key width d_R (even)", minimum=1)


class GroupedTiedAttention(Attention):
    Knobs = TiedKnobs
    label_suffix = "g{n_kv_heads}"
    plot_style = {"color": "tab:brown", "linestyle": "--"}  # a grouped cache: dashed, like gqa
    decode_paths = ("tied",)

    @classmethod
    def default_knobs(cls, model: ModelConfig) -> dict[str, object]:
        # GQA's default group count; the authors' RoPE split d_R = d_h / 2 (modeling_llama_GTA's rope_dim).
        return {
            "n_kv_heads": model.n_head // 2 if model.n_head % 2 == 0 else 1,
            "rope_head_dim": model.head_dim // 2,
        }

    @classmethod
    def validate(cls, model: ModelConfig, knobs: TiedKnobs) -> None:
        check_divides("attention.n_kv_heads", knobs.n_kv_heads, model.n_head)
        check_even("attention.rope_head_dim", knobs.rope_head_dim)
        if knobs.rope_head_dim >= model.head_dim:
            raise ConfigError(
                f"attention.rope_head_dim={knobs.rope_head_dim}: must be below head_dim ({model.head_dim}); "
                "the key keeps head_dim - rope_head_dim entries of the tied state"
            )

    @classmethod
    def rope_dim(cls, model: ModelConfig, knobs: TiedKnobs) -> int:
        return knobs.rope_head_dim

    def __init__(self, model: ModelConfig, knobs: TiedKnobs) -> None:
        super().__init__(model, knobs)
        self.n_head, self.head_dim = model.n_head, model.head_dim
        self.n_kv, self.d_r = knobs.n_kv_heads, knobs.rope_head_dim
        self.d_n = self.head_dim - self.d_r  # the key's part read from the tied state, not rotated
        H, G, dh = self.n_head, self.n_kv, self.head_dim
        # Rows: [W^Q (H dh) | W^T, the tied states (G dh) | W^KR, the shared RoPE key (d_R)]
        self.in_proj = nn.Linear(model.d_model, H * dh + G * dh + self.d_r, bias=False)
        self.out = nn.Linear(H * dh, model.d_model, bias=False)

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.in_proj.weight, std=std)
        nn.init.normal_(self.out.weight, std=out_std)

    def muon_blocks(self) -> dict[str, tuple[int, ...]]:
        H, G, dh = self.n_head, self.n_kv, self.head_dim
        return {"in_proj.weight": (H * dh, G * dh, self.d_r)}

    def _project(self, x: Tensor, rope: RotaryEmbedding, start: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, T, H, dh) with its last d_R entries rotated, the tied states t (B, T, G, dh) and the rotated
        shared RoPE key (B, T, 1, d_R), at positions start .."""
        B, T, _ = x.shape
        H, G, dh, d_r = self.n_head, self.n_kv, self.head_dim, self.d_r
        q, tied, k_r = self.in_proj(x).split([H * dh, G * dh, d_r], dim=-1)
        q_n, q_r = q.view(B, T, H, dh).split([self.d_n, d_r], dim=-1)
        q = torch.cat([q_n, rope(q_r, start)], dim=-1)
        return q, tied.view(B, T, G, dh), rope(k_r.view(B, T, 1, d_r), start)

    def forward(self, x: Tensor, rope: RotaryEmbedding) -> Tensor:
        B, T, _ = x.shape
        q, tied, k_r = self._project(x, rope)
        G = self.n_kv
        k = torch.cat([tied[..., : self.d_n], k_r.expand(B, T, G, self.d_r)], dim=-1)  # (B, T, G, dh)
        y = attend(q.transpose(1, 2), k.transpose(1, 2), tied.transpose(1, 2))  # values: the tied states
        return self.out(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))

    def cache_layout(self, path: str) -> dict[str, tuple[int, ...]]:
        # Tied states head-major ((B, G, S, dh): what the grouped products read without a copy); one RoPE key.
        return {"tied": (self.n_kv, TIME, self.head_dim), "k_rope": (TIME, self.d_r)}

    def decode(self, x: Tensor, rope: RotaryEmbedding, cache: LayerCache) -> Tensor:
        B, T, _ = x.shape
        H, G, dh = self.n_head, self.n_kv, self.head_dim
        q, tied, k_r = self._project(x, rope, start=cache.length)
        held = cache.append(tied=tied.transpose(1, 2), k_rope=k_r.view(B, T, self.d_r))
        t_all, k_r_all = held["tied"], held["k_rope"]  # (B, G, S, dh), (B, S, d_R)
        # The H / G heads of a group as rows of that group's product: (B, G, H/G T, .), consecutive heads per
        # group as in gqa.py (head h reads group h // (H / G)).
        q_g = q.view(B, T, G, H // G, dh).permute(0, 2, 3, 1, 4).reshape(B, G, H // G * T, dh)
        scores = torch.matmul(q_g[..., : self.d_n], t_all[..., : self.d_n].transpose(-1, -2))
        scores = scores + torch.matmul(q_g[..., self.d_n :], k_r_all.unsqueeze(1).transpose(-1, -2))
        S = t_all.shape[2]
        scores = scores.view(B, G, H // G, T, S).reshape(B, H, T, S) * dh**-0.5
        a = masked_softmax(scores).to(t_all.dtype).view(B, G, H // G * T, S)
        y = torch.matmul(a, t_all).view(B, G, H // G, T, dh).reshape(B, H, T, dh)
        return self.out(y.transpose(1, 2).reshape(B, T, H * dh))

    # ----- costs ------------------------------------------------------------------------------------
    @classmethod
    def decode_flops_per_token(cls, model: ModelConfig, knobs: Any, context: int) -> int:
        """The new token's projections (as in training) + its scores (d_h - d_R against the tied states, d_R
        against the RoPE key: d_h per position and head) and the mixing of the tied states."""
        H, dh = model.n_head, model.head_dim
        return cls.train_matmul_flops_per_token(model, knobs) + 2 * context * H * 2 * dh
