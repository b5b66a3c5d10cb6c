"""KV-cached decoding per attention, with random weights: cache bytes, fidelity and tokens/s against context.

    python benchmarks/decode.py --json                               # the device's defaults (below)
    python benchmarks/decode.py --size 20m --context 256 1024 4096  # a markdown table instead of JSON
    python benchmarks/decode.py --attention mha mla lrkv --all-paths --batch 8 --context 4096 --threads 1
    python benchmarks/decode.py --size 128m --context 8192 --batch 64 1 --cuda-graph --output decode.json

Defaults follow the device, so that a GPU run measures the GPU rather than Python: on CUDA 128m, batch 64,
contexts 1K-16K and the memory probe in this process; on the CPU nano, batch 1, contexts 128-2048 and the probe
in a child process. --size, --batch (several values: each is a run) and --context override them.

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
- peak memory of decoding at each context: the peak over the same single-token steps and the baseline just
  before them. In this process (CUDA's default): peak statistics reset before each arm, the baseline is the
  arm's own weights and filled caches (nbytes) and the peak adds the steps' transient memory (CUDA:
  max_memory_allocated - memory_allocated; CPU: VmHWM - VmRSS), so the other loaded models do not count. In a
  child process (the CPU's default, --memory-mode child) that holds only that attention's model and caches:
  CUDA: max_memory_allocated and memory_allocated; CPU: the process's peak resident set (VmHWM, reset through
  /proc/self/clear_refs) and its resident set (VmRSS), which include Python and torch themselves;
- with --cuda-graph (CUDA): each arm's step captured once in a CUDA graph and replayed, timed like the eager
  steps: graph_tokens_per_s beside tokens_per_s. The captured step is the benchmark's fixed-context step;
  generation's own decode is not capturable as written (GRAPH_NOTE below, docs/attentions.md "CUDA graphs").
Every arm carries a status ("ok", "oom" or "error", with the error's first line): one arm that runs out of
memory or fails is reported as such and the others still run; memory_status and graph_status likewise.
Arms: each attention's default decode path; with --all-paths every path it offers (lrkv: absorbed, rebuilt,
materialized; mla: absorbed, rebuilt), each timed on the same model; on CUDA, where a fused Triton kernel runs
(lightning_modules/kernels/), also the plain-torch path beside it ("plain"). Every speed row carries its
roofline: the bytes a step must read (the filled cache of the arm's path plus the weights) and its FLOPs
(the matrix products of one step of that arm, counted by torch's FLOP counter), so FLOP/byte says which bound a
row sits on.
The weights are bf16 where the hardware has native bf16, else fp32 (lightning_modules/core/precision.py;
--precision overrides). Fidelity is measured in fp32 everywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from lightning_modules.core import precision
from lightning_modules.core.errors import UserError, run_entry
from lightning_modules.costs import counts as costs
from lightning_modules.kernels import support as fused
from lightning_modules.model.attention import AttentionConfig, names
from lightning_modules.model.attention.cache import LayerCache, caches_nbytes
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.transformer import Transformer

Arm = tuple[str, str | None, bool]  # (attention, decode path or None for its default, plain torch)


class Defaults(NamedTuple):  # a NamedTuple: tests load this file without registering it as a module
    """What a run measures when the command line does not say: per device, because a batch-1 step of a small
    model on a GPU is bound by Python and kernel launches (microseconds each), not by the device."""

    size: str
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    memory_mode: str  # "in-process" or "child"


CPU_DEFAULTS = Defaults("nano", (1,), (128, 256, 512, 1024, 2048), "child")
# At 128m, batch 64 and S = 8K an mha step reads about 19 GB of cache: milliseconds of HBM, not of launches.
GPU_DEFAULTS = Defaults("128m", (64,), (1024, 2048, 4096, 8192, 16384), "in-process")

GRAPH_NOTE = (
    "note: --cuda-graph captures the benchmark's step, which is shape-static only because every timed step "
    "rewinds the caches to S - 1 positions (same write offset, same views). Generation's decode "
    "(lightning_modules/generation/loop.py) cannot be captured as written: LayerCache.length is a Python int that "
    "picks RoPE's rows (rope(q, start)), the write offset (narrow at length) and the held views (narrow 0 .. "
    "length + 1), which grow by one position every step; every attention (SDPA, flash-attn, LRKV's scores, the "
    "Triton kernels' split-KV grid) takes S from those shapes. A static cache needs a lengths tensor, RoPE and "
    "writes at a tensor position and masked or length-aware attention in every decode path, RoPE and attend "
    "being shared with the training forward (docs/attentions.md, 'CUDA graphs')."
)


def defaults_for(device: torch.device) -> Defaults:
    return GPU_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS


def settle(args: argparse.Namespace, device: torch.device) -> argparse.Namespace:
    """args with the device's defaults for what the command line left open; bad values rejected."""
    chosen = defaults_for(device)
    args = copy.copy(args)
    args.size = args.size or chosen.size
    args.batch = tuple(args.batch or chosen.batches)
    args.context = tuple(args.context or chosen.contexts)
    if args.memory_mode == "auto":
        args.memory_mode = chosen.memory_mode
    for name, values in (("--batch", args.batch), ("--context", args.context)):
        if min(values) < 1:
            raise UserError(f"{name} {' '.join(map(str, values))}: every value must be >= 1")
    if args.steps < 1 or args.repeats < 1 or args.chunk < 1:
        raise UserError("--steps, --repeats and --chunk must be >= 1")
    return args


