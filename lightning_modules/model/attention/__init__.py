"""The attention family behind one interface. Adding a variant is one file (a class with its Knobs), one
line here, one YAML fragment in conf/attention/; everything that lists attentions or knobs reads the
registry (attention/registry.py)."""

from lightning_modules.model.attention.base import Attention
from lightning_modules.model.attention.gqa import (
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiQueryAttention,
)
from lightning_modules.model.attention.lrkv import LowRankKVAttention
from lightning_modules.model.attention.mla import MultiHeadLatentAttention
from lightning_modules.model.attention.registry import (
    REGISTRY,
    AttentionConfig,
    Resolved,
    as_resolved,
    knob_specs,
    knob_values,
    load_configs,
    names,
    register,
    resolve,
    resolve_attention,
    unregister,
)

register("mha", MultiHeadAttention)
register("mqa", MultiQueryAttention)
register("gqa", GroupedQueryAttention)
register("mla", MultiHeadLatentAttention)
register("lrkv", LowRankKVAttention)

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
    "register",
    "resolve",
    "resolve_attention",
    "unregister",
]
