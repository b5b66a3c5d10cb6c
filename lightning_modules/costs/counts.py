"""Parameters, FLOPs and KV-cache bytes: pure functions of a config (docs/costs.md).

Conventions, written once:
- Parameters: total, embedding (input table + output head, the two V x d tables), non-embedding (the
  rest), attention (every parameter inside the attention modules, norms included). Read from the decoder
  built on the meta device, so they are its shapes, not a second formula (tests/costs/test_costs.py).
- Training FLOPs per token = 3 x forward, forward = 2 x (weights multiplied per token on the training path
  that runs, output head included, embedding lookup excluded) + 2 L T H (d_qk + d_v) for the attention
  scores and mixing over the full context T (not halved for causality: PaLM / nanoGPT / torchtitan).
  Norms, RoPE and softmax are not counted. Checked against torch.utils.flop_counter (math SDPA).
- Decode FLOPs per token at context S: forward only, on the decode path each variant runs (Attention.decode:
  mla absorbed, lrkv exact with its keys rebuilt); equal to torch.utils.flop_counter's count of one
  decode step (tests/model/test_decode.py).
- KV-cache bytes per token: bf16 (2 bytes) x cached elements per token x layers, the elements read from the
  default decode path's cache layout; equal to the bytes a bf16 generation's caches hold
  (tests/model/test_decode.py, benchmarks/decode.py).

`python -m lightning_modules costs` prints these for every size x attention (costs/table.py); see --help.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lightning_modules.core.fragments import fragment
from lightning_modules.model.attention import AttentionConfig, Resolved, as_resolved, load_configs, names
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.transformer import Transformer

PAPER_SIZES = ("128m", "1b", "2.5b", "6.3b")
TABLE_SIZES = ("nano", *PAPER_SIZES)
BASELINE = "mha"  # what "vs MHA" columns divide by: the attention every other one is compared with
CACHE_BYTES_PER_ELEMENT = 2  # bf16


@dataclass(frozen=True)
class ParamCounts:
    total: int
    embedding: int
    non_embedding: int
    attention: int


def param_counts(model: ModelConfig, attention: AttentionConfig | Resolved) -> ParamCounts:
    with torch.device("meta"):
        net = Transformer(model, attention)

    def numel(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    total = numel(net)
    embedding = numel(net.embed) + numel(net.head)  # untied input table and output head
    attn = sum(numel(block.attn) for block in net.blocks)
    return ParamCounts(total, embedding, total - embedding, attn)


def forward_flops_per_token(
    model: ModelConfig, attention: AttentionConfig | Resolved, tokens_per_forward: int
) -> float:
    cls, knobs = as_resolved(model, attention)[1:]
    d, L, H, T = model.d_model, model.n_layer, model.n_head, model.seq_len
    d_qk, d_v = cls.score_dims(model, knobs)
    matmul = L * (cls.train_matmul_flops_per_token(model, knobs) + 2 * 2 * d * model.mlp_ratio * d)
    head = 2 * d * model.padded_vocab_size
    scores = L * 2 * T * H * (d_qk + d_v)
    per_forward = L * cls.per_forward_flops(model, knobs) / tokens_per_forward
    return matmul + head + scores + per_forward


def train_flops_per_token(
    model: ModelConfig, attention: AttentionConfig | Resolved, tokens_per_forward: int | None = None
) -> float:
    """Forward + backward FLOPs per trained token. `tokens_per_forward` (micro-batch x seq_len; default one
    sequence) only matters for paths with a per-forward cost, such as LRKV's materialized weights."""
    return 3 * forward_flops_per_token(model, attention, tokens_per_forward or model.seq_len)


def decode_flops_per_token(model: ModelConfig, attention: AttentionConfig | Resolved, context: int) -> int:
    cls, knobs = as_resolved(model, attention)[1:]
    d = model.d_model
    per_layer = cls.decode_flops_per_token(model, knobs, context) + 2 * 2 * d * model.mlp_ratio * d
    return model.n_layer * per_layer + 2 * d * model.padded_vocab_size


def kv_cache_bytes_per_token(model: ModelConfig, attention: AttentionConfig | Resolved) -> int:
    cls, knobs = as_resolved(model, attention)[1:]
    return CACHE_BYTES_PER_ELEMENT * cls.cache_elements_per_token(model, knobs) * model.n_layer


def mha_cache_bytes_per_token(model: ModelConfig) -> int:
    return kv_cache_bytes_per_token(model, AttentionConfig(kind=BASELINE))


def cost_row(
    model: ModelConfig, attention: AttentionConfig | Resolved, context: int | None = None
) -> dict[str, Any]:
    """Every cost of one size x attention as a flat dict (the --json row; also logged to MLflow)."""
    resolved = as_resolved(model, attention)  # once: every count below takes it as it is
    config, cls, knobs = resolved
    context = context or model.seq_len
    params = param_counts(model, resolved)
    cache = kv_cache_bytes_per_token(model, resolved)
    row: dict[str, Any] = {
        "size": model.name,
        "attention": config.kind,
        "label": config.label(),
        "params": params.total,
        "embedding_params": params.embedding,
        "non_embedding_params": params.non_embedding,
        "attention_params": params.attention,
        "train_flops_per_token": train_flops_per_token(model, resolved),
        "decode_context": context,
        "decode_flops_per_token": decode_flops_per_token(model, resolved, context),
        "kv_cache_bytes_per_token": cache,
        "kv_cache_vs_mha": cache / mha_cache_bytes_per_token(model),
    }
    row.update(cls.extra_costs(model, knobs))
    return row


def default_rows(context: int | None) -> list[dict[str, Any]]:
    rows = []
    for size in TABLE_SIZES:
        model = load_configs([fragment("model", size)])[0]
        for kind in names():
            # The kind alone: conf/attention/<kind>.yaml sets nothing else, and a kind registered without a
            # fragment (tests/model/test_registry.py) still gets its row.
            rows.append(cost_row(model, AttentionConfig(kind=kind), context))
    return rows