# ----- one arm's failure is that arm's status ------------------------------------------------------------
def failure(exc: BaseException, prefix: str = "") -> dict[str, str]:
    """{prefix + "status": "oom" or "error", prefix + "error": the exception's first line}."""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
    message = str(exc).lower()
    oom = isinstance(exc, torch.cuda.OutOfMemoryError | MemoryError) or "out of memory" in message
    oom = oom or "can't allocate memory" in message  # the CPU allocator's words
    return {f"{prefix}status": "oom" if oom else "error", f"{prefix}error": text}


def release(device: torch.device) -> None:
    """Give a failed arm's memory back before the next one runs (its traceback held its tensors)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----- memory --------------------------------------------------------------------------------------------
def _proc_status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


class Meter(Protocol):
    kind: str

    def start(self) -> int:
        """Start a new peak window; the bytes in use at its start."""
        ...

    def peak(self) -> int:
        """The most bytes in use since start()."""
        ...


class CudaMeter:
    kind = "cuda_max_memory_allocated"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def start(self) -> int:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return torch.cuda.memory_allocated(self.device)

    def peak(self) -> int:
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device)


class ProcessMeter:
    kind = "process_peak_rss_vmhwm"

    def start(self) -> int:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM := current VmRSS
        return _proc_status("VmRSS")

    def peak(self) -> int:
        return _proc_status("VmHWM")


def meter_for(device: torch.device) -> Meter:
    return CudaMeter(device) if device.type == "cuda" else ProcessMeter()


def weights_bytes(net: Transformer) -> int:
    return sum(p.nbytes for p in net.parameters())


def probe_in_process(step: Step, steps: int, meter: Meter) -> dict[str, Any]:
    """The arm's peak as if it ran alone: its weights and filled caches plus the transient memory of `steps`
    steps, measured in a window that starts after the other arms' work (so it holds no other arm's peak)."""
    step()  # warm: the first call may allocate what later ones reuse
    start = meter.start()
    for _ in range(steps):
        step()
    peak = meter.peak()
    resident = weights_bytes(step.net) + caches_nbytes(step.caches)
    transient = max(0, peak - start)
    return {
        "memory_status": "ok",
        "peak_memory_bytes": resident + transient,
        "memory_baseline_bytes": resident,
        "step_transient_bytes": transient,
        "process_peak_bytes": peak,  # everything this process holds, the other arms' models and caches too
        "peak_memory_kind": f"{meter.kind}_in_process",
    }


def memory_probe(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """In a child process: one attention's model and caches at one context; peak over the timed steps."""
    kind, path, plain = parse_arm(args.memory_probe[0])
    context = int(args.memory_probe[1])
    model, attention = costs.load_configs(
        [costs.fragment("model", args.size), costs.fragment("attention", kind)]
    )
    net = build(model, attention, device, args.seed).to(run_dtype(args, device))
    step = prepare_steps(net, context, args.batch[0], args.chunk, device, path, plain)
    timed(step, 3, device)
    meter = meter_for(device)
    baseline = meter.start()
    timed(step, args.steps, device)
    return {"peak_memory_bytes": meter.peak(), "memory_baseline_bytes": baseline}


