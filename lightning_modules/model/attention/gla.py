"""Grouped latent attention (GLA; Zadouri, Strauss, Dao, arXiv 2505.21487; docs/attentions.md, "gla").

MLA's latent c (d_c wide) cut into G latent heads c_1 .. c_G of width d_c / G, each RMS-normalised on its own;
the query heads split into G consecutive groups, and head h of group g reads only c_g: k^C_h = c_g W^UK_h,
v_h = c_g W^UV_h, with mla's one shared RoPE key and scale 1 / sqrt(d_h + d_R). Each latent head can then sit
on its own tensor-parallel rank. GLA-2 is G = 2.

The layer is mlra.py's latent-block attention with one branch (each head attends once). Conventions the paper
leaves open follow the authors' code (Dao-AILab/grouped-latent-attention, modeling_llama_GLA): consecutive
heads per latent head, a norm per latent head, and no sqrt(d / w) scaling of the latents or the query latent
(MLRA's; the authors' GLA has none), so with latent_init as mla's `fixed` keys start at std 0.02 sqrt(w).
Decode caches the G normalised latent heads and the RoPE key, d_c + d_R per token, as mla.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_modules.model.attention.knobs import knob
from lightning_modules.model.attention.mlra import LatentBlockAttention
from lightning_modules.model.config import ModelConfig


@dataclass(frozen=True)
class GroupedLatentKnobs:
    kv_latent_dim: int = knob("compressed KV width d_c", minimum=1)
    rope_head_dim: int = knob("decoupled RoPE key width d_R (even)", minimum=1)
    q_latent_dim: int = knob("query compression width (0: no query compression)", minimum=0)
    gla_groups: int = knob(
        "GLA-G: latent heads, each read by n_head / G consecutive heads (paper: 2)", minimum=1
    )


class GroupedLatentAttention(LatentBlockAttention):
    Knobs = GroupedLatentKnobs
    label_suffix = "{gla_groups}-c{kv_latent_dim}"
    plot_style = {"color": "tab:olive", "linestyle": ":"}  # a latent cache: dotted, like mla
    latent_scaling = False

    @classmethod
    def blocks(cls, knobs: GroupedLatentKnobs) -> int:
        return knobs.gla_groups

    @classmethod
    def branches(cls, knobs: GroupedLatentKnobs) -> int:
        return 1

    @classmethod
    def default_knobs(cls, model: ModelConfig) -> dict[str, object]:
        # The authors' GLA-2: two latent heads of 2 d_h each (d_c = 4 d_h), d_R = d_h / 2.
        return {
            "kv_latent_dim": 4 * model.head_dim,
            "rope_head_dim": model.head_dim // 2,
            "q_latent_dim": 0,
            "gla_groups": 2,
        }
