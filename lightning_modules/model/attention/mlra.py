"""Multi-head low-rank attention (MLRA; Liu et al., ICLR 2026, arXiv 2603.02188; docs/attentions.md, "mlra").

MLA's latent c (d_c wide) cut into n blocks c_1 .. c_n of width w = d_c / n, each RMS-normalised on its own and
scaled by sqrt(d / w) (the paper's latent scaling, so keys and values start at MHA's scale whatever w). The
blocks are dealt to m branches, n / m blocks each; within branch i, block j serves heads j (H / P) ..
(j + 1) (H / P) - 1 (P = n / m), giving each such head a key k^C_{i,h} = c_b W^UK_{i,h} and value
v_{i,h} = c_b W^UV_{i,h} (d_h each). Every branch attends with the head's query q_h = [q^C_h ; RoPE(q^R_h)] and
the one RoPE key k^R = RoPE(x W^KR) shared by all, scale 1 / sqrt(d_h + d_R); the head's output is
(1 / sqrt(m)) sum_i softmax_i V_i. MLRA-4 is n = m = 4 (each block serves every head), MLRA-2 is n = 4,
m = 2. With m = 1 the same layer is GLA: each head reads one block.

Conventions the paper leaves open follow the authors' code (SongtaoLiu0823/MLRA, its mlra_2 and mlra_4
models): four blocks whatever m, block j of branch i serving consecutive heads, the per-block norm and
sqrt(d / w) scale, the 1 / sqrt(m) output scale, the compressed query scaled by sqrt(d / d_cq) after its norm
(`q_latent_dim`, 0 = no compression, as this project's mla), no QK-norm (as mla: the model's qk_norm does not
apply).

Decode caches the scaled blocks (block-major) and the rotated RoPE key: d_c + d_R elements per token, as mla.
A step runs the absorbed form per branch: the query is taken into its block's space, q^C_h W^UK_{i,h}^T,
scored against the cached block and the RoPE key, the block is mixed by the weights, and W^UV_{i,h} is applied
to the mixed block; per-head keys and values are never rebuilt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lightning_modules.core.errors import ConfigError
from lightning_modules.model.attention.base import Attention, check_even
from lightning_modules.model.attention.cache import TIME, LayerCache
from lightning_modules.model.attention.kernel import attend, masked_softmax
from lightning_modules.model.attention.knobs import knob
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.layers import RMSNorm, RotaryEmbedding

MLRA_BLOCKS = 4  # the paper's latent heads: one per rank of 4-way tensor-parallel decoding


class LatentBlockAttention(Attention):
    """MLA's latent in blocks, dealt to branches whose outputs are summed: MLRA (m branches) and GLA (one).
    Subclasses say how many blocks and branches their knobs give."""

    decode_paths = ("absorbed",)
    # The paper's scaling of each normalised block by sqrt(d / w) and of the normalised query latent by
    # sqrt(d / d_cq); GLA's authors use neither (gla.py).
    latent_scaling: ClassVar[bool] = True

    @classmethod
    def blocks(cls, knobs: Any) -> int:
        raise NotImplementedError

    @classmethod
    def branches(cls, knobs: Any) -> int:
        raise NotImplementedError

    @classmethod
    def validate(cls, model: ModelConfig, knobs: Any) -> None:
        check_even("attention.rope_head_dim", knobs.rope_head_dim)
        n, m = cls.blocks(knobs), cls.branches(knobs)
        if knobs.kv_latent_dim % n:
            raise ConfigError(
                f"attention.kv_latent_dim={knobs.kv_latent_dim}: must split into {n} equal latent blocks"
            )
        if model.n_head % (n // m):
            raise ConfigError(
                f"model.n_head={model.n_head}: each branch deals its heads to {n // m} latent blocks, "
                f"so n_head must be a multiple of {n // m}"
            )

    @classmethod
    def rope_dim(cls, model: ModelConfig, knobs: Any) -> int:
        return knobs.rope_head_dim

    def __init__(self, model: ModelConfig, knobs: Any) -> None:
        super().__init__(model, knobs)
        d, H, dh = model.d_model, model.n_head, model.head_dim
        self.n_head, self.head_dim = H, dh
        self.d_c, self.d_r, self.d_cq = knobs.kv_latent_dim, knobs.rope_head_dim, knobs.q_latent_dim
        self.n_blocks, self.n_branches = self.blocks(knobs), self.branches(knobs)
        self.per_branch = self.n_blocks // self.n_branches  # P blocks in a branch
        self.heads_per_block = H // self.per_branch
        self.width = self.d_c // self.n_blocks  # w
        self.kv_scale = math.sqrt(d / self.width) if self.latent_scaling else 1.0
        self.q_scale = math.sqrt(d / self.d_cq) if self.d_cq and self.latent_scaling else 1.0
        q_width = H * (dh + self.d_r)
        # Rows: [queries, or the query latent when compressed | c before the norms (d_c) | k^R before RoPE (d_R)]
        self.in_proj = nn.Linear(d, (self.d_cq or q_width) + self.d_c + self.d_r, bias=False)
        if self.d_cq:
            self.q_norm = RMSNorm(self.d_cq, model.norm_eps)
            self.q_up = nn.Linear(self.d_cq, q_width, bias=False)
        self.kv_norms = nn.ModuleList(RMSNorm(self.width, model.norm_eps) for _ in range(self.n_blocks))
        # Block b's up-projections, (H / P) heads of d_h rows each over its w inputs: W^UK and W^UV.
        self.w_uk = nn.Parameter(torch.empty(self.n_blocks, self.heads_per_block * dh, self.width))
        self.w_uv = nn.Parameter(torch.empty(self.n_blocks, self.heads_per_block * dh, self.width))
        self.out = nn.Linear(H * dh, d, bias=False)

    def init_weights(self, std: float, out_std: float) -> None:
        # Every projection at std: the latent scaling, not the init, puts keys and values at MHA's scale.
        nn.init.normal_(self.in_proj.weight, std=std)
        if self.d_cq:
            nn.init.normal_(self.q_up.weight, std=std)
            nn.init.ones_(self.q_norm.weight)
        nn.init.normal_(self.w_uk, std=std)
        nn.init.normal_(self.w_uv, std=std)
        nn.init.normal_(self.out.weight, std=out_std)
        for norm in self.kv_norms:
            nn.init.ones_(norm.weight)

    def muon_blocks(self) -> dict[str, tuple[int, ...]]:
        # w_uk / w_uv are (n, H/P dh, w): Muon treats a 3-D parameter as one matrix per block.
        q_rows = self.in_proj.out_features - self.d_c - self.d_r
        return {"in_proj.weight": (q_rows, self.d_c, self.d_r)}

    def _project(
        self, x: Tensor, rope: RotaryEmbedding, start: int = 0
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """q^C (B, T, H, dh), rotated q^R (B, T, H, d_R), the normalised, scaled blocks (B, T, n, w) and the
        rotated RoPE key (B, T, 1, d_R), at positions start .."""
        B, T, _ = x.shape
        H, dh, d_r = self.n_head, self.head_dim, self.d_r
        q, c, k_r = self.in_proj(x).split([self.in_proj.out_features - self.d_c - d_r, self.d_c, d_r], dim=-1)
        if self.d_cq:
            q = self.q_up(self.q_norm(q) * self.q_scale)
        q_c, q_r = q.view(B, T, H, dh + d_r).split([dh, d_r], dim=-1)
        blocks = torch.stack(
            [norm(part) for norm, part in zip(self.kv_norms, c.split(self.width, dim=-1), strict=True)], dim=2
        )
        return q_c, rope(q_r, start), blocks * self.kv_scale, rope(k_r.view(B, T, 1, d_r), start)

    def forward(self, x: Tensor, rope: RotaryEmbedding) -> Tensor:
        B, T, _ = x.shape
        H, dh, m = self.n_head, self.head_dim, self.n_branches
        q_c, q_r, c, k_r = self._project(x, rope)
        # Block b = i P + j gives heads j (H / P) .. of branch i: (B, T, n, H/P dh) -> (B, T, m, H, dh).
        k_c = torch.einsum("btnw,nkw->btnk", c, self.w_uk).reshape(B, T, m, H, dh)
        v = torch.einsum("btnw,nkw->btnk", c, self.w_uv).reshape(B, T, m, H, dh)
        q = torch.cat([q_c, q_r], dim=-1).transpose(1, 2)  # (B, H, T, dh + d_R)
        k_r = k_r.expand(B, T, H, self.d_r)
        y = None
        for i in range(m):
            k = torch.cat([k_c[:, :, i], k_r], dim=-1).transpose(1, 2)
            y_i = attend(q, k, v[:, :, i].transpose(1, 2), scale=1.0 / math.sqrt(dh + self.d_r))
            y = y_i if y is None else y + y_i
        assert y is not None
        y = y / math.sqrt(m)  # the paper's output scale over branches
        return self.out(y.transpose(1, 2).reshape(B, T, H * dh))

    def cache_layout(self, path: str) -> dict[str, tuple[int, ...]]:
        # Blocks block-major ((B, n, S, w): what each block's products read without a copy); one RoPE key.
        return {"blocks": (self.n_blocks, TIME, self.width), "k_rope": (TIME, self.d_r)}

    def decode(self, x: Tensor, rope: RotaryEmbedding, cache: LayerCache) -> Tensor:
        B, T, _ = x.shape
        H, dh, m, P, hp, w = (
            self.n_head, self.head_dim, self.n_branches, self.per_branch, self.heads_per_block, self.width
        )  # fmt: skip
        q_c, q_r, c, k_r = self._project(x, rope, start=cache.length)
        held = cache.append(blocks=c.transpose(1, 2), k_rope=k_r.view(B, T, self.d_r))
        c_all, k_r_all = held["blocks"], held["k_rope"]  # (B, n, S, w), (B, S, d_R)
        S = c_all.shape[2]
        # Absorbed: q^C_h W^UK_{i,h}^T for head h = j (H/P) + hh of block b = i P + j, rows (B, n, H/P T, w).
        w_uk = self.w_uk.view(m, P, hp, dh, w)
        q_lat = torch.einsum("btjhd,ijhdw->bijhtw", q_c.view(B, T, P, hp, dh), w_uk).reshape(B, -1, hp * T, w)
        scores = torch.matmul(q_lat, c_all.transpose(-1, -2)).view(B, m, H, T, S)
        rope_scores = torch.matmul(
            q_r.transpose(1, 2), k_r_all.unsqueeze(1).transpose(-1, -2)
        )  # (B, H, T, S)
        a = masked_softmax((scores + rope_scores.unsqueeze(1)) / math.sqrt(dh + self.d_r))
        mixed = torch.matmul(a.to(c_all.dtype).view(B, -1, hp * T, S), c_all)  # (B, n, H/P T, w)
        w_uv = self.w_uv.view(m, P, hp, dh, w)
        y = torch.einsum("bijhtw,ijhdw->btjhd", mixed.view(B, m, P, hp, T, w), w_uv)  # summed over branches
        return self.out((y / math.sqrt(m)).reshape(B, T, H * dh))

    # ----- costs ------------------------------------------------------------------------------------
    @classmethod
    def score_dims(cls, model: ModelConfig, knobs: Any) -> tuple[int, int]:
        # Per head, summed over its m branches: each attends with d_h + d_R and mixes d_h.
        m = cls.branches(knobs)
        return m * (model.head_dim + knobs.rope_head_dim), m * model.head_dim

    @classmethod
    def extra_costs(cls, model: ModelConfig, knobs: Any) -> dict[str, float]:
        # As mla's: the paper's convention counts the latent only (docs/paper-errata.md).
        return {"kv_cache_vs_mha_paper_convention": knobs.kv_latent_dim / (2 * model.n_head * model.head_dim)}

    @classmethod
    def decode_flops_per_token(cls, model: ModelConfig, knobs: Any, context: int) -> int:
        """Absorbed decode: the projections, W^UK_{i,h} folded into the query and W^UV_{i,h} into the output (m H
        per token), per cached position the m H block scores (w each), the H RoPE scores (d_R) and the m H
        block mixtures (w)."""
        d, H, dh = model.d_model, model.n_head, model.head_dim
        d_c, d_r, d_cq = knobs.kv_latent_dim, knobs.rope_head_dim, knobs.q_latent_dim
        m, w = cls.branches(knobs), knobs.kv_latent_dim // cls.blocks(knobs)
        q_width = H * (dh + d_r)
        q_proj = 2 * (d * d_cq + d_cq * q_width if d_cq else d * q_width)
        latent_proj = 2 * d * (d_c + d_r)
        absorb = 2 * m * H * dh * w * 2
        scores = 2 * context * (m * H * w + H * d_r)
        mixing = 2 * context * m * H * w
        return q_proj + latent_proj + absorb + scores + mixing + 2 * H * dh * d


@dataclass(frozen=True)
class LowRankHeadsKnobs:
    kv_latent_dim: int = knob("compressed KV width d_c", minimum=1)
    rope_head_dim: int = knob("decoupled RoPE key width d_R (even)", minimum=1)
    q_latent_dim: int = knob("query compression width (0: no query compression)", minimum=0)
    mlra_branches: int = knob(
        "MLRA-m: branches summed per head, dividing the 4 latent blocks (paper: 2, 4)", minimum=1
    )


class MultiHeadLowRankAttention(LatentBlockAttention):
    Knobs = LowRankHeadsKnobs
    label_suffix = "{mlra_branches}-c{kv_latent_dim}"
    plot_style = {"color": "tab:pink", "linestyle": ":"}  # a latent cache: dotted, like mla

    @classmethod
    def blocks(cls, knobs: LowRankHeadsKnobs) -> int:
        return MLRA_BLOCKS

    @classmethod
    def branches(cls, knobs: LowRankHeadsKnobs) -> int:
        return knobs.mlra_branches

    @classmethod
    def default_knobs(cls, model: ModelConfig) -> dict[str, object]:
        # The paper's shape: d_c = 4 d_h (one d_h per block), d_R = d_h / 2, MLRA-4.
        return {
            "kv_latent_dim": 4 * model.head_dim,
            "rope_head_dim": model.head_dim // 2,
            "q_latent_dim": 0,
            "mlra_branches": 4,
        }

    @classmethod
    def validate(cls, model: ModelConfig, knobs: LowRankHeadsKnobs) -> None:
        if MLRA_BLOCKS % knobs.mlra_branches:
            raise ConfigError(
                f"attention.mlra_branches={knobs.mlra_branches}: must divide the {MLRA_BLOCKS} latent blocks; "
                "allowed: 1, 2, 4"
            )
        super().validate(model, knobs)