def measure_memory(args: argparse.Namespace, arm: str, context: int, batch: int) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--memory-probe", arm, str(context)]
    command += ["--size", args.size, "--batch", str(batch), "--steps", str(args.steps)]
    command += ["--chunk", str(args.chunk), "--seed", str(args.seed), "--device", args.device]
    command += ["--precision", args.precision]
    if args.threads:
        command += ["--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        oom = "out of memory" in done.stderr.lower() or done.returncode == -9  # SIGKILL: the OOM killer
        return {"memory_status": "oom" if oom else "error", "memory_error": f"child: {lines[-1][:300]}"}
    probe = json.loads(done.stdout.splitlines()[-1])
    kind_of_peak = "cuda_max_memory_allocated" if probe.pop("device") == "cuda" else "process_peak_rss_vmhwm"
    return {"memory_status": "ok", **probe, "peak_memory_kind": kind_of_peak}


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
def plain_torch(plain: bool) -> Iterator[None]:
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


class Step:
    """One single-token decode step attending to `held` + 1 positions, after which the caches are rewound to
    `held`: every call writes the same slot and reads the same views, so calls are interchangeable (what the
    timing's repeats and a CUDA graph's replays rely on; tests/benchmarks/test_decode_gpu_defaults.py)."""

    def __init__(
        self, net: Transformer, caches: list[LayerCache], token: torch.Tensor, held: int, plain: bool
    ) -> None:
        self.net, self.caches, self.token, self.held, self.plain = net, caches, token, held, plain

    @torch.inference_mode()
    def __call__(self) -> torch.Tensor:
        """The step's logits, (B, 1, padded vocab)."""
        try:
            with plain_torch(self.plain):
                return self.net.decode(self.token, self.caches)
        finally:
            self.rewind()

    def rewind(self) -> None:
        for cache in self.caches:
            cache.length = self.held


def prepare_steps(
    net: Transformer,
    context: int,
    batch: int,
    chunk: int,
    device: torch.device,
    path: str | None = None,
    plain: bool = False,
) -> Step:
    """Caches of decode path `path` filled with context - 1 random tokens (prefilled in chunks, which bound the
    prefill's memory) and the step that decodes one token attending to `context` positions. `plain`: no fused
    kernel."""
    gen = torch.Generator(device="cpu").manual_seed(context)
    tokens = torch.randint(0, net.config.vocab_size, (batch, context), generator=gen).to(device)
    caches = net.new_caches(batch, context, path=path)
    held = context - 1
    with torch.inference_mode():
        for start in range(0, held, chunk):
            net.decode(tokens[:, start : min(start + chunk, held)], caches, last_only=True)
    return Step(net, caches, tokens[:, -1:], held, plain)


def counted_flops(step: Callable[[], Any], plain: Callable[[], Any]) -> int:
    """The matrix-product FLOPs of one step of this arm, counted by torch (the path's own work: a rebuilt path's
    rebuild included), under SDPA's math backend and without fused kernels, which the counter cannot see."""
    counter = FlopCounterMode(display=False)
    with plain(), sdpa_kernel(SDPBackend.MATH), counter:
        step()
    return counter.get_total_flops()


def timed(step: Callable[[], Any], steps: int, device: torch.device) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) for `steps` steps. On a shared CPU the CPU time leaves out
    the time the process waited for a core; with one thread it is the cost of the steps themselves."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    sync(device)
    return time.perf_counter() - wall, time.process_time() - cpu


