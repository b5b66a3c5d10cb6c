"""The attention family behind one interface. Adding a variant is one file, one line here, one YAML fragment
in conf/attention/."""

from lightning_modules.attention.base import Attention
from lightning_modules.attention.gqa import GroupedQueryAttention, MultiHeadAttention, MultiQueryAttention
from lightning_modules.attention.lrkv import LowRankKVAttention
from lightning_modules.attention.mla import MultiHeadLatentAttention

REGISTRY: dict[str, type[Attention]] = {
    "mha": MultiHeadAttention,
    "mqa": MultiQueryAttention,
    "gqa": GroupedQueryAttention,
    "mla": MultiHeadLatentAttention,
    "lrkv": LowRankKVAttention,
}

__all__ = ["REGISTRY", "Attention"]
