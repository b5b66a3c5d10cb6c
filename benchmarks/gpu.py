"""GPU training throughput per attention: tokens/s, MFU, peak memory, flash-attn against SDPA (one H200,
under 10 minutes with the defaults).

    python benchmarks/gpu.py                  # 128m and 1b, every attention, both kernels: a table
    python benchmarks/gpu.py --json           # each row as a JSON line as it is measured, then the whole
                                              # report as the last line
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
`python -m lightning_modules costs --memory`), so the first GPU run checks the plan too.

The kernel is chosen by lightning_modules/model/attention/kernel.attend: "sdpa" rows hide flash-attn from it,
"flash" rows need `pip install .[flash]`; `kernel_ran` is what attend actually used (MLA, with unequal
q/k and v head dims, always runs SDPA, so it has one row). LRKV is measured on both training paths
(docs/attentions.md: both lrkv paths are measured). A size or row that does not fit in memory is reported as "oom".

Isolation: each size runs in its own child process (`--one-size`, hidden; the parent collects its rows as
JSON lines), so no size inherits Dynamo's caches from another (a change of shapes from 128m to 1b would mark
dimensions dynamic), and Dynamo is reset (torch.compiler.reset) before every row, so no row runs past the
recompile limit because of the rows before it. `recompiles` is the row's count of recompilations, read from
torch._dynamo.utils.get_compilation_metrics (torch 2.11 and 2.13 alike): a compile with a recompile reason
that did not fail. A row that hit Dynamo's recompile limit ran part of its steps eager: its status says
"recompile-limit", it is kept out of the verdicts, and a warning says so. A row's error or OOM is that row's
status ("error" with the message, "oom"); a child that dies (a CUDA error that poisons its context, a
crash) costs the row it was on ("crashed") and a fresh child runs the rest. `--in-process` runs every row
here instead (for a debugger; Dynamo still reset between rows).

MFU's convention: causal attention's scores and mixing are counted over the full T^2 (counts.py, as PaLM,
nanoGPT and torchtitan do); `mfu_causal_half` counts them over T^2 / 2 (as FlashAttention's benchmarks do).
The targets are read on `mfu`.

Targets: mha's best row of each size, eager and compiled, at or above the MFU first principles predict for its
size, micro-batch, sequence and device (lightning_modules/costs/step_time.py; BENCHMARKS.md, "GPU", gives the
figures and their arithmetic); every variant >= 90 % of mha's tokens/s at the same size (best kernel each). Without CUDA the script says so and exits 0: the GPU figures
stay pending in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch._dynamo.utils as dynamo_utils
import torch.nn.functional as F

from lightning_modules.core import precision
from lightning_modules.costs import counts as costs
from lightning_modules.costs import memory, step_time
from lightning_modules.distributed.compile import compile_blocks
from lightning_modules.model.attention import (
    REGISTRY,
    AttentionConfig,
    kernel,
    names,
    paper_names,
    resolve,
    resolve_attention,
)
from lightning_modules.model.transformer import Transformer
from lightning_modules.optim.setup import OptimizerConfig, build_optimizer
from lightning_modules.training.throughput import causal_half_flops_per_token, device_peak_flops

ROOT = Path(__file__).resolve().parents[1]
# Prefixes a JSON row on stdout (a child's to its parent; with --json the parent's own, as each row comes), so
# that nothing else is taken for one.
ROW_MARK = "gpu.py row: "
MICRO_BATCH = {"128m": 16, "1b": 8, "2.5b": 8, "6.3b": 8}  # conf/recipe/<size>.yaml
# How Dynamo's failure on the limit reads, in the releases pyproject.toml allows (older ones said cache size).
LIMIT_NAMES = ("recompile limit", "recompile_limit", "cache_size_limit", "cache size limit")
CHILD_GRACE_S = 600  # how long past the budget a child may run before it is ended
# What a compiled row is assumed to take before one has been timed (most of it compiling, at 128m): a compiled
# row starts only with this much of the budget left, or with as long as the longest compiled row so far took.
COMPILED_ROW_S = 60.0
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


Spec = tuple[str, str | None, str, bool]  # (kind, training path or None, kernel, compiled): one row


def measure(
    size: str,
    kind: str,
    path: str | None,
    kernel_name: str,
    compiled: bool,
    args: argparse.Namespace,
    device: torch.device,
) -> dict[str, Any]:
    """One row. Its own failure (an error, OOM, the recompile limit) is its status; nothing raises."""
    row: dict[str, Any] = {"size": size, "attention": kind + (f" ({path})" if path else "")}
    row.update(kernel=kernel_name, compile=compiled, batch=args.batch_size or MICRO_BATCH.get(size, 8))
    row.update(kernel_ran=None, tokens_per_s=None, mfu=None, mfu_causal_half=None, peak_mem_gib=None)
    row["recompiles"] = None
    cuda = device.type == "cuda"
    try:
        model, attention = configs(size, kind, path, args)
        row["attention"] = attention.label() + (f" ({path})" if path else "")
        row["seq_len"] = model.seq_len
        row["plan_peak_gib"] = round(plan_peak(model, attention, row["batch"], args) / 2**30, 2)
        torch.compiler.reset()  # this row compiles from nothing, whatever ran before it here
        dynamo_utils.clear_compilation_metrics()
        seconds = time_steps(model, attention, row["batch"], kernel_name, compiled, args, device)
        row["kernel_ran"] = kernel.last_kernel
        tokens = row["batch"] * model.seq_len
        tokens_per_s = tokens * args.steps / seconds
        peak = device_peak_flops(device)
        row["tokens_per_s"] = round(tokens_per_s)
        if peak:
            full = costs.train_flops_per_token(model, attention, tokens)
            row["mfu"] = round(tokens_per_s * full / peak, 4)
            half = causal_half_flops_per_token(model, attention, tokens)
            row["mfu_causal_half"] = round(tokens_per_s * half / peak, 4)
        row["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if cuda else None
        row["status"] = "ok"
        if compiled:
            row["recompiles"], hit, row["recompile_reason"] = compile_stats()
            if hit:
                row["status"] = "recompile-limit"
                print(
                    f"WARNING {size} {row['attention']} {kernel_name} compiled hit torch._dynamo's recompile "
                    "limit: some of its steps ran eager, so its figures are not the compiled ones "
                    '(TORCH_LOGS="recompiles" names the guard that failed)',
                    file=sys.stderr,
                )
    except torch.OutOfMemoryError:
        row["status"] = "oom"
    except Exception as error:  # any failure of one row is that row's status; the next row still runs
        message = (str(error).strip().splitlines() or [""])[0][:300]
        row.update(status="error", error=f"{type(error).__name__}: {message}")
    finally:
        if cuda:  # time_steps' model, optimiser and batch are freed by now: release their cached blocks
            with contextlib.suppress(Exception):
                torch.cuda.empty_cache()
    return row


def compile_stats() -> tuple[int, bool, str | None]:
    """(recompiles, whether Dynamo's recompile limit was hit, the first recompile's reason) since the last
    clear_compilation_metrics: a compile with a recompile reason that succeeded is a recompile; one that
    failed on the limit left its frame to run eager."""
    metrics = dynamo_utils.get_compilation_metrics()
    reasons = [
        str(m.recompile_reason)
        for m in metrics
        if getattr(m, "recompile_reason", None) and not getattr(m, "fail_type", None)
    ]
    failures = [str(getattr(m, "fail_reason", None) or "").lower() for m in metrics]
    hit = any(name in text for text in failures for name in LIMIT_NAMES)
    return len(reasons), hit, reasons[0][:200] if reasons else None


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


def compare(rows: list[dict[str, Any]], device_name: str | None = None) -> list[str]:
    """vs_mha per row (same size, kernel and compile setting), and the targets as PASS / FAIL lines: mha's
    best MFU eager and compiled against step_time's first-principles figure for its size, micro-batch,
    sequence and device (`device_name`; an H100 SXM's figures for another), and the best row of each
    attention (kernel and compile setting each at their best) against mha's tokens/s."""
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
        for compiled in (False, True):
            measured = [r for r in ok if r["attention"] == baseline and r.get("compile", False) == compiled]
            measured = [r for r in measured if r.get("mfu") is not None]
            if measured:
                lines.append(mfu_verdict(size, max(measured, key=lambda r: r["mfu"]), device_name))
        top = best[baseline]
        for r in best.values():
            ratio = r["tokens_per_s"] / top["tokens_per_s"]
            verdict = "PASS" if ratio >= VS_MHA_TARGET else "FAIL"
            lines.append(
                f"{verdict} {size} {r['attention']} {ratio:.1%} of {baseline}'s tokens/s (target >= 90 %)"
            )
    return lines


def mfu_target(size: str, row: dict[str, Any], device_name: str | None) -> float:
    """The first-principles MFU of this row's setting (lightning_modules/costs/step_time.py)."""
    compiled = bool(row.get("compile"))
    return step_time.target(size, compiled, costs.BASELINE, row["batch"], row["seq_len"], device_name).mfu


def mfu_verdict(size: str, row: dict[str, Any], device_name: str | None) -> str:
    target = mfu_target(size, row, device_name)
    mode = "compiled" if row.get("compile") else "eager"
    verdict = "PASS" if row["mfu"] >= target else "FAIL"
    return (
        f"{verdict} {size} {row['attention']} {mode} MFU {row['mfu']:.1%} (first-principles target >= "
        f"{target:.1%}, batch {row['batch']} x {row['seq_len']}, {row['kernel']})"
    )


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
    head = (
        "| size | attention | kernel | compile | ran | batch x seq | tokens/s | MFU | MFU causal/2 | peak GiB |"
        " plan GiB | vs mha | recompiles | status |"
    )
    lines = [head, "|" + "---|" * 14]

    def fmt(value: Any, spec: str) -> str:
        return format(value, spec) if value is not None else "-"

    for r in rows:
        tps = f"{r['tokens_per_s']:,}" if r.get("tokens_per_s") is not None else r["status"]
        lines.append(
            f"| {r['size']} | {r['attention']} | {r['kernel']} | {'on' if r.get('compile') else 'off'} | "
            f"{r.get('kernel_ran') or '-'} | {r.get('batch', '-')} x {r.get('seq_len', '-')} | {tps} | "
            f"{fmt(r.get('mfu'), '.1%')} | {fmt(r.get('mfu_causal_half'), '.1%')} | "
            f"{fmt(r.get('peak_mem_gib'), '.1f')} | {fmt(r.get('plan_peak_gib'), '.1f')} | "
            f"{fmt(r.get('vs_mha'), '.2f')} | {fmt(r.get('recompiles'), 'd')} | "
            f"{r['status']}{': ' + r['error'] if r.get('error') else ''} |"
        )
    lines.append(
        "\nMFU counts causal attention's scores and mixing over the full T^2 (lightning_modules/costs/counts.py); "
        "MFU causal/2 over T^2 / 2. Peak: lightning_modules/training/throughput.py (dense bf16)."
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
    parser.add_argument(
        "--kinds",
        nargs="+",
        choices=names(),
        default=list(paper_names()),
        help="attentions to train (default: the reference paper's five; any registered one may be named)",
    )
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run")
    parser.add_argument("--budget-minutes", type=float, default=9.0, help="rows after this are skipped")
    parser.add_argument(
        "--compiled-row-s",
        type=float,
        default=COMPILED_ROW_S,
        help="a compiled row starts only with this much of the budget left (or the longest one so far)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--in-process", action="store_true", help="every row in this process (no child per size)"
    )
    # A child's part (the parent passes them): one size, these rows of its plan, until this time.time().
    parser.add_argument("--one-size", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rows", nargs="+", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    precision.add_flag(parser)
    return parser


def plan(size: str, args: argparse.Namespace) -> list[Spec]:
    """The rows of one size, in table order: the eager rows of every selected variant x kernel first, the
    compiled ones after, so that a budget spent by compiling costs compiled rows, never an attention's
    eager row."""
    compile_settings = {"both": (False, True), "on": (True,), "off": (False,)}[args.compile]
    specs = []
    for compiled, (kind, path), kernel_name in itertools.product(compile_settings, variants(), args.kernels):
        if kind not in args.kinds:
            continue
        if kernel_name == "flash" and not flash_can_run(size, kind, args):
            continue  # unequal head dims: attend runs SDPA whatever is installed
        if kernel_name == "flash" and kernel.flash_attn_func is None:
            continue  # nothing to compare: report says so
        specs.append((kind, path, kernel_name, compiled))
    return specs


def placeholder(size: str, spec: Spec, status: str, error: str | None = None) -> dict[str, Any]:
    """The row of a spec that was not measured: skipped past the budget, or lost with its child."""
    kind, path, kernel_name, compiled = spec
    row = {"size": size, "attention": kind + (f" ({path})" if path else ""), "kernel": kernel_name}
    row.update(compile=compiled, status=status)
    if error:
        row["error"] = error
    return row


def progress(row: dict[str, Any]) -> None:
    """One line on stderr per row as it is measured: what a run killed before its table still shows."""
    figures = [row["status"]]
    if row.get("tokens_per_s") is not None:
        figures.append(f"{row['tokens_per_s']:,} tokens/s")
    if row.get("mfu") is not None:
        figures.append(f"MFU {row['mfu']:.1%}")
    if row.get("recompiles") is not None:
        figures.append(f"{row['recompiles']} recompiles")
    mode = "compiled" if row["compile"] else "eager"
    print(
        f"  measured {row['size']} {row['attention']} {row['kernel']} {mode}: {', '.join(figures)}",
        file=sys.stderr,
    )


def stream_row(row: dict[str, Any]) -> None:
    """With --json, each row on stdout as one ROW_MARK line the moment it is measured, before the whole
    report (the last line): a run killed on its timeout keeps the rows it finished (scripts/gpu/runner.py
    reads them back)."""
    print(ROW_MARK + json.dumps(row), flush=True)


def measure_rows(
    size: str, indices: list[int], deadline: float, args: argparse.Namespace, device: torch.device
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index, row) for these rows of the size's plan, measured here; "skipped" once past the deadline, and a
    compiled row also when less is left than a compiled row takes (COMPILED_ROW_S, or the longest so far)."""
    specs = plan(size, args)
    compiled_s = args.compiled_row_s
    for index in indices:
        left = deadline - time.time()
        if left <= 0:
            yield index, placeholder(size, specs[index], "skipped")
            continue
        if specs[index][3] and left < compiled_s:
            why = f"{left:.0f} s of the budget left, a compiled row takes about {compiled_s:.0f} s"
            yield index, placeholder(size, specs[index], "skipped", why)
            continue
        start = time.perf_counter()
        row = measure(size, *specs[index], args, device)
        if specs[index][3]:
            compiled_s = max(compiled_s, time.perf_counter() - start)
        progress(row)
        yield index, row


def run_child(args: argparse.Namespace, device: torch.device) -> int:
    """A child's part: its rows as ROW_MARK JSON lines on stdout. After an error on a GPU whose context no
    longer answers (an illegal access poisons it) it exits 3, for the parent to go on in a fresh process."""
    indices = args.rows if args.rows is not None else list(range(len(plan(args.one_size, args))))
    deadline = args.deadline if args.deadline is not None else float("inf")
    for index, row in measure_rows(args.one_size, indices, deadline, args, device):
        print(ROW_MARK + json.dumps({"index": index, **row}), flush=True)
        if row["status"] == "error" and device.type == "cuda":
            try:
                torch.cuda.synchronize(device)
            except Exception:
                return 3
    return 0


def stream_child(
    command: list[str], env: dict[str, str], timeout_s: float, on_line: Callable[[str], None]
) -> str:
    """Run `command`, handing each line of its stdout to on_line as it comes; how it ended, in words. Past
    timeout_s it is killed. Read with select, not line by line: a compile worker that outlives the child
    holds the pipe open, and a blocking read would wait on it."""
    child = subprocess.Popen(command, stdout=subprocess.PIPE, cwd=ROOT, env=env)
    assert child.stdout is not None
    fd, pending, end = child.stdout.fileno(), b"", time.monotonic() + timeout_s
    ended = None
    try:
        while True:
            ready = select.select([fd], [], [], 0.5)[0]
            chunk = os.read(fd, 1 << 16) if ready else b""
            if chunk:
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    on_line(line.decode(errors="replace"))
                continue
            if ready or child.poll() is not None:  # end of file, or exited with nothing left to read
                break
            if time.monotonic() > end:
                child.kill()
                ended = f"was ended {CHILD_GRACE_S} s past the budget"
                break
    finally:
        child.stdout.close()
    if pending:
        on_line(pending.decode(errors="replace"))
    code = child.wait()
    return ended or f"exited {code}"


def child_rows(
    size: str,
    argv: list[str],
    deadline: float,
    args: argparse.Namespace,
    emit: Callable[[dict[str, Any]], None] = lambda row: None,
) -> list[dict[str, Any]]:
    """Every row of one size, from child processes, each handed to `emit` as soon as its child prints it:
    one child runs the rows; if it dies, the row it was on is "crashed" (its exit status named) and a fresh
    child runs the rest."""
    specs = plan(size, args)
    rows: dict[int, dict[str, Any]] = {}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }

    def take(line: str) -> None:
        if line.startswith(ROW_MARK):
            row = json.loads(line[len(ROW_MARK) :])
            rows[row.pop("index")] = row
            emit(row)

    while len(rows) < len(specs):
        todo = [i for i in range(len(specs)) if i not in rows]
        if time.time() > deadline:
            for i in todo:
                rows[i] = placeholder(size, specs[i], "skipped")
                emit(rows[i])
            break
        command = [sys.executable, str(Path(__file__).resolve()), *argv, "--one-size", size]
        command += ["--deadline", repr(deadline), "--rows", *map(str, todo)]
        # a child stuck past the budget (a hung compile, a hung kernel) is ended, its row "crashed"
        ended = stream_child(command, env, max(deadline - time.time(), 0) + CHILD_GRACE_S, take)
        lost = [i for i in todo if i not in rows]
        if lost:  # the child died on lost[0]: that row is its casualty, a fresh child takes the rest
            why = f"the child process {ended} on this row (its stderr above)"
            rows[lost[0]] = placeholder(size, specs[lost[0]], "crashed", why)
            emit(rows[lost[0]])
    return [rows[i] for i in range(len(specs))]


def measure_all(
    args: argparse.Namespace,
    device: torch.device,
    argv: list[str] | None = None,
    emit: Callable[[dict[str, Any]], None] = lambda row: None,
) -> list[dict[str, Any]]:
    """Every selected size x variant x kernel x compile setting, a child process per size (or here with
    --in-process), each row handed to `emit` as it is measured; rows past the time budget are "skipped" and
    come last."""
    deadline = time.time() + args.budget_minutes * 60
    rows = []
    for size in args.sizes:
        if args.in_process or argv is None:
            indices = list(range(len(plan(size, args))))
            for _, row in measure_rows(size, indices, deadline, args, device):
                emit(row)
                rows.append(row)
        else:
            rows += child_rows(size, argv, deadline, args, emit)
    return [r for r in rows if r["status"] != "skipped"] + [r for r in rows if r["status"] == "skipped"]


def report(
    rows: list[dict[str, Any]], args: argparse.Namespace, device: torch.device, argv: list[str]
) -> None:
    """The rows and the targets' verdicts: as JSON with --json, else a markdown table."""
    env = environment(device, argv, args.bf16)
    verdicts = compare([r for r in rows if r["status"] != "skipped"], env["device"])
    if "flash" in args.kernels and kernel.flash_attn_func is None:
        verdicts.insert(0, "NOTE flash-attn not installed (pip install .[flash]): SDPA rows only")
    if args.json:  # one line, the last: what follows the streamed rows (stream_row)
        print(json.dumps({"environment": env, "rows": rows, "targets": verdicts}), flush=True)
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
    if device.type == "cuda" and (args.one_size or args.in_process):  # the parent of children needs none
        # set_device refuses a device without an index (torch/cuda/__init__.py): a bare "cuda" names the
        # current one, and every row below gets the indexed device too.
        index = torch.cuda.current_device() if device.index is None else device.index
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    if args.one_size:
        return run_child(args, device)
    report(measure_all(args, device, argv, stream_row if args.json else lambda row: None), args, device, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