def round_robin(
    calls: dict[str, Callable[[], Any]], args: argparse.Namespace, device: torch.device,
    failed: dict[str, dict[str, str]], prefix: str = "",
) -> dict[str, list[tuple[float, float]]]:  # fmt: skip
    """Times of each call's repeats, taken in turn (noise on a shared machine then hits all alike); the first
    round warms up and is not kept. A call that fails moves to `failed` and leaves the rounds."""
    calls = dict(calls)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
    for repeat in range(args.repeats + 1):
        for name in list(calls):
            try:
                seconds = timed(calls[name], args.steps, device)
            except Exception as exc:  # an arm's OOM or error is its row's status; the others go on
                failed[name] = failure(exc, prefix)
            if name in failed:  # outside the except: its traceback holds the failed call's tensors
                del calls[name], times[name]
                release(device)
                continue
            if repeat:
                times[name].append(seconds)
    return times


# ----- CUDA graphs ----------------------------------------------------------------------------------------
def capture(step: Step, device: torch.device) -> Callable[[], None]:
    """The step captured in a CUDA graph; returns its replay. Warmed on a side stream first, as
    torch.cuda.graphs asks (lazy initialisation and Triton's compilation must not happen inside the capture)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def graph_speed(
    steps: dict[str, Step], args: argparse.Namespace, device: torch.device,
    capturer: Callable[[Step, torch.device], Callable[[], None]] = capture,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """graph_tokens_per_s per arm: each step captured once, its replays timed round-robin like the eager steps.
    A capture or replay that fails is that arm's graph_status."""
    if device.type != "cuda":
        return {
            arm: {"graph_status": "skipped", "graph_error": "CUDA graphs need a CUDA device"} for arm in steps
        }
    failed: dict[str, dict[str, str]] = {}
    replays: dict[str, Callable[[], None]] = {}
    for arm, step in steps.items():
        try:
            replays[arm] = capturer(step, device)
        except Exception as exc:
            failed[arm] = failure(exc, "graph_")
        if arm in failed:
            step.rewind()  # a capture stopped inside decode leaves the caches one position ahead
            release(device)
    times = round_robin(replays, args, device, failed, "graph_")
    replays.clear()  # the graphs and their memory pools
    release(device)
    out: dict[str, dict[str, Any]] = dict(failed)
    for arm, seconds in times.items():
        wall = statistics.median(w for w, _ in seconds)
        batch = steps[arm].token.shape[0]
        out[arm] = {
            "graph_status": "ok",
            "graph_tokens_per_s": batch * args.steps / wall,
            "graph_ms_per_step": 1000 * wall / args.steps,
        }
    return out


