"""Parameters, FLOPs and KV-cache bytes: pure functions of a config (DESIGN.md "Costs").

Conventions, written once:
- Parameters: total, embedding (input table + output head, the two V x d tables), non-embedding (the
  rest), attention (every parameter inside the attention modules, norms included). Equal to
  sum(p.numel()) of the built model (tests/test_costs.py).
- Training FLOPs per token = 3 x forward, forward = 2 x (weights multiplied per token on the training path
  that runs, output head included, embedding lookup excluded) + 2 L T H (d_qk + d_v) for the attention
  scores and mixing over the full context T (not halved for causality: PaLM / nanoGPT / torchtitan).
  Norms, RoPE and softmax are not counted. Checked against torch.utils.flop_counter (math SDPA).
- Decode FLOPs per token at context S: forward only, on the decode path each variant runs (Attention.decode:
  mla absorbed, lrkv exact with its keys rebuilt); equal to torch.utils.flop_counter's count of one
  decode step (tests/test_decode.py).
- KV-cache bytes per token: bf16 (2 bytes) x cached elements per token x layers; equal to the bytes a bf16
  generation's caches hold (tests/test_decode.py, benchmarks/decode.py).

`python -m lightning_modules.costs` prints these for every size x attention; see --help.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_modules.attention import REGISTRY
from lightning_modules.config import AttentionConfig, ConfigError, ModelConfig, resolve_attention

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
PAPER_SIZES = ("128m", "1b", "2.5b", "6.3b")
TABLE_SIZES = ("nano", *PAPER_SIZES)
ATTENTIONS = ("mha", "mqa", "gqa", "mla", "lrkv")
CACHE_BYTES_PER_ELEMENT = 2  # bf16


@dataclass(frozen=True)
class ParamCounts:
    total: int
    embedding: int
    non_embedding: int
    attention: int


def param_counts(model: ModelConfig, attention: AttentionConfig) -> ParamCounts:
    attention = resolve_attention(model, attention)
    cls = REGISTRY[attention.kind]
    d, L = model.d_model, model.n_layer
    attn = sum(cls.param_counts(model, attention))
    mlp = 2 * d * model.mlp_ratio * d
    block = attn + mlp + 2 * d  # two pre-norm gains
    embedding = 2 * model.padded_vocab_size * d  # untied input table and output head
    non_embedding = L * block + d  # final norm gain
    return ParamCounts(embedding + non_embedding, embedding, non_embedding, L * attn)


def forward_flops_per_token(model: ModelConfig, attention: AttentionConfig, tokens_per_forward: int) -> float:
    attention = resolve_attention(model, attention)
    cls = REGISTRY[attention.kind]
    d, L, H, T = model.d_model, model.n_layer, model.n_head, model.seq_len
    d_qk, d_v = cls.score_dims(model, attention)
    matmul = L * (cls.train_matmul_flops_per_token(model, attention) + 2 * 2 * d * model.mlp_ratio * d)
    head = 2 * d * model.padded_vocab_size
    scores = L * 2 * T * H * (d_qk + d_v)
    per_forward = L * cls.per_forward_flops(model, attention) / tokens_per_forward
    return matmul + head + scores + per_forward


def train_flops_per_token(
    model: ModelConfig, attention: AttentionConfig, tokens_per_forward: int | None = None
) -> float:
    """Forward + backward FLOPs per trained token. `tokens_per_forward` (micro-batch x seq_len; default one
    sequence) only matters for paths with a per-forward cost, such as LRKV's materialized weights."""
    return 3 * forward_flops_per_token(model, attention, tokens_per_forward or model.seq_len)


def decode_flops_per_token(model: ModelConfig, attention: AttentionConfig, context: int) -> int:
    attention = resolve_attention(model, attention)
    cls = REGISTRY[attention.kind]
    d = model.d_model
    per_layer = cls.decode_flops_per_token(model, attention, context) + 2 * 2 * d * model.mlp_ratio * d
    return model.n_layer * per_layer + 2 * d * model.padded_vocab_size


def kv_cache_bytes_per_token(model: ModelConfig, attention: AttentionConfig) -> int:
    attention = resolve_attention(model, attention)
    elements = REGISTRY[attention.kind].cache_elements_per_token(model, attention)
    return CACHE_BYTES_PER_ELEMENT * elements * model.n_layer


def mha_cache_bytes_per_token(model: ModelConfig) -> int:
    return kv_cache_bytes_per_token(model, AttentionConfig(kind="mha"))


def cost_row(model: ModelConfig, attention: AttentionConfig, context: int | None = None) -> dict[str, Any]:
    """Every cost of one size x attention as a flat dict (the --json row; also logged to MLflow)."""
    attention = resolve_attention(model, attention)
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
    if attention.kind == "mla":
        # The paper counts MLA's latent only, d_c / (2 H d_h) (PAPER.md); we cache the RoPE key too.
        assert attention.kv_latent_dim is not None
        row["kv_cache_vs_mha_paper_convention"] = attention.kv_latent_dim / (
            2 * model.n_head * model.head_dim
        )
    return row


# ----- composing configs from conf/ fragments, as LightningCLI does -------------------------------------
def _merge(into: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def load_configs(paths: list[str | Path]) -> tuple[ModelConfig, AttentionConfig]:
    """Compose YAML fragments in order (later keys win) and build model.arch and model.attention from them."""
    import yaml

    merged: dict[str, Any] = {}
    for path in paths:
        with open(path) as f:
            _merge(merged, yaml.safe_load(f) or {})
    section = merged.get("model", {})
    try:
        return ModelConfig(**section.get("arch", {})), AttentionConfig(**section.get("attention", {}))
    except TypeError as e:  # an unknown key: name it as the config path
        raise ConfigError(f"model.arch / model.attention: {e}") from e


def fragment(kind: str, name: str) -> Path:
    path = CONF_DIR / kind / f"{name}.yaml"
    if not path.exists():
        allowed = sorted(p.stem for p in (CONF_DIR / kind).glob("*.yaml"))
        raise ConfigError(f"no conf/{kind}/{name}.yaml; allowed: {', '.join(allowed)}")
    return path


def default_rows(context: int | None) -> list[dict[str, Any]]:
    rows = []
    for size in TABLE_SIZES:
        for kind in ATTENTIONS:
            model, attention = load_configs([fragment("model", size), fragment("attention", kind)])
            rows.append(cost_row(model, attention, context))
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
        "at that context; KV B/tok: bf16 cache bytes per token, all layers (DESIGN.md, Costs)."
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
    parser.add_argument(
        "--memory", action="store_true", help="per-rank memory plan (lightning_modules/memory.py)"
    )
    args, rest = parser.parse_known_args(argv)
    if args.memory:  # the plan's own options (--size, --strategy, ...) are parsed by its module
        from lightning_modules.memory_cli import main as memory_main

        return memory_main(args.config, rest, args.json)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
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
