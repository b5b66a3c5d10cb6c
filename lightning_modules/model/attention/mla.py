"""Multi-head latent attention, DeepSeek-V2 form (docs/attentions.md, "mla").

c = RMSNorm(x W^DKV) in R^{d_c}; k^C_h = c W^UK_h, v_h = c W^UV_h (d_h each); one RoPE key shared by all
heads, k^R = RoPE(x W^KR) in R^{d_R}; q_h = [q^C_h ; RoPE(q^R_h)] from x, optionally through a compressed
query c_q = RMSNorm(x W^DQ). Scores [q^C_h; q^R_h] . [k^C_h; k^R] / sqrt(d_h + d_R).

MLA keeps its latent norm instead of QK-norm: a per-head norm on k^C_h would sit between W^UK and the
scores and forbid folding W^UK into the query at decode time (absorption), the point of MLA's small cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from lightning_modules.kernels import support as fused
from lightning_modules.model.attention.base import Attention, check_even
from lightning_modules.model.attention.cache import TIME, LayerCache
from lightning_modules.model.attention.kernel import attend
from lightning_modules.model.attention.knobs import knob
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.layers import RMSNorm, RotaryEmbedding


@dataclass(frozen=True)
class LatentKnobs:
    kv_latent_dim: int = knob("compressed KV width d_c", minimum=1)
    rope_head_dim: int = knob("decoupled RoPE key width d_R (even)", minimum=1)
    q_latent_dim: int = knob("query compression width (0: no query compression)", minimum=0)
    latent_init: Literal["fixed", "fan_in"] = knob(
        "init of the up-projections from a latent: std 0.02 (fixed), or 0.02 sqrt(d_model / latent width)"
    )


class MultiHeadLatentAttention(Attention):
    Knobs = LatentKnobs
    label_suffix = "c{kv_latent_dim}"
    plot_style = {"color": "tab:purple", "linestyle": ":"}
    decode_paths = ("absorbed", "rebuilt")
    fused_decode_kernel = "mla"  # lightning_modules/kernels/mla_decode.py, on the absorbed path

    @classmethod
    def default_knobs(cls, model: ModelConfig) -> dict[str, object]:
        # DeepSeek-V2's ratios: d_c = 4 d_h (512 at d_h = 128), d_R = d_h / 2 (64); no query compression.
        return {
            "kv_latent_dim": 4 * model.head_dim,
            "rope_head_dim": model.head_dim // 2,
            "q_latent_dim": 0,
            "latent_init": "fixed",
        }

    @classmethod
    def validate(cls, model: ModelConfig, knobs: LatentKnobs) -> None:
        check_even("attention.rope_head_dim", knobs.rope_head_dim)

    @classmethod
    def rope_dim(cls, model: ModelConfig, knobs: LatentKnobs) -> int:
        return knobs.rope_head_dim

    def __init__(self, model: ModelConfig, knobs: LatentKnobs) -> None:
        super().__init__(model, knobs)
        d, H, dh = model.d_model, model.n_head, model.head_dim
        self.n_head, self.head_dim = H, dh
        self.d_c, self.d_r, self.d_cq = knobs.kv_latent_dim, knobs.rope_head_dim, knobs.q_latent_dim
        self.latent_init = knobs.latent_init
        q_width = H * (dh + self.d_r)
        # Rows: [queries, or the query latent when compressed | c before its norm (d_c) | k^R before RoPE (d_R)]
        self.in_proj = nn.Linear(d, (self.d_cq or q_width) + self.d_c + self.d_r, bias=False)
        if self.d_cq:
            self.q_norm = RMSNorm(self.d_cq, model.norm_eps)
            self.q_up = nn.Linear(self.d_cq, q_width, bias=False)
        self.kv_norm = RMSNorm(self.d_c, model.norm_eps)
        self.kv_up = nn.Linear(self.d_c, 2 * H * dh, bias=False)  # rows [W^UK (H dh) | W^UV (H dh)]
        self.out = nn.Linear(H * dh, d, bias=False)

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.in_proj.weight, std=std)
        for up in (self.kv_up,) + ((self.q_up,) if self.d_cq else ()):
            # An up-projection reads an RMS-normalised latent, so its outputs start with std = std_w sqrt(width):
            # with a fixed std_w they grow with the latent width. fan_in scales std_w so that keys, values and
            # queries start at the scale a projection of the d_model-wide normalised residual gives them,
            # whatever the width (docs/attentions.md, "mla").
            scale = (
                math.sqrt(self.in_proj.in_features / up.in_features) if self.latent_init == "fan_in" else 1.0
            )
            nn.init.normal_(up.weight, std=std * scale)
        nn.init.normal_(self.out.weight, std=out_std)
        for norm in (self.kv_norm,) + ((self.q_norm,) if self.d_cq else ()):
            nn.init.ones_(norm.weight)

    def muon_blocks(self) -> dict[str, tuple[int, ...]]:
        H, dh = self.n_head, self.head_dim
        q_rows = self.in_proj.out_features - self.d_c - self.d_r
        return {"in_proj.weight": (q_rows, self.d_c, self.d_r), "kv_up.weight": (H * dh, H * dh)}

    def _project(
        self, x: Tensor, rope: RotaryEmbedding, start: int = 0
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """q^C (B, T, H, dh), RoPE'd q^R (B, T, H, d_R), normalised latent c (B, T, d_c) and RoPE'd shared key
        k^R (B, T, 1, d_R), at positions start .."""
        B, T, _ = x.shape
        H, dh, d_r = self.n_head, self.head_dim, self.d_r
        q, c, k_r = self.in_proj(x).split([self.in_proj.out_features - self.d_c - d_r, self.d_c, d_r], dim=-1)
        if self.d_cq:
            q = self.q_up(self.q_norm(q))
        q_c, q_r = q.view(B, T, H, dh + d_r).split([dh, d_r], dim=-1)
        return q_c, rope(q_r, start), self.kv_norm(c), rope(k_r.view(B, T, 1, d_r), start)

    def _attend_rebuilt(self, q_c: Tensor, q_r: Tensor, c: Tensor, k_r: Tensor) -> Tensor:
        """Attention with per-head keys and values built from the latent: q_c (B, T, H, dh), q_r (B, T, H, d_R),
        c (B, S, d_c), k_r (B, S, 1, d_R). Returns (B, T, d)."""
        B, T, H, dh = q_c.shape
        S, d_r = c.shape[1], self.d_r
        k_c, v = self.kv_up(c).view(B, S, 2, H, dh).unbind(dim=2)  # (B, S, H, dh) each
        q = torch.cat([q_c, q_r], dim=-1)  # (B, T, H, dh + d_R)
        k = torch.cat([k_c, k_r.expand(B, S, H, d_r)], dim=-1)  # one RoPE key shared by every head
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=1.0 / math.sqrt(dh + d_r))
        return self.out(y.transpose(1, 2).reshape(B, T, H * dh))

    def forward(self, x: Tensor, rope: RotaryEmbedding) -> Tensor:
        return self._attend_rebuilt(*self._project(x, rope))

    def cache_layout(self, path: str) -> dict[str, tuple[int, ...]]:
        # One buffer [c ; k^R]: the absorbed scores read both as one key, and the values read its first d_c.
        return {"latent": (TIME, self.d_c + self.d_r)}

    def decode(self, x: Tensor, rope: RotaryEmbedding, cache: LayerCache) -> Tensor:
        B, T, _ = x.shape
        H, dh, d_c, d_r = self.n_head, self.head_dim, self.d_c, self.d_r
        q_c, q_r, c, k_r = self._project(x, rope, start=cache.length)
        new = torch.cat([c, k_r.view(B, T, d_r)], dim=-1)  # (B, T, d_c + d_R)
        latent = cache.append(latent=new)["latent"]  # (B, S, d_c + d_R), S = positions held
        if cache.path == "rebuilt":
            c_all, k_r_all = latent.split([d_c, d_r], dim=-1)
            return self._attend_rebuilt(q_c, q_r, c_all, k_r_all.unsqueeze(2))
        # Absorbed (DeepSeek-V2): kv_up's rows are [W^UK (H dh) | W^UV (H dh)] over d_c inputs.
        w_uk, w_uv = self.kv_up.weight.view(2, H, dh, d_c).unbind(dim=0)  # (H, dh, d_c) each
        q_latent = torch.einsum("bthj,hjc->bthc", q_c, w_uk)  # q^C_h W^UK_h^T: (B, T, H, d_c)
        if T == 1 and fused.usable("mla", x, latent.dtype):  # kernels/mla_decode.py: one pass over the cache
            o = fused.attempt("mla", lambda: self._decode_fused(q_latent, q_r, latent))
            if o is not None:  # None: the device cannot launch the kernel; the plain path below
                return self.out(torch.einsum("bthc,hjc->bthj", o.to(q_c.dtype), w_uv).reshape(B, T, H * dh))
        q = torch.cat([q_latent, q_r], dim=-1).transpose(1, 2)  # (B, H, T, d_c + d_R)
        kv = latent.unsqueeze(1)  # (B, 1, S, d_c + d_R): one key head shared by all H query heads
        # Scores and scale are those of the full form: (q^C_h W^UK_h^T) . c + q^R_h . k^R = q_h . k_h.
        o = attend(q, kv, kv[..., :d_c], scale=1.0 / math.sqrt(dh + d_r))  # (B, H, T, d_c), mixed latents
        y = torch.einsum("bhtc,hjc->bthj", o, w_uv)  # through W^UV_h: (B, T, H, dh)
        return self.out(y.reshape(B, T, H * dh))

    def _decode_fused(self, q_latent: Tensor, q_r: Tensor, latent: Tensor) -> Tensor:
        """The absorbed step for one new token through lightning_modules/kernels/mla_decode.py: the softmax
        mixture of the cached latents per head, (B, 1, H, d_c), fp32."""
        from lightning_modules.kernels import mla_decode as kernel  # triton is optional: only where it runs

        query = torch.cat([q_latent, q_r], dim=-1)[:, 0].float()  # (B, H, d_c + d_R)
        scale = 1.0 / math.sqrt(self.head_dim + self.d_r)
        return kernel.decode_step(query, latent, self.d_c, scale).unsqueeze(1)

    # ----- costs ------------------------------------------------------------------------------------
    @classmethod
    def score_dims(cls, model: ModelConfig, knobs: LatentKnobs) -> tuple[int, int]:
        return model.head_dim + knobs.rope_head_dim, model.head_dim

    @classmethod
    def extra_costs(cls, model: ModelConfig, knobs: LatentKnobs) -> dict[str, float]:
        # The paper counts MLA's latent only, d_c / (2 H d_h) (docs/paper-errata.md); we cache the RoPE key too.
        return {"kv_cache_vs_mha_paper_convention": knobs.kv_latent_dim / (2 * model.n_head * model.head_dim)}

    @classmethod
    def decode_flops_per_token(cls, model: ModelConfig, knobs: LatentKnobs, context: int) -> int:
        """Absorbed decode: W^UK folded into the query (q^C_h W^UK_h^T, d_h -> d_c per head), scores against
        the cached latent and RoPE key, mixing of the latent, W^UV_h folded into the output."""
        d, H, dh = model.d_model, model.n_head, model.head_dim
        d_c, d_r, d_cq = knobs.kv_latent_dim, knobs.rope_head_dim, knobs.q_latent_dim
        q_width = H * (dh + d_r)
        q_proj = 2 * (d * d_cq + d_cq * q_width if d_cq else d * q_width)
        latent_proj = 2 * d * (d_c + d_r)
        absorb = 2 * H * dh * d_c * 2  # query through W^UK_h, mixed latent through W^UV_h
        scores = 2 * context * H * (d_c + d_r)
        mixing = 2 * context * H * d_c
        return q_proj + latent_proj + absorb + scores + mixing + 2 * H * dh * d
