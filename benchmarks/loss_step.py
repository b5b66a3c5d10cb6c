"""The training loss in chunks (lightning_modules/model/loss.py) against the plain loss over whole logits.

    python benchmarks/loss_step.py --size nano --micro-batch 8 [--seq-len 256] [--vocab-size 50304]
        [--precision bf16-mixed] [--steps 5] [--threads 1]

One process, one model, the same batch. "plain" is the loss LanguageModel computed before the chunked one,
F.cross_entropy(model(tokens).float(), targets); "chunked" is model(tokens, targets=targets). Each step is
the forward and the backward (no optimiser), the two paths alternating step by step after a warm-up step so
that load from other jobs falls on both; median wall and CPU (process) time. Then one more step of each
under torch.profiler's memory recording (as benchmarks/memory_plan.py measures): the peak of live tensor
bytes above what was live when the step began (parameters and their gradients from earlier steps included),
so the difference is the loss's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_modules.costs import counts as costs  # noqa: E402
from lightning_modules.model.attention import AttentionConfig  # noqa: E402
from lightning_modules.model.transformer import Transformer  # noqa: E402


def step_peak(step: Callable[[], None]) -> int:
    """Peak live tensor bytes during `step`, above those live when it starts."""
    from torch.profiler import ProfilerActivity, profile  # late: only this measurement needs it

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="nano")
    parser.add_argument("--attention", default="mha")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, help="default: the size's")
    parser.add_argument("--vocab-size", type=int, help="default: the size's (128m and up: 50304)")
    parser.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "32-true"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config, _ = costs.load_configs([costs.fragment("model", args.size)])
    if args.seq_len or args.vocab_size:
        config = dataclasses.replace(
            config, seq_len=args.seq_len or config.seq_len, vocab_size=args.vocab_size or config.vocab_size
        )
    torch.manual_seed(0)
    net = Transformer(config, AttentionConfig(kind=args.attention))
    tokens = torch.randint(0, config.vocab_size, (args.micro_batch, config.seq_len + 1))
    mixed = args.precision == "bf16-mixed"

    def plain() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            logits = net(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        del logits
        loss.backward()

    def chunked() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            loss = net(tokens[:, :-1], targets=tokens[:, 1:])
        loss.backward()

    paths = {"plain": plain, "chunked": chunked}
    wall: dict[str, list[float]] = {k: [] for k in paths}
    cpu: dict[str, list[float]] = {k: [] for k in paths}
    for step in range(1 + args.steps):
        for label, run in paths.items():
            net.zero_grad(set_to_none=False)  # gradients stay allocated: the peaks compare the losses alone
            start, start_cpu = time.perf_counter(), time.process_time()
            run()
            if step:
                wall[label].append(time.perf_counter() - start)
                cpu[label].append(time.process_time() - start_cpu)
    peaks = {}
    for label, run in paths.items():
        net.zero_grad(set_to_none=False)
        peaks[label] = step_peak(run)
    result = {
        "size": args.size,
        "attention": args.attention,
        "micro_batch": args.micro_batch,
        "seq_len": config.seq_len,
        "vocab": config.padded_vocab_size,
        "precision": args.precision,
        "threads": args.threads,
        **{
            label: {
                "step_s": statistics.median(wall[label]),
                "cpu_s": statistics.median(cpu[label]),
                "peak_bytes": peaks[label],
            }
            for label in paths
        },
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{args.size} {args.attention}, batch {args.micro_batch} x {config.seq_len}, vocab "
        f"{config.padded_vocab_size}, {args.precision}, {args.threads} thread(s)"
    )
    for label in paths:
        r = result[label]
        print(
            f"  {label:8s} step {r['step_s'] * 1e3:9.1f} ms  CPU {r['cpu_s'] * 1e3:9.1f} ms  "
            f"peak above the step's start {r['peak_bytes'] / 2**20:9.1f} MiB"
        )
    p, c = result["plain"], result["chunked"]
    print(
        f"  plain / chunked: CPU time {p['cpu_s'] / c['cpu_s']:.2f}x, peak {p['peak_bytes'] / c['peak_bytes']:.2f}x"
    )


if __name__ == "__main__":
    main()
