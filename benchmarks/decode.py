"""KV-cached decoding per attention, with random weights: cache bytes, fidelity and tokens/s against context.

    python benchmarks/decode.py --size nano --json                  # every attention, default contexts
    python benchmarks/decode.py --size 20m --context 256 1024 4096  # a markdown table instead of JSON
    python benchmarks/decode.py --attention mha mla lrkv --all-paths --batch 8 --context 4096 --threads 1

For each attention of the size (its per-size knobs from conf/model/*.yaml):
- fidelity: an fp32 generation (a prefill, then single-token steps) against one full forward over the same
  tokens: the largest absolute logit difference (and the logits' std, to judge it by);
- cache bytes: a bf16 generation of the same tokens; the sum of its caches' nbytes against the cost model's
  kv_cache_bytes_per_token x tokens (lightning_modules/costs/counts.py counts bf16). The caches are preallocated to exactly those tokens;
- speed: at each context S, the cache is filled with S - 1 tokens (prefilled in chunks), then single-token
  steps are timed, each attending to S positions: after every step the cache is rewound by one position, so
  all timed steps run at the same context. Tokens/s = batch x steps / seconds, the median of repeats timed
  round-robin across the attentions (all models stay loaded), so machine noise hits them alike; also per
  second of the process's CPU time (tokens_per_cpu_s), steadier on a shared CPU (with --threads 1);
- peak memory of decoding at each context, measured in a child process that holds only that attention's
  model and caches (so that neither the other models nor this process's history count): the peak over the
  same single-token steps, and the baseline just before them (model + filled caches + runtime). CUDA:
  max_memory_allocated and memory_allocated; CPU: the process's peak resident set (VmHWM, reset through
  /proc/self/clear_refs) and its resident set (VmRSS), which include Python and torch themselves.
Arms: each attention's default decode path; with --all-paths every path it offers (lrkv: absorbed, rebuilt,
materialized; mla: absorbed, rebuilt), each timed on the same model; on CUDA, where a fused Triton kernel runs
(lightning_modules/kernels/), also the plain-torch path beside it ("plain"). Every speed row carries its
roofline: the bytes a step must read (the filled cache of the arm's path plus the weights) and its FLOPs
(the matrix products of one step of that arm, counted by torch's FLOP counter), so FLOP/byte says which bound a
row sits on.
The device is auto-detected (CUDA when available); the weights are bf16 where the hardware has native bf16,
else fp32 (lightning_modules/core/precision.py; --precision overrides). Fidelity is measured in fp32 everywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from lightning_modules.core import precision
from lightning_modules.costs import counts as costs
from lightning_modules.kernels import support as fused
from lightning_modules.model.attention import AttentionConfig, names
from lightning_modules.model.attention.cache import LayerCache, caches_nbytes
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.transformer import Transformer

CPU_CONTEXTS = (128, 256, 512, 1024, 2048)
GPU_CONTEXTS = (1024, 2048, 4096, 8192, 16384)


# ----- memory --------------------------------------------------------------------------------------------
def _proc_status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak(device: torch.device) -> int:
    """Start a new peak-memory window; returns the bytes in use at its start."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM := current VmRSS
    return _proc_status("VmRSS")


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return _proc_status("VmHWM")


