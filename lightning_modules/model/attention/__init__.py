"""The attention family behind one interface. Adding a variant is one file (a class with its Knobs), one
line here, one YAML fragment in conf/attention/; everything that lists attentions or knobs reads the
registry (attention/registry.py).

- base.py         the interface every attention variant implements
- cache.py        the decode cache of one attention layer
- gla.py          grouped latent attention (GLA): mla's latent in groups, one per group of query heads
- gqa.py          multi-head, grouped-query and multi-query attention
- gta.py          grouped-tied attention (GTA): one tied key-value state per group and a shared RoPE key
- kernel.py       the one place that chooses the attention kernel (docs/attentions.md)
- knobs.py        how a variant declares its knobs
- lrkv.py         low-rank key-value attention (LRKV): shared keys and values plus per-head low-rank residuals
- lrkv_cached.py  LRKV's exact decode scores from the compressed cache, keys never rebuilt
- mla.py          multi-head latent attention, DeepSeek-V2 form (docs/attentions.md, "mla")
- mlra.py         multi-head low-rank attention (MLRA): MLA's latent in blocks, branches summed per head
- registry.py     the attention registry
"""

from lightning_modules.model.attention.base import Attention
from lightning_modules.model.attention.gla import GroupedLatentAttention
from lightning_modules.model.attention.gqa import (
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiQueryAttention,
)
from lightning_modules.model.attention.gta import GroupedTiedAttention
from lightning_modules.model.attention.lrkv import LowRankKVAttention
from lightning_modules.model.attention.mla import MultiHeadLatentAttention
from lightning_modules.model.attention.mlra import MultiHeadLowRankAttention
from lightning_modules.model.attention.registry import (
    REGISTRY,
    AttentionConfig,
    Resolved,
    as_resolved,
    knob_specs,
    knob_values,
    load_configs,
    names,
    paper_names,
    register,
    resolve,
    resolve_attention,
    unregister,
)

register("mha", MultiHeadAttention, paper=True)
register("mqa", MultiQueryAttention, paper=True)
register("gqa", GroupedQueryAttention, paper=True)
register("mla", MultiHeadLatentAttention, paper=True)
register("lrkv", LowRankKVAttention, paper=True)
# Later variants, compared with the paper's arms at equal KV-cache bytes (docs/attentions.md)
register("gta", GroupedTiedAttention)
register("mlra", MultiHeadLowRankAttention)
register("gla", GroupedLatentAttention)

__all__ = [
    "REGISTRY",
    "Attention",
    "AttentionConfig",
    "GroupedQueryAttention",
    "Resolved",
    "as_resolved",
    "knob_specs",
    "knob_values",
    "load_configs",
    "names",
    "paper_names",
    "register",
    "resolve",
    "resolve_attention",
    "unregister",
]
