"""Parameters, FLOPs and KV-cache bytes: pure functions of a config (docs/costs.md).

Conventions, written once:
- Parameters: total, embedding (input table + output head, the two V x d tables), non-embedding (the
  rest), attention (every parameter inside the attention modules, norms included). Read from the decoder
  built on the meta device, so they are its shapes, not a second formula (tests/test_costs.py).
- Training FLOPs per token = 3 x forward, forward = 2 x (weights multiplied per token on the training path
  that runs, output head included, embedding lookup excluded) + 2 L T H (d_qk + d_v) for the attention
  scores and mixing over the full context T (not halved for causality: PaLM / nanoGPT / torchtitan).
  Norms, RoPE and softmax are not counted. Checked against torch.utils.flop_counter (math SDPA).
- Decode FLOPs per token at context S: forward only, on the decode path each variant runs (Attention.decode:
  mla absorbed, lrkv exact with its keys rebuilt); equal to torch.utils.flop_counter's count of one
  decode step (tests/test_decode.py).
- KV-cache bytes per token: bf16 (2 bytes) x cached elements per token x layers, the elements read from the
  default decode path's cache layout; equal to the bytes a bf16 generation's caches hold
  (tests/test_decode.py, benchmarks/decode.py).

`python -m lightning_modules.costs` prints these for every size x attention; see --help.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

import torch

from lightning_modules.attention import AttentionConfig, load_configs, names, resolve
from lightning_modules.config import ConfigError, ModelConfig, fragment

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


def param_counts(model: ModelConfig, attention: AttentionConfig) -> ParamCounts:
    from lightning_modules.transformer import Transformer  # late: transformer imports nothing from here

    with torch.device("meta"):
        net = Transformer(model, attention)

    def numel(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    total = numel(net)
    embedding = numel(net.embed) + numel(net.head)  # untied input table and output head
    attn = sum(numel(block.attn) for block in net.blocks)
    return ParamCounts(total, embedding, total - embedding, attn)


def forward_flops_per_token(model: ModelConfig, attention: AttentionConfig, tokens_per_forward: int) -> float:
    cls, knobs = resolve(model, attention)[1:]
    d, L, H, T = model.d_model, model.n_layer, model.n_head, model.seq_len
    d_qk, d_v = cls.score_dims(model, knobs)
    matmul = L * (cls.train_matmul_flops_per_token(model, knobs) + 2 * 2 * d * model.mlp_ratio * d)
    head = 2 * d * model.padded_vocab_size
    scores = L * 2 * T * H * (d_qk + d_v)
    per_forward = L * cls.per_forward_flops(model, knobs) / tokens_per_forward
    return matmul + head + scores + per_forward


def train_flops_per_token(
    model: ModelConfig, attention: AttentionConfig, tokens_per_forward: int | None = None
) -> float:
    """Forward + backward FLOPs per trained token. `tokens_per_forward` (micro-batch x seq_len; default one
    sequence) only matters for paths with a per-forward cost, such as LRKV's materialized weights."""
    return 3 * forward_flops_per_token(model, attention, tokens_per_forward or model.seq_len)


def decode_flops_per_token(model: ModelConfig, attention: AttentionConfig, context: int) -> int:
    cls, knobs = resolve(model, attention)[1:]
    d = model.d_model
    per_layer = cls.decode_flops_per_token(model, knobs, context) + 2 * 2 * d * model.mlp_ratio * d
    return model.n_layer * per_layer + 2 * d * model.padded_vocab_size


def kv_cache_bytes_per_token(model: ModelConfig, attention: AttentionConfig) -> int:
    cls, knobs = resolve(model, attention)[1:]
    return CACHE_BYTES_PER_ELEMENT * cls.cache_elements_per_token(model, knobs) * model.n_layer


def mha_cache_bytes_per_token(model: ModelConfig) -> int:
    return kv_cache_bytes_per_token(model, AttentionConfig(kind=BASELINE))


def cost_row(model: ModelConfig, attention: AttentionConfig, context: int | None = None) -> dict[str, Any]:
    """Every cost of one size x attention as a flat dict (the --json row; also logged to MLflow)."""
    attention, cls, knobs = resolve(model, attention)
    context = context or model.seq_len
    params = param_counts(model, attention)
    cache = kv_cache_bytes_per_token(model, attention)
    row: dict[str, Any] = {
        "size": model.name,
        "attention": attention.kind,
        "label": attention.label(),
        "params": params.total,
        "embedding_params": params.embedding,
        "non_embedding_params": params.non_embedding,
        "attention_params": params.attention,
        "train_flops_per_token": train_flops_per_token(model, attention),
        "decode_context": context,
        "decode_flops_per_token": decode_flops_per_token(model, attention, context),
        "kv_cache_bytes_per_token": cache,
        "kv_cache_vs_mha": cache / mha_cache_bytes_per_token(model),
    }
    row.update(cls.extra_costs(model, knobs))
    return row


def default_rows(context: int | None) -> list[dict[str, Any]]:
    rows = []
    for size in TABLE_SIZES:
        for kind in names():
            # The kind alone: conf/attention/<kind>.yaml sets nothing else, and a kind registered without a
            # fragment (tests/test_registry.py) still gets its row.
            model = load_configs([fragment("model", size)])[0]
            rows.append(cost_row(model, AttentionConfig(kind=kind), context))
    return rows


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def format_table(rows: list[dict[str, Any]]) -> str:
    header = f"{'size':>6} {'attention':<10} {'params':>9} {'non-emb':>9} {'attn':>9} {'train F/tok':>11} "
    header += f"{'decode F/tok':>12} {'KV B/tok':>10} {'KV vs MHA':>9}"
    lines = [header, "-" * len(header)]
    for r in rows:
        vs = f"{100 * r['kv_cache_vs_mha']:.1f}%"
        if "kv_cache_vs_mha_paper_convention" in r:
            vs += f" (paper: {100 * r['kv_cache_vs_mha_paper_convention']:.1f}%)"
        lines.append(
            f"{r['size']:>6} {r['label']:<10} {_human(r['params']):>9} {_human(r['non_embedding_params']):>9} "
            f"{_human(r['attention_params']):>9} {_human(r['train_flops_per_token']):>11} "
            f"{_human(r['decode_flops_per_token']):>12} {r['kv_cache_bytes_per_token']:>10,} {vs:>9}"
        )
    lines.append(
        "train F/tok: forward+backward FLOPs per token at the size's full context; decode F/tok: one new token "
        "at that context; KV B/tok: bf16 cache bytes per token, all layers (docs/costs.md)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_modules.costs",
        description="Parameters, training and decode FLOPs per token and KV-cache bytes for sizes x attentions. "
        "With no --config: every paper size and nano x every attention with the paper's per-size settings.",
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        help="YAML fragment(s) as given to main.py, composed in order",
    )
    parser.add_argument("--context", type=int, default=None, help="decode context length (default: seq_len)")
    parser.add_argument("--json", action="store_true", help="print a JSON list of rows instead of a table")
    args = parser.parse_args(argv)
    try:
        if args.config:
            rows = [cost_row(*load_configs(args.config), args.context)]
        else:
            rows = default_rows(args.context)
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
