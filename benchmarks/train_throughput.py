"""Training throughput (forward, backward, AdamW step) of the bare decoder, per attention, on this machine.

    python benchmarks/train_throughput.py                     # nano and 20m, every attention
    python benchmarks/train_throughput.py --vs litgpt --json  # pair mha/gqa/mqa with litgpt's GPT
    python benchmarks/train_throughput.py --precision fp32    # auto (default): bf16 only where it is native
    python benchmarks/train_throughput.py --compile --kinds mha lrkv --vs litgpt --precision fp32
                                                              # + each decoder block torch.compile'd

With --vs litgpt, our mha, gqa and mqa are paired with litgpt's GPT at identical shapes (layers, width,
heads, kv groups, head size, vocabulary, no biases, RMSNorm, QK-norm, a 4d MLP) in the same process, and
the two are timed alternately so that machine noise hits both alike. litgpt's MLP is GELU, ours ReLU^2:
same matrix shapes, same FLOPs. Install it with `make litgpt` (pip install --no-deps litgpt safetensors).
LRKV is measured on both training paths (factorized and materialized) so the faster can be chosen.
With --compile every one of our models also runs with its blocks compiled (lightning_modules/distributed/compile.py,
what `model.compile: true` does), timed in the same round-robin; compilation happens in the warm-up.
The `backend` column is the attention kernel each of our eager models ran (kernel.attend's record, e.g.
sdpa:flash or sdpa:math; LRKV_SDPA_BACKEND=math forces one, docs/attentions.md "Kernel").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules.core import precision
from lightning_modules.core.errors import run_entry
from lightning_modules.costs import counts as costs
from lightning_modules.distributed.compile import compile_blocks
from lightning_modules.model.attention import (
    REGISTRY,
    AttentionConfig,
    GroupedQueryAttention,
    kernel,
    names,
    resolve,
    resolve_attention,
)
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.transformer import Transformer


def litgpt_model(model: ModelConfig, n_kv_heads: int) -> nn.Module:
    from litgpt.config import Config
    from litgpt.model import GPT

    config = Config(
        name="ref",
        block_size=model.seq_len,
        n_layer=model.n_layer,
        n_embd=model.d_model,
        n_head=model.n_head,
        head_size=model.head_dim,
        n_query_groups=n_kv_heads,
        vocab_size=model.vocab_size,
        padded_vocab_size=model.padded_vocab_size,
        bias=False,
        norm_class_name="RMSNorm",
        norm_qk=model.qk_norm,
        mlp_class_name="GptNeoxMLP",
        intermediate_size=model.mlp_ratio * model.d_model,
        rotary_percentage=1.0,
        parallel_residual=False,
        rope_base=int(model.rope_base),
    )
    return GPT(config)


def make_step(net: nn.Module, tokens: torch.Tensor, bf16: bool) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = net(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def recording(step: Callable[[], None], seen: set[str]) -> Callable[[], None]:
    """step, adding to `seen` the attention kernels it ran: the steps run round-robin, so kernel.attend's
    record must be read after each."""

    def run() -> None:
        kernel.forget()
        step()
        seen.update(kernel.kernels_seen)

    return run


def timed(step: Callable[[], None], steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return time.perf_counter() - start


def measure(
    contenders: dict[str, Callable[[], None]], steps: int, repeats: int, warmup: int
) -> dict[str, float]:
    """Median seconds per `steps` steps for each contender, timed round-robin so they share the noise."""
    for step in contenders.values():
        for _ in range(warmup):
            step()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, step in contenders.items():
            samples[name].append(timed(step, steps))
    return {name: statistics.median(s) for name, s in samples.items()}


def bench_size(size: str, args: argparse.Namespace) -> list[dict[str, object]]:
    model, _ = costs.load_configs([costs.fragment("model", size)])
    torch.manual_seed(0)
    tokens = torch.randint(0, model.vocab_size, (args.batch_size, model.seq_len + 1))
    contenders: dict[str, Callable[[], None]] = {}
    configs: dict[str, AttentionConfig] = {}
    backends: dict[str, set[str]] = {}
    for kind in args.kinds or names():
        for suffix, path in REGISTRY[kind].train_paths().items():
            attention = AttentionConfig(kind=kind, **path)  # type: ignore[arg-type]
            cls, knobs = resolve(model, attention)[1:]
            label = resolve_attention(model, attention).label() + suffix
            configs[label] = attention
            backends[label] = set()
            step = make_step(Transformer(model, attention), tokens, args.bf16)
            contenders[label] = recording(step, backends[label])
            if args.compile:
                compiled = Transformer(model, attention)
                compile_blocks(compiled.blocks)
                contenders[f"compiled:{label}"] = make_step(compiled, tokens, args.bf16)
            if args.vs == "litgpt" and issubclass(cls, GroupedQueryAttention):  # litgpt has K/V heads only
                n_kv = cls.kv_heads(model, knobs)
                contenders[f"litgpt:{label}"] = make_step(litgpt_model(model, n_kv), tokens, args.bf16)
    seconds = measure(contenders, args.steps, args.repeats, args.warmup)
    tokens_per_run = args.batch_size * model.seq_len * args.steps
    baseline = AttentionConfig(kind=costs.BASELINE).label()
    mha_rate = tokens_per_run / seconds[baseline] if baseline in seconds else None
    rows = []
    for label, attention in configs.items():
        rate = tokens_per_run / seconds[label]
        ref = seconds.get(f"litgpt:{label}")
        ref_rate = tokens_per_run / ref if ref else None
        compiled_s = seconds.get(f"compiled:{label}")
        rows.append(
            {
                "size": size,
                "attention": label,
                "params": costs.param_counts(model, attention).total,
                "train_flops_per_token": costs.train_flops_per_token(
                    model, attention, args.batch_size * model.seq_len
                ),
                "ours_tokens_per_s": round(rate, 1),
                "ref_tokens_per_s": round(ref_rate, 1) if ref_rate else None,
                "ratio": round(rate / ref_rate, 3) if ref_rate else None,
                "vs_our_mha": round(rate / mha_rate, 3) if mha_rate else None,
                "compiled_tokens_per_s": round(tokens_per_run / compiled_s, 1) if compiled_s else None,
                "compiled_vs_eager": round(seconds[label] / compiled_s, 3) if compiled_s else None,
                "backend": "+".join(sorted(backends[label])),
                "precision": "bf16" if args.bf16 else "fp32",
                "hardware": args.hardware,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="+", default=["nano", "20m"])
    parser.add_argument(
        "--vs", choices=["litgpt"], default=None, help="pair mha/gqa/mqa with a reference model"
    )
    parser.add_argument("--kinds", nargs="+", choices=names(), default=None, help="default: every attention")
    parser.add_argument(
        "--compile", action="store_true", help="also time each model with its blocks compiled"
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per contender (median taken)")
    parser.add_argument("--warmup", type=int, default=2)
    precision.add_flag(parser)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    hardware = precision.detect("cpu")
    args.hardware = hardware.capability
    args.bf16 = precision.uses_bf16(precision.from_flag(args.precision, hardware))
    print(
        f"# {hardware.name} ({hardware.capability}), {'bf16 autocast' if args.bf16 else 'fp32'}, "
        f"{torch.get_num_threads()} threads",
        file=sys.stderr,
    )
    rows = [row for size in args.sizes for row in bench_size(size, args)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(
        f"{'size':>5} {'attention':<24} {'params':>10} {'ours tok/s':>10} {'ref tok/s':>10} {'ratio':>6} {'vs mha':>6}"
        f" {'compiled tok/s':>14} {'compiled/eager':>14} backend"
    )
    for r in rows:
        ref = f"{r['ref_tokens_per_s']:>10.0f}" if r["ref_tokens_per_s"] else f"{'-':>10}"
        ratio = f"{r['ratio']:>6.2f}" if r["ratio"] else f"{'-':>6}"
        vs = f"{r['vs_our_mha']:>6.2f}" if r["vs_our_mha"] else f"{'-':>6}"
        comp = f"{r['compiled_tokens_per_s']:>14.0f}" if r["compiled_tokens_per_s"] else f"{'-':>14}"
        gain = f"{r['compiled_vs_eager']:>14.2f}" if r["compiled_vs_eager"] else f"{'-':>14}"
        print(
            f"{r['size']:>5} {r['attention']:<24} {r['params']:>10,} {r['ours_tokens_per_s']:>10.0f} {ref} {ratio} "
            f"{vs} {comp} {gain} {r['backend']}"
        )


if __name__ == "__main__":  # a bad LRKV_PRECISION or LRKV_SDPA_BACKEND: one line, not a traceback
    sys.exit(run_entry(main, "benchmarks/train_throughput.py"))