# ----- one context, every arm ---------------------------------------------------------------------------
def speed_fields(
    step: Step, seconds: list[tuple[float, float]], context: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Tokens/s of one arm and its roofline."""
    net, batch = step.net, step.token.shape[0]
    wall = statistics.median(w for w, _ in seconds)
    cpu_seconds = statistics.median(cpu for _, cpu in seconds)
    cache = caches_nbytes(step.caches)
    weights = weights_bytes(net)
    step_bytes = cache + weights  # a step reads every filled cache position once, and every weight
    step_flops = counted_flops(step, lambda: plain_torch(True))
    return {
        "tokens_per_s": batch * args.steps / wall,
        "ms_per_step": 1000 * wall / args.steps,
        "tokens_per_cpu_s": batch * args.steps / cpu_seconds,  # per second of this process's CPU
        "decode_flops_per_token": costs.decode_flops_per_token(net.config, net.resolved, context),
        "achieved_gflops": args.steps * step_flops / wall / 1e9,  # this arm's counted FLOPs
        "run_cache_bytes": cache,
        "weights_bytes": weights,
        "step_bytes": step_bytes,
        "step_flops": step_flops,  # counted on this arm's path (the formula above is the default path's)
        "flop_per_byte": step_flops / step_bytes,
        "achieved_gb_per_s": args.steps * step_bytes / wall / 1e9,
    }


def memory_fields(
    step: Step, arm: str, context: int, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    if args.memory_mode == "child":
        return measure_memory(args, arm, context, step.token.shape[0])
    try:
        return probe_in_process(step, args.steps, meter_for(device))
    except Exception as exc:
        failed = failure(exc, "memory_")
    release(device)
    return failed


def decode_speed(
    nets: dict[str, Transformer], arms: dict[str, Arm], context: int, batch: int,
    args: argparse.Namespace, device: torch.device,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Tokens/s of single-token steps at `context` for every arm, timed round-robin, each with its roofline, its
    peak memory (with --memory) and its CUDA-graph speed (with --cuda-graph). Every arm's row has a status."""
    failed: dict[str, dict[str, str]] = {}
    steps: dict[str, Step] = {}
    for arm, (kind, path, plain) in arms.items():
        try:
            steps[arm] = prepare_steps(nets[kind], context, batch, args.chunk, device, path, plain)
        except Exception as exc:
            failed[arm] = failure(exc)
        if arm in failed:
            release(device)
    times = round_robin(dict(steps), args, device, failed)
    graphs = graph_speed({a: steps[a] for a in times}, args, device) if args.cuda_graph else {}
    out: dict[str, dict[str, Any]] = {}
    for arm in arms:
        row: dict[str, Any] = {"context": context, "batch": batch}
        if arm in failed:
            out[arm] = {**row, **failed[arm]}
            steps.pop(arm, None)
            continue
        step = steps[arm]
        try:
            row.update(status="ok", **speed_fields(step, times[arm], context, args))
        except Exception as exc:
            row.update(failure(exc))
        if row["status"] != "ok":
            release(device)
        if args.memory and row["status"] == "ok":
            row.update(memory_fields(step, arm, context, args, device))
        row.update(graphs.get(arm, {}))
        if (
            row["status"] == "ok" and row.get("graph_status") == "ok"
        ):  # what Python and launches cost this arm
            row["graph_speedup"] = row["graph_tokens_per_s"] / row["tokens_per_s"]
        out[arm] = row
    steps.clear()
    release(device)
    return out


def parse_arm(arm: str) -> Arm:
    """'lrkv' -> (lrkv, default path, fused where possible); 'lrkv:rebuilt'; 'lrkv:absorbed:plain'."""
    kind, path, plain = (arm.split(":") + [None, None])[:3]
    return kind, path or None, plain == "plain"


def arms_of(net: Transformer, kind: str, all_paths: bool, device: torch.device) -> dict[str, Arm]:
    """{arm name: (kind, path, plain)} for one attention: its default path, or every path it offers; on CUDA
    each path that has a fused kernel also without it."""
    variant = type(net.blocks[0].attn)
    paths = variant.decode_paths if all_paths else variant.decode_paths[:1]
    arms: dict[str, Arm] = {}
    for i, path in enumerate(paths):
        name = kind if i == 0 else f"{kind}:{path}"
        arms[name] = (kind, None if i == 0 else path, False)
        if i == 0 and device.type == "cuda" and variant.fused_decode_kernel and fused.triton_installed():
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


def attention_common(
    kind: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype
) -> tuple[Transformer, dict[str, Any]]:
    """One attention's model in the run's dtype and its batch-independent fields: fidelity (fp32) and cache bytes,
    measured at the first --batch."""
    model, attention = costs.load_configs(
        [costs.fragment("model", args.size), costs.fragment("attention", kind)]
    )
    net = build(model, attention, device, args.seed)
    n = min(args.check_tokens, model.seq_len)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    tokens = torch.randint(0, model.vocab_size, (args.batch[0], n), generator=gen).to(device)
    common = {
        "size": model.name,
        "attention": kind,
        "label": net.attention_config.label(),
        "device": device_name(device),
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        **fidelity(net, tokens, n // 2),  # fp32 weights at this point
    }
    net = net.to(dtype)
    common.update(cache_bytes(net, tokens, n // 2))
    return net, common


def progress(arm: str, speed: dict[str, Any]) -> str:
    where = f"{arm:>18} B={speed['batch']:>3} S={speed['context']:>6}:"
    if speed["status"] != "ok":
        return f"{where} {speed['status']}: {speed['error']}"
    line = (
        f"{where} {speed['tokens_per_s']:9.1f} tok/s, {speed['tokens_per_cpu_s']:9.1f} tok/CPU-s, "
        f"{speed['flop_per_byte']:6.1f} FLOP/B"
    )
    if speed.get("memory_status") == "ok":
        line += f", peak {speed['peak_memory_bytes'] / 2**20:.1f} MiB"
    elif "memory_status" in speed:
        line += f", memory {speed['memory_status']}"
    if speed.get("graph_status") == "ok":
        line += f", graph {speed['graph_tokens_per_s']:9.1f} tok/s"
    elif "graph_status" in speed:
        line += f", graph {speed['graph_status']}"
    return line


def benchmark(args: argparse.Namespace) -> list[dict[str, Any]]:
    device = pick_device(args.device)
    args = settle(args, device)
    dtype = run_dtype(args, device)
    if args.cuda_graph:
        print(GRAPH_NOTE, file=sys.stderr, flush=True)
    nets: dict[str, Transformer] = {}
    arms: dict[str, Arm] = {}
    common: dict[str, dict[str, Any]] = {}
    broken: dict[str, dict[str, str]] = {}
    for kind in args.attention:
        try:
            nets[kind], common[kind] = attention_common(kind, args, device, dtype)
        except UserError:
            raise  # a bad size or fragment is the command line's error, not an arm's
        except Exception as exc:
            broken[kind] = failure(exc)
        if kind in broken:
            release(device)
            continue
        arms.update(arms_of(nets[kind], kind, args.all_paths, device))
    rows = []
    for batch in args.batch:
        for context in args.context:
            for kind, status in broken.items():
                rows.append({"attention": kind, "arm": kind, "arm_label": kind, "context": context,
                             "batch": batch, **status})  # fmt: skip
            for arm, speed in decode_speed(nets, arms, context, batch, args, device).items():
                kind = arms[arm][0]
                label = arm_label(common[kind]["label"], arm)
                rows.append({**common[kind], "arm": arm, "arm_label": label, **speed})
                print(progress(arm, speed), flush=True, file=sys.stderr)
    return rows


# ----- output ---------------------------------------------------------------------------------------------
def _number(key: str, fmt: str, status: str = "status") -> Callable[[dict[str, Any]], str]:
    """A table cell: the row's value, or its status where the arm (or that part of it) did not run."""

    def cell(row: dict[str, Any]) -> str:
        if row.get("status", "ok") != "ok":
            return row["status"]
        if row.get(status, "ok") != "ok":
            return row[status]
        return format(row[key], fmt) if key in row else ""

    return cell


def _mib(row: dict[str, Any]) -> str:
    if row.get("status", "ok") != "ok" or row.get("memory_status") != "ok":
        return row.get("memory_status", row.get("status", ""))
    return f"{row['peak_memory_bytes'] / 2**20:.1f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    kinds = list(dict.fromkeys(r["attention"] for r in rows if "label" in r))
    first = {k: next(r for r in rows if r["attention"] == k and "label" in r) for k in kinds}
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
    batches = list(dict.fromkeys(r["batch"] for r in rows))

    def name(r: dict[str, Any]) -> str:  # one table line per arm, and per batch when there are several
        return r["arm_label"] + (f" B={r['batch']}" if len(batches) > 1 else "")

    arms = list(dict.fromkeys(name(r) for r in rows))
    contexts = sorted({r["context"] for r in rows})
    by = {(name(r), r["context"]): r for r in rows}
    tables = [
        ("tokens/s (wall)", _number("tokens_per_s", ".0f")),
        ("tokens per CPU-second", _number("tokens_per_cpu_s", ".0f")),
    ]
    if any("graph_status" in r for r in rows):
        tables.append(("tokens/s (CUDA graph replay)", _number("graph_tokens_per_s", ".0f", "graph_status")))
    kinds_of_peak = [r["peak_memory_kind"] for r in rows if r.get("memory_status") == "ok"]
    if kinds_of_peak:
        tables.append((f"peak MiB ({kinds_of_peak[0]})", _mib))
    for title, cell in tables:
        lines += ["", f"| {title} | " + " | ".join(f"S={c}" for c in contexts) + " |"]
        lines.append("|---" * (len(contexts) + 1) + "|")
        for arm in arms:
            cells = [cell(by[arm, c]) if (arm, c) in by else "" for c in contexts]
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| roofline per step | B | S | MB read (cache + weights) | MFLOP | FLOP/byte | GB/s achieved | GFLOP/s achieved |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("status", "ok") == "ok":
            lines.append(
                f"| {r['arm_label']} | {r['batch']} | {r['context']} | {r['step_bytes'] / 1e6:.2f} | "
                f"{r['step_flops'] / 1e6:.1f} | {r['flop_per_byte']:.2f} | {r['achieved_gb_per_s']:.2f} | "
                f"{r['achieved_gflops']:.2f} |"
            )
    failures = [r for r in rows if r.get("status", "ok") != "ok"]
    for r in rows:
        for part in ("memory", "graph"):
            if r.get(f"{part}_status", "ok") not in ("ok", "skipped"):
                failures.append({**r, "status": f"{part} {r[f'{part}_status']}", "error": r[f"{part}_error"]})
    if failures:
        lines += ["", "| failed | B | S | status | error |", "|---|---|---|---|---|"]
        for r in failures:
            lines.append(
                f"| {r['arm_label']} | {r['batch']} | {r['context']} | {r['status']} | {r['error']} |"
            )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cpu, gpu = CPU_DEFAULTS, GPU_DEFAULTS
    p.add_argument(
        "--size", default=None, help=f"conf/model/<size>.yaml (default {gpu.size} on CUDA, {cpu.size} on CPU)"
    )
    p.add_argument("--attention", nargs="+", default=list(names()), choices=names())
    p.add_argument(
        "--context",
        type=int,
        nargs="+",
        default=None,
        help=f"decode contexts S (default {list(gpu.contexts)} on CUDA, {list(cpu.contexts)} on CPU)",
    )
    p.add_argument(
        "--batch",
        type=int,
        nargs="+",
        default=None,
        help=f"sequences decoded together, each value a run (default {gpu.batches[0]} on CUDA, {cpu.batches[0]} on CPU)",
    )
    p.add_argument("--steps", type=int, default=32, help="timed steps per repeat (default 32)")
    p.add_argument("--repeats", type=int, default=3, help="repeats; the median is reported (default 3)")
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk length (default 512)")
    p.add_argument("--check-tokens", type=int, default=128, help="tokens of the fidelity/cache generation")
    p.add_argument(
        "--all-paths",
        action="store_true",
        help="time every decode path of each attention, not only its default",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    precision.add_flag(p)
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory probes")
    p.add_argument(
        "--memory-mode",
        choices=("auto", "in-process", "child"),
        default="auto",
        help="peak memory in this process (reset between arms; CUDA's default) or one child process per "
        "arm and context (the CPU's default)",
    )
    p.add_argument(
        "--cuda-graph",
        action="store_true",
        help="also capture each arm's step in a CUDA graph and time its replays (CUDA only)",
    )
    p.add_argument("--memory-probe", nargs=2, metavar=("ARM", "CONTEXT"), help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of markdown tables")
    p.add_argument("--output", type=Path, default=None, help="also write the rows as JSON to this file")
    return p  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_probe:  # child process of measure_memory
        device = pick_device(args.device)
        print(json.dumps({**memory_probe(settle(args, device), device), "device": device.type}))
        return 0

    def run() -> None:
        rows = benchmark(args)
        if args.output is not None:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(rows, indent=1) + "\n")
        print(json.dumps(rows, indent=1) if args.json else markdown(rows))

    return run_entry(run, "benchmarks/decode.py")


if __name__ == "__main__":
    sys.exit(main())