def memory_probe(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """In a child process: one attention's model and caches at one context; peak over the timed steps."""
    kind, path, plain = parse_arm(args.memory_probe[0])
    context = int(args.memory_probe[1])
    model, attention = costs.load_configs(
        [costs.fragment("model", args.size), costs.fragment("attention", kind)]
    )
    net = build(model, attention, device, args.seed).to(run_dtype(args, device))
    step = prepare_steps(net, context, args.batch, args.chunk, device, path, plain)
    timed(step, 3, device)
    baseline = reset_peak(device)
    timed(step, args.steps, device)
    sync(device)
    return {"peak_memory_bytes": peak_bytes(device), "memory_baseline_bytes": baseline}


def measure_memory(args: argparse.Namespace, kind: str, context: int) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--memory-probe", kind, str(context)]
    command += ["--size", args.size, "--batch", str(args.batch), "--steps", str(args.steps)]
    command += ["--chunk", str(args.chunk), "--seed", str(args.seed), "--device", args.device]
    command += ["--precision", args.precision]
    if args.threads:
        command += ["--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory probe {kind} at context {context} failed:\n{done.stderr}")
    probe = json.loads(done.stdout.splitlines()[-1])
    kind_of_peak = "cuda_max_memory_allocated" if probe.pop("device") == "cuda" else "process_peak_rss_vmhwm"
    return {**probe, "peak_memory_kind": kind_of_peak}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----- the three measurements ------------------------------------------------------------------------------
@torch.inference_mode()
def run_generation(
    net: Transformer, tokens: torch.Tensor, prefill: int
) -> tuple[torch.Tensor, list[LayerCache]]:
    """Decode `tokens` (B, T) with caches of exactly T positions: `prefill` at once, then one at a time.
    Returns the logits of every position (B, T, V) and the filled caches."""
    caches = net.new_caches(tokens.shape[0], tokens.shape[1])
    logits = [net.decode(tokens[:, :prefill], caches)]
    for t in range(prefill, tokens.shape[1]):
        logits.append(net.decode(tokens[:, t : t + 1], caches))
    return torch.cat(logits, dim=1), caches


@torch.inference_mode()
def fidelity(net: Transformer, tokens: torch.Tensor, prefill: int) -> dict[str, float]:
    """Cached decoding against one full forward, both in the model's (fp32) dtype."""
    full = net(tokens)
    cached, _ = run_generation(net, tokens, prefill)
    return {
        "max_abs_logit_diff_vs_full": (cached - full).abs().max().item(),
        "logit_std": full.std().item(),
    }


def cache_bytes(net: Transformer, tokens: torch.Tensor, prefill: int) -> dict[str, Any]:
    """A bf16 generation's caches against the cost model (which counts bf16)."""
    bf16 = net if next(net.parameters()).dtype == torch.bfloat16 else copy.deepcopy(net).to(torch.bfloat16)
    _, caches = run_generation(bf16, tokens, prefill)
    n_tokens = tokens.numel()  # batch x positions
    per_token = costs.kv_cache_bytes_per_token(net.config, net.resolved)
    return {
        "cache_tokens": n_tokens,
        "measured_cache_bytes": caches_nbytes(caches),
        "formula_cache_bytes": per_token * n_tokens,
        "cache_bytes_per_token": per_token,
        "cache_vs_mha": per_token / costs.mha_cache_bytes_per_token(net.config),
    }


@contextlib.contextmanager
def plain_torch(plain: bool):  # noqa: ANN201
    """Within: the plain-torch decode even where a fused kernel could run (kernels/support.py's switch)."""
    before = os.environ.get(fused.MODE_ENV)
    if plain:
        os.environ[fused.MODE_ENV] = "0"
    try:
        yield
    finally:
        if plain:
            if before is None:
                os.environ.pop(fused.MODE_ENV, None)
            else:
                os.environ[fused.MODE_ENV] = before


def prepare_steps(
    net: Transformer,
    context: int,
    batch: int,
    chunk: int,
    device: torch.device,
    path: str | None = None,
    plain: bool = False,
) -> Callable[[], None]:
    """Caches of decode path `path` filled with context - 1 random tokens (prefilled in chunks, which bound the
    prefill's memory) and a step that decodes one token attending to `context` positions, then rewinds the caches
    by one position so that every timed step runs at the same context. `plain`: no fused kernel."""
    gen = torch.Generator(device="cpu").manual_seed(context)
    tokens = torch.randint(0, net.config.vocab_size, (batch, context), generator=gen).to(device)
    caches = net.new_caches(batch, context, path=path)
    held = context - 1
    with torch.inference_mode():
        for start in range(0, held, chunk):
            net.decode(tokens[:, start : min(start + chunk, held)], caches, last_only=True)
    step_token = tokens[:, -1:]

    @torch.inference_mode()
    def step() -> None:
        with plain_torch(plain):
            net.decode(step_token, caches)
        for cache in caches:
            cache.length = held

    step.caches = caches  # type: ignore[attr-defined]
    return step


def counted_flops(step: Callable[[], None], plain: Callable[[], Any]) -> int:
    """The matrix-product FLOPs of one step of this arm, counted by torch (the path's own work: a rebuilt path's
    rebuild included), under SDPA's math backend and without fused kernels, which the counter cannot see."""
    counter = FlopCounterMode(display=False)
    with plain(), sdpa_kernel(SDPBackend.MATH), counter:
        step()
    return counter.get_total_flops()


def timed(step: Callable[[], None], steps: int, device: torch.device) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) for `steps` steps. On a shared CPU the CPU time leaves out
    the time the process waited for a core; with one thread it is the cost of the steps themselves."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    sync(device)
    return time.perf_counter() - wall, time.process_time() - cpu


