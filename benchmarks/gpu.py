"""GPU training throughput per attention: tokens/s, MFU, peak memory, flash-attn against SDPA (one H200,
under 10 minutes with the defaults).

    python benchmarks/gpu.py                  # 128m and 1b, every attention, both kernels: a table
    python benchmarks/gpu.py --json           # the same rows as JSON
    python benchmarks/gpu.py --compile off    # eager only (default: both, compiled and eager)
    python benchmarks/gpu.py --device cpu --sizes nano --seq-len 32 --batch-size 2 --steps 1 --warmup 1
                                              # smoke run of the same code on a CPU (no figures)

A timed step is what a training step of LanguageModel runs under Lightning's bf16-mixed on one device: the
decoder's forward under bf16 autocast, fp32 cross-entropy, backward, gradient clipping at 1.0 and the
paper's optimiser (MuonAdamW: Muon for block matrices, AdamW for embedding, head and gains; --optimizer
adamw for AdamW everywhere), eager and with each decoder block torch.compile'd (`model.compile: true`,
lightning_modules/distributed/compile.py; compilation happens in the warm-up). Micro-batches are the paper's per-GPU ones (conf/recipe: 16 x 2048
at 128m, 8 x 2048 at 1b). MFU = achieved training FLOPs/s (lightning_modules/costs/counts.py's convention) / the device's peak
dense bf16 rate (lightning_modules/training/throughput.py's table). Peak memory is torch's max allocated over the
timed steps, printed next to the memory plan's peak for the same setting (lightning_modules/costs/memory.py,
`python -m lightning_modules.costs --memory`), so the first GPU run checks the plan too.

The kernel is chosen by lightning_modules/model/attention/kernel.attend: "sdpa" rows hide flash-attn from it,
"flash" rows need `pip install .[flash]`; `kernel_ran` is what attend actually used (MLA, with unequal
q/k and v head dims, always runs SDPA, so it has one row). LRKV is measured on both training paths
(docs/attentions.md: both lrkv paths are measured). A size or row that does not fit in memory is reported as "oom".

Targets: mha at 128m, sequence 2048, bf16 >= 45 % MFU; every variant >= 90 % of mha's tokens/s
at the same size (best kernel each). Without CUDA the script says so and exits 0: the GPU figures stay
pending in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from lightning_modules.core import precision
from lightning_modules.costs import counts as costs
from lightning_modules.costs import memory
from lightning_modules.distributed.compile import compile_blocks
from lightning_modules.model.attention import (
    REGISTRY,
    AttentionConfig,
    kernel,
    names,
    resolve,
    resolve_attention,
)
from lightning_modules.model.transformer import Transformer
from lightning_modules.optim.setup import OptimizerConfig, build_optimizer
from lightning_modules.training.throughput import device_peak_flops

MICRO_BATCH = {"128m": 16, "1b": 8, "2.5b": 8, "6.3b": 8}  # conf/recipe/<size>.yaml
MFU_TARGET = 0.45
VS_MHA_TARGET = 0.90


@contextlib.contextmanager
def kernel_choice(name: str) -> Iterator[None]:
    """ "sdpa": attend sees no flash-attn; "flash": attend uses it wherever it can."""
    saved = kernel.flash_attn_func
    if name == "sdpa":
        kernel.flash_attn_func = None
    try:
        yield
    finally:
        kernel.flash_attn_func = saved


def variants() -> list[tuple[str, str | None]]:
    """(kind, training path or None) for every registered attention and each of its training paths."""
    return [
        (kind, next(iter(override.values()), None))
        for kind in names()
        for override in REGISTRY[kind].train_paths().values()
    ]


def configs(size: str, kind: str, path: str | None, args: argparse.Namespace) -> tuple[Any, Any]:
    """The size (at --seq-len if given) and its attention resolved, on training path `path` if not None."""
    model, attention = costs.load_configs([costs.fragment("model", size), costs.fragment("attention", kind)])
    if args.seq_len:
        model = dataclasses.replace(model, seq_len=args.seq_len)
    path_knob = REGISTRY[kind].train_path_knob
    attention = resolve_attention(
        model, dataclasses.replace(attention, **{path_knob: path}) if path and path_knob else attention
    )
    return model, attention


def flash_can_run(size: str, kind: str, args: argparse.Namespace) -> bool:
    """flash-attn needs equal q/k and v head dims: where they differ (MLA's decoupled RoPE key) attend runs
    SDPA whatever is installed, so there is no flash row to measure."""
    model, attention = configs(size, kind, None, args)
    _, cls, knobs = resolve(model, attention)
    d_qk, d_v = cls.score_dims(model, knobs)
    return d_qk == d_v


def measure(
    size: str,
    kind: str,
    path: str | None,
    kernel_name: str,
    compiled: bool,
    args: argparse.Namespace,
    device: torch.device,
) -> dict[str, Any]:
    model, attention = configs(size, kind, path, args)
    batch = args.batch_size or MICRO_BATCH.get(size, 8)
    label = attention.label() + (f" ({path})" if path else "")
    row: dict[str, Any] = {"size": size, "attention": label, "kernel": kernel_name, "batch": batch}
    row["seq_len"] = model.seq_len
    row["compile"] = compiled
    row["plan_peak_gib"] = round(plan_peak(model, attention, batch, args) / 2**30, 2)
    cuda = device.type == "cuda"
    try:
        seconds = time_steps(model, attention, batch, kernel_name, compiled, args, device)
        row["kernel_ran"] = kernel.last_kernel
        tokens_per_s = batch * model.seq_len * args.steps / seconds
        flops_per_token = costs.train_flops_per_token(model, attention, batch * model.seq_len)
        peak = device_peak_flops(device)
        row["tokens_per_s"] = round(tokens_per_s)
        row["mfu"] = round(tokens_per_s * flops_per_token / peak, 4) if peak else None
        row["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if cuda else None
        row["status"] = "ok"
    except torch.OutOfMemoryError:
        row.update(kernel_ran=None, tokens_per_s=None, mfu=None, peak_mem_gib=None, status="oom")
    finally:
        if cuda:  # time_steps' model, optimiser and batch are freed by now: release their cached blocks
            torch.cuda.empty_cache()
    return row


def time_steps(
    model: Any,
    attention: Any,
    batch: int,
    kernel_name: str,
    compiled: bool,
    args: argparse.Namespace,
    device: torch.device,
) -> float:
    """Seconds of args.steps training steps after the warm-up (the module docstring's step), peak memory
    statistics reset before them on a GPU."""
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    with torch.device(device):
        net = Transformer(model, attention)
        tokens = torch.randint(0, model.vocab_size, (batch, model.seq_len + 1))
    if compiled:
        compile_blocks(net.blocks)
    optimizer = build_optimizer(
        net, OptimizerConfig(name=args.optimizer, lr=0.02, embed_lr=0.2, head_lr=0.004)
    )

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            logits = net(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    with kernel_choice(kernel_name):
        for _ in range(max(args.warmup, 1) if compiled else args.warmup):  # compiled in the warm-up
            step()
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - start


def plan_peak(model: Any, attention: Any, batch: int, args: argparse.Namespace) -> int:
    """The memory plan's peak for this row's step: one device, this micro-batch, precision and optimiser."""
    setup = memory.Setup(
        micro_batch=batch, precision="bf16-mixed" if args.bf16 else "32-true", optimizer=args.optimizer
    )
    return memory.plan(model, attention, setup).peak


def compare(rows: list[dict[str, Any]]) -> list[str]:
    """vs_mha per row (same size, kernel and compile setting), and the issue's targets as PASS / FAIL lines
    (best row of each attention: kernel and compile setting each at their best)."""
    lines = []
    baseline = AttentionConfig(kind=costs.BASELINE).label()
    for size in sorted({r["size"] for r in rows}, key=[r["size"] for r in rows].index):
        ok = [r for r in rows if r["size"] == size and r["status"] == "ok"]
        mha = {
            (r["kernel"], r.get("compile", False)): r["tokens_per_s"]
            for r in ok
            if r["attention"] == baseline
        }
        for r in ok:
            compiled = r.get("compile", False)
            ref = mha.get((r["kernel"], compiled)) or mha.get(("sdpa", compiled))
            r["vs_mha"] = round(r["tokens_per_s"] / ref, 3) if ref else None
        best: dict[str, dict[str, Any]] = {}
        for r in ok:
            kind = r["attention"].split("(")[0].split("-")[0].strip()
            if kind not in best or r["tokens_per_s"] > best[kind]["tokens_per_s"]:
                best[kind] = r
        if baseline not in best:
            continue
        top = best[baseline]
        if size == "128m" and top["mfu"] is not None and top["seq_len"] == 2048:
            verdict = "PASS" if top["mfu"] >= MFU_TARGET else "FAIL"
            lines.append(
                f"{verdict} {size} {baseline} MFU {top['mfu']:.1%} (target >= {MFU_TARGET:.0%}, {top['kernel']}"
                + (", compiled)" if top.get("compile") else ")")
            )
        for r in best.values():
            ratio = r["tokens_per_s"] / top["tokens_per_s"]
            verdict = "PASS" if ratio >= VS_MHA_TARGET else "FAIL"
            lines.append(
                f"{verdict} {size} {r['attention']} {ratio:.1%} of {baseline}'s tokens/s (target >= 90 %)"
            )
    return lines


def environment(device: torch.device, argv: list[str], bf16: bool) -> dict[str, Any]:
    try:
        import flash_attn  # type: ignore[import-not-found]

        flash = flash_attn.__version__
    except ImportError:
        flash = None
    hardware = precision.detect(device.type)
    return {
        "date": time.strftime("%Y-%m-%d"),
        "device": hardware.name,
        "hardware": hardware.capability,
        "precision": "bf16 autocast" if bf16 else "fp32",
        "torch": torch.__version__,
        "flash_attn": flash,
        "command": " ".join(["python", "benchmarks/gpu.py", *argv]),
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = "| size | attention | kernel | compile | ran | batch x seq | tokens/s | MFU | peak GiB | plan GiB | vs mha |"
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-"
        mem = f"{r['peak_mem_gib']:.1f}" if r.get("peak_mem_gib") is not None else "-"
        tps = f"{r['tokens_per_s']:,}" if r.get("tokens_per_s") is not None else r["status"]
        vs = f"{r['vs_mha']:.2f}" if r.get("vs_mha") is not None else "-"
        plan = f"{r['plan_peak_gib']:.1f}" if r.get("plan_peak_gib") is not None else "-"
        lines.append(
            f"| {r['size']} | {r['attention']} | {r['kernel']} | {'on' if r.get('compile') else 'off'} | "
            f"{r.get('kernel_ran') or '-'} | {r['batch']} x {r['seq_len']} | {tps} | {mfu} | {mem} | {plan} | {vs} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="+", default=["128m", "1b"])
    parser.add_argument("--kernels", nargs="+", choices=["flash", "sdpa"], default=["flash", "sdpa"])
    parser.add_argument("--batch-size", type=int, default=None, help="default: the paper's micro-batch")
    parser.add_argument("--seq-len", type=int, default=None, help="default: the size's (2048)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--optimizer", choices=["muon", "adamw"], default="muon")
    parser.add_argument(
        "--compile", choices=["both", "on", "off"], default="both", help="torch.compile per block"
    )
    parser.add_argument("--kinds", nargs="+", choices=names(), default=names())
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run")
    parser.add_argument("--budget-minutes", type=float, default=9.0, help="rows after this are skipped")
    parser.add_argument("--json", action="store_true")
    precision.add_flag(parser)
    return parser


def measure_all(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    """Every selected size x variant x kernel x compile setting; rows past the time budget are "skipped"."""
    start = time.perf_counter()
    rows = []
    for size in args.sizes:
        compile_settings = {"both": (False, True), "on": (True,), "off": (False,)}[args.compile]
        for (kind, path), kernel_name, compiled in itertools.product(
            variants(), args.kernels, compile_settings
        ):
            if kind not in args.kinds:
                continue
            if kernel_name == "flash" and not flash_can_run(size, kind, args):
                continue  # unequal head dims: attend runs SDPA whatever is installed
            if kernel_name == "flash" and kernel.flash_attn_func is None:
                continue  # nothing to compare: say so below
            if time.perf_counter() - start > args.budget_minutes * 60:
                rows.append(
                    {
                        "size": size,
                        "attention": kind,
                        "kernel": kernel_name,
                        "compile": compiled,
                        "status": "skipped",
                    }
                )
                continue
            rows.append(measure(size, kind, path, kernel_name, compiled, args, device))
            if not args.json:
                print(
                    f"  measured {rows[-1]['size']} {rows[-1]['attention']} {kernel_name}"
                    f" {'compiled' if compiled else 'eager'}",
                    file=sys.stderr,
                )
    return [r for r in rows if r["status"] != "skipped"] + [r for r in rows if r["status"] == "skipped"]


def report(
    rows: list[dict[str, Any]], args: argparse.Namespace, device: torch.device, argv: list[str]
) -> None:
    """The rows and the targets' verdicts: as JSON with --json, else a markdown table."""
    verdicts = compare([r for r in rows if r["status"] != "skipped"])
    env = environment(device, argv, args.bf16)
    if "flash" in args.kernels and kernel.flash_attn_func is None:
        verdicts.insert(0, "NOTE flash-attn not installed (pip install .[flash]): SDPA rows only")
    if args.json:
        print(json.dumps({"environment": env, "rows": rows, "targets": verdicts}, indent=1))
        return
    print(f"{env['date']}, {env['device']}, torch {env['torch']}, flash-attn {env['flash_attn']}")
    print(f"command: {env['command']}\n")
    print(table([r for r in rows if r["status"] != "skipped"]))
    print()
    print("\n".join(verdicts))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    device = torch.device(args.device)
    args.bf16 = precision.uses_bf16(precision.from_flag(args.precision, precision.detect(device.type)))
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "benchmarks/gpu.py: no CUDA device here; the GPU figures stay pending in BENCHMARKS.md.",
            file=sys.stderr,
        )
        return 0
    if device.type == "cuda":
        torch.cuda.set_device(device)
    report(measure_all(args, device), args, device, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