def decode_speed(
    nets: dict[str, Transformer], arms: dict[str, tuple[str, str | None, bool]], context: int,
    args: argparse.Namespace, device: torch.device,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Tokens/s of single-token steps at `context` for every arm, timed round-robin (on a shared machine,
    noise then hits all alike), each with its roofline, and each one's peak memory in a child process."""
    steps = {
        arm: prepare_steps(nets[kind], context, args.batch, args.chunk, device, path, plain)
        for arm, (kind, path, plain) in arms.items()
    }
    times: dict[str, list[tuple[float, float]]] = {arm: [] for arm in steps}
    for repeat in range(args.repeats + 1):  # the first round warms up and is not counted
        for arm, step in steps.items():
            seconds = timed(step, args.steps, device)
            if repeat:
                times[arm].append(seconds)
    out = {}
    for arm, step in steps.items():
        net = nets[arms[arm][0]]
        seconds = statistics.median(wall for wall, _ in times[arm])
        cpu_seconds = statistics.median(cpu for _, cpu in times[arm])
        flops = costs.decode_flops_per_token(net.config, net.resolved, context)
        cache = caches_nbytes(step.caches)  # type: ignore[attr-defined]
        weights = sum(p.nbytes for p in net.parameters())
        step_bytes = cache + weights  # a step reads every filled cache position once, and every weight
        step_flops = counted_flops(step, lambda: plain_torch(True))
        out[arm] = {
            "context": context,
            "batch": args.batch,
            "tokens_per_s": args.batch * args.steps / seconds,
            "ms_per_step": 1000 * seconds / args.steps,
            "tokens_per_cpu_s": args.batch * args.steps / cpu_seconds,  # per second of this process's CPU
            "decode_flops_per_token": flops,
            "achieved_gflops": args.steps * step_flops / seconds / 1e9,  # this arm's counted FLOPs
            "run_cache_bytes": cache,
            "weights_bytes": weights,
            "step_bytes": step_bytes,
            "step_flops": step_flops,  # counted on this arm's path (the formula above is the default path's)
            "flop_per_byte": step_flops / step_bytes,
            "achieved_gb_per_s": args.steps * step_bytes / seconds / 1e9,
        }
        if args.memory:
            out[arm].update(measure_memory(args, arm, context))
    return out


def parse_arm(arm: str) -> tuple[str, str | None, bool]:
    """'lrkv' -> (lrkv, default path, fused where possible); 'lrkv:rebuilt'; 'lrkv:absorbed:plain'."""
    kind, path, plain = (arm.split(":") + [None, None])[:3]
    return kind, path or None, plain == "plain"


def arms_of(
    net: Transformer, kind: str, all_paths: bool, device: torch.device
) -> dict[str, tuple[str, str | None, bool]]:
    """{arm name: (kind, path, plain)} for one attention: its default path, or every path it offers; on CUDA
    each path that has a fused kernel also without it."""
    variant = type(net.blocks[0].attn)
    paths = variant.decode_paths if all_paths else variant.decode_paths[:1]
    arms: dict[str, tuple[str, str | None, bool]] = {}
    for i, path in enumerate(paths):
        name = kind if i == 0 else f"{kind}:{path}"
        arms[name] = (kind, None if i == 0 else path, False)
        if i == 0 and device.type == "cuda" and kind in ("lrkv", "mla") and fused.triton_installed():
            arms[f"{kind}:{path}:plain"] = (kind, None, True)
    return arms


def arm_label(label: str, arm: str) -> str:
    """The attention's label, with the path (and 'plain') of a non-default arm: lrkv-r8 (rebuilt)."""
    extra = arm.split(":")[1:]
    return f"{label} ({', '.join(extra)})" if extra else label


# ----- driver --------------------------------------------------------------------------------------------
def build(model: ModelConfig, attention: AttentionConfig, device: torch.device, seed: int) -> Transformer:
    torch.manual_seed(seed)
    with torch.device(device):
        return Transformer(model, attention).eval()


def pick_device(name: str) -> torch.device:
    return torch.device(name if name != "auto" else "cuda" if torch.cuda.is_available() else "cpu")


def run_dtype(args: argparse.Namespace, device: torch.device) -> torch.dtype:
    return precision.weights_dtype(args.precision, device)


def benchmark(args: argparse.Namespace) -> list[dict[str, Any]]:
    device = pick_device(args.device)
    dtype = run_dtype(args, device)
    contexts = args.context or (GPU_CONTEXTS if device.type == "cuda" else CPU_CONTEXTS)
    nets: dict[str, Transformer] = {}
    arms: dict[str, tuple[str, str | None, bool]] = {}
    common: dict[str, dict[str, Any]] = {}
    for kind in args.attention:
        model, attention = costs.load_configs(
            [costs.fragment("model", args.size), costs.fragment("attention", kind)]
        )
        net = build(model, attention, device, args.seed)
        n = min(args.check_tokens, model.seq_len)
        gen = torch.Generator(device="cpu").manual_seed(args.seed)
        tokens = torch.randint(0, model.vocab_size, (args.batch, n), generator=gen).to(device)
        common[kind] = {
            "size": model.name,
            "attention": kind,
            "label": net.attention_config.label(),
            "device": device_name(device),
            "dtype": str(dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(),
            **fidelity(net, tokens, n // 2),  # fp32 weights at this point
        }
        nets[kind] = net.to(dtype)
        common[kind].update(cache_bytes(nets[kind], tokens, n // 2))
        arms.update(arms_of(net, kind, args.all_paths, device))
    rows = []
    for context in contexts:
        for arm, speed in decode_speed(nets, arms, context, args, device).items():
            kind = arms[arm][0]
            rows.append(
                {**common[kind], "arm": arm, "arm_label": arm_label(common[kind]["label"], arm), **speed}
            )
            memory = f", peak {speed['peak_memory_bytes'] / 2**20:.1f} MiB" if args.memory else ""
            print(
                f"{arm:>18} S={context:>6}: {speed['tokens_per_s']:9.1f} tok/s, "
                f"{speed['tokens_per_cpu_s']:9.1f} tok/CPU-s, {speed['flop_per_byte']:6.1f} FLOP/B{memory}",
                flush=True,
                file=sys.stderr,
            )
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    kinds = list(dict.fromkeys(r["attention"] for r in rows))
    first = {k: next(r for r in rows if r["attention"] == k) for k in kinds}
    lines = [
        "| attention | measured cache bytes (bf16) | cost model | bytes/token | vs mha | max abs logit diff | logit std |",
        "|---|---|---|---|---|---|---|",
    ]
    for k in kinds:
        r = first[k]
        lines.append(
            f"| {r['label']} | {r['measured_cache_bytes']:,} | {r['formula_cache_bytes']:,} | "
            f"{r['cache_bytes_per_token']:,} | {100 * r['cache_vs_mha']:.1f} % | "
            f"{r['max_abs_logit_diff_vs_full']:.1e} | {r['logit_std']:.2f} |"
        )
    arms = list(dict.fromkeys(r["arm_label"] for r in rows))
    contexts = sorted({r["context"] for r in rows})
    for key, title in (("tokens_per_s", "tokens/s (wall)"), ("tokens_per_cpu_s", "tokens per CPU-second")):
        lines += ["", f"| {title} | " + " | ".join(f"S={c}" for c in contexts) + " |"]
        lines.append("|---" * (len(contexts) + 1) + "|")
        for arm in arms:
            speed = {r["context"]: r[key] for r in rows if r["arm_label"] == arm}
            lines.append(f"| {arm} | " + " | ".join(f"{speed[c]:.0f}" for c in contexts) + " |")
    lines += [
        "",
        "| roofline per step | S | MB read (cache + weights) | MFLOP | FLOP/byte | GB/s achieved | GFLOP/s achieved |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm_label']} | {r['context']} | {r['step_bytes'] / 1e6:.2f} | {r['step_flops'] / 1e6:.1f} | "
            f"{r['flop_per_byte']:.2f} | {r['achieved_gb_per_s']:.2f} | {r['achieved_gflops']:.2f} |"
        )
    if all("peak_memory_bytes" in r for r in rows):
        lines += [
            "",
            f"| peak MiB ({rows[0]['peak_memory_kind']}) | " + " | ".join(f"S={c}" for c in contexts) + " |",
        ]
        lines.append("|---" * (len(contexts) + 1) + "|")
        for arm in arms:
            peak = {r["context"]: r["peak_memory_bytes"] / 2**20 for r in rows if r["arm_label"] == arm}
            lines.append(f"| {arm} | " + " | ".join(f"{peak[c]:.1f}" for c in contexts) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="nano", help="conf/model/<size>.yaml (default nano)")
    parser.add_argument("--attention", nargs="+", default=list(names()), choices=names())
    parser.add_argument("--context", type=int, nargs="+", default=None, help="decode contexts S (positions)")
    parser.add_argument("--batch", type=int, default=1, help="sequences decoded together (default 1)")
    parser.add_argument("--steps", type=int, default=32, help="timed steps per repeat (default 32)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats; the median is reported (default 3)")
    parser.add_argument("--chunk", type=int, default=512, help="prefill chunk length (default 512)")
    parser.add_argument(
        "--check-tokens", type=int, default=128, help="tokens of the fidelity/cache generation"
    )
    parser.add_argument(
        "--all-paths",
        action="store_true",
        help="time every decode path of each attention, not only its default",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    precision.add_flag(parser)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    parser.add_argument(
        "--no-memory", dest="memory", action="store_false", help="skip the peak-memory child processes"
    )
    parser.add_argument("--memory-probe", nargs=2, metavar=("ARM", "CONTEXT"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--json", action="store_true", help="print the rows as JSON instead of markdown tables"
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_probe:  # child process of measure_memory
        device = pick_device(args.device)
        print(json.dumps({**memory_probe(args, device), "device": device.type}))
        return
    rows = benchmark(args)
    print(json.dumps(rows, indent=1) if args.json else markdown(rows))


if __name__ == "__main__":
    main()
