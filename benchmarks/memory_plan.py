"""The memory plan (lightning_modules/costs/memory.py) against the peak a real training step reaches on this CPU.

    python benchmarks/memory_plan.py --size nano --attention lrkv --micro-batch 8 --seq-len 64
    python benchmarks/memory_plan.py --strategy fsdp --rank 0 ...   # one of 2 FSDP ranks, fake process group
    python benchmarks/memory_plan.py --all          # the rows of BENCHMARKS.md (single and 2 FSDP ranks)

A measured step is LanguageModel's on one device or under FSDP2 (lightning_modules/distributed/parallel.py):
forward (under bf16 autocast with bf16-mixed) ending in the chunked fp32 cross-entropy
(lightning_modules/model/loss.py), backward, gradient clipping at 1.0, the optimiser's step and
zero_grad(set_to_none=True). Three steps run; the peak is over the last two (the
optimiser state exists from the first).

How the peak is measured. torch's CPU allocator keeps no statistics (torch.cuda.max_memory_allocated has no
CPU twin), and RSS moves with glibc's arenas, the Python heap and lazily freed pages, by more than the
small models' whole footprint. torch.profiler with profile_memory=True records every allocation and free
of the CPU allocator, storage resizes included (FSDP2 frees and regathers weights that way), with
timestamps; summing them from before the model exists gives the bytes of live tensors at every moment,
deterministically in one process: the same program gives the same figure. It counts tensor memory only,
which is what the plan predicts (a GPU run adds its CUDA context; see the plan's docstring).

Under FSDP each rank is measured in its own process on torch's fake process group (world size 2, the rank
given): its collectives return at once in the calling thread and move no data, so FSDP2 and the optimiser
allocate and free exactly what they do on a real rank, every event lands on the profiled thread, and the
figure is deterministic. The row reports the fullest rank, because a job stops when its fullest rank runs out
of memory. What this leaves out is the communication library's own buffers while a collective is in flight
(gloo copies a reduce-scatter's input; NCCL's buffers live outside torch's allocator).

Why not 2 real gloo ranks (still there: --backend gloo). The profiler records allocator events only on the
thread that started it, and gloo frees the buffers a collective holds on its worker threads once the work
completes: those frees are never seen, the buffers stay counted as live, and the count drifts upward from
step to step by however many frees landed on the worker that time (BENCHMARKS.md, "Memory plan against
measured peak", has the figures). A gloo row is an overcount by a varying amount, not a peak.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_modules.costs import counts as costs  # noqa: E402
from lightning_modules.costs import memory  # noqa: E402
from lightning_modules.distributed.parallel import ParallelConfig, parallelize  # noqa: E402
from lightning_modules.model.attention import resolve_attention  # noqa: E402
from lightning_modules.model.transformer import Transformer  # noqa: E402
from lightning_modules.optim.setup import OptimizerConfig, build_optimizer  # noqa: E402

STEPS = 3


def configs(args: argparse.Namespace) -> tuple[Any, Any, memory.Setup]:
    model, attention = costs.load_configs(
        [costs.fragment("model", args.size), costs.fragment("attention", args.attention)]
    )
    overrides = {k: v for k, v in (("seq_len", args.seq_len), ("vocab_size", args.vocab_size)) if v}
    model = dataclasses.replace(model, **overrides)
    world = int(os.environ.get("WORLD_SIZE", "2" if args.strategy == "fsdp" else "1"))
    setup = memory.Setup(
        strategy=args.strategy,
        world=world,
        micro_batch=args.micro_batch,
        precision=args.precision,
        activation_checkpointing=args.activation_checkpointing,
        optimizer=args.optimizer,
        device="cpu",  # the plan of the step measured here, on this CPU (its SDPA kernels, its autocast)
    )
    return model, resolve_attention(model, attention), setup


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Peak bytes of live tensors over a step: this process's, or the fullest rank's under FSDP (module
    docstring)."""
    model, attention, setup = configs(args)
    mesh = None
    if setup.sharded:
        import torch.distributed as dist  # late: only a sharded run starts a process group
        from torch.distributed.device_mesh import init_device_mesh

        if args.backend == "fake":
            from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

            dist.init_process_group("fake", store=FakeStore(), rank=args.rank, world_size=setup.world)
        else:
            dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (setup.world,))
    peak = profiled_peak(model, attention, setup, mesh)
    row = result_row(model, attention, setup, peak)
    if mesh is None:
        return row
    import torch.distributed as dist  # late: as above

    gathered: list[Any] = [peak]
    if args.backend == "gloo":
        gathered = [None] * setup.world
        dist.all_gather_object(gathered, peak)
        row = result_row(model, attention, setup, max(gathered))
        dist.barrier()
    row["measured_peak_per_rank"] = gathered
    row["backend"] = args.backend
    dist.destroy_process_group()
    return row


def profiled_peak(model: Any, attention: Any, setup: memory.Setup, mesh: Any) -> int:
    """Run STEPS training steps under torch.profiler's memory recording; the peak of live tensor bytes over
    steps 2 and onwards, counted from before the model is built."""
    from torch.profiler import ProfilerActivity, profile  # late: the profiler is only needed to measure

    mixed = setup.precision == "bf16-mixed"
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.manual_seed(0)
        net = Transformer(model, attention)
        parallel = ParallelConfig(activation_checkpointing=setup.activation_checkpointing)
        parallelize(net, parallel, mesh, torch.bfloat16 if mixed and mesh is not None else None)
        optimizer = build_optimizer(net, OptimizerConfig(name=setup.optimizer, lr=0.02, embed_lr=0.2))
        tokens = torch.randint(0, model.vocab_size, (setup.micro_batch, model.seq_len + 1))
        marks = []
        for _ in range(STEPS):
            marks.append(time.time_ns())
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
                loss = net(tokens[:, :-1], targets=tokens[:, 1:])  # LanguageModel's loss, in chunks
            loss.backward()
            del loss
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        marks.append(time.time_ns())
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    live = peak = 0
    for at, nbytes in events:
        live += nbytes
        if at >= marks[1]:  # steps 2 and 3: the optimiser state exists
            peak = max(peak, live)
    return peak


def result_row(model: Any, attention: Any, setup: memory.Setup, peak: int) -> dict[str, Any]:
    """The measured peak beside the memory plan's for the same setting."""
    planned = memory.plan(model, attention, setup)
    return {
        "size": model.name,
        "attention": attention.label(),
        "strategy": setup.strategy,
        "world": setup.world,
        "micro_batch": setup.micro_batch,
        "seq_len": model.seq_len,
        "vocab": model.padded_vocab_size,
        "precision": setup.precision,
        "activation_checkpointing": setup.activation_checkpointing,
        "optimizer": setup.optimizer,
        "measured_peak": peak,
        "planned_peak": planned.peak,
        "planned_at": planned.peak_at,
        "ratio": round(planned.peak / peak, 3),
        "plan": planned.as_dict(),
    }


# BENCHMARKS.md's rows, as this script's own arguments (the YAML's comment says which and why).
ALL = [
    [str(a) for a in row]
    for row in yaml.safe_load((ROOT / "conf/benchmarks/memory_plan.yaml").read_text())["rows"]
]


def run_row(argv: list[str]) -> dict[str, Any]:
    """One measurement in a fresh process, its JSON row back. Under fsdp: one process per rank on the fake
    process group, and the row of the fullest rank with every rank's peak (module docstring)."""
    if "fsdp" not in argv:
        return _one_process([sys.executable, __file__, *argv, "--json"])
    rows = [_one_process([sys.executable, __file__, *argv, "--rank", str(r), "--json"]) for r in range(2)]
    fullest = max(rows, key=lambda r: r["measured_peak"])
    return {**fullest, "measured_peak_per_rank": [r["measured_peak"] for r in rows]}


def _one_process(command: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def line(r: dict[str, Any]) -> str:
    where = r["strategy"] + (f" x {r['world']}" if r["world"] > 1 else "")
    return (
        f"| {r['size']} | {r['attention']} | {where} | {r['micro_batch']} x {r['seq_len']} | {r['precision']} | "
        f"{'on' if r['activation_checkpointing'] else 'off'} | {r['measured_peak'] / 2**20:.2f} | "
        f"{r['planned_peak'] / 2**20:.2f} | {r['ratio']:.3f} | {r['planned_at']} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="nano")
    parser.add_argument("--attention", default="mha")
    parser.add_argument("--strategy", choices=["single", "fsdp"], default="single")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--precision", choices=memory.PRECISIONS, default="32-true")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--optimizer", choices=memory.OPTIMIZERS, default="muon")
    parser.add_argument("--rank", type=int, default=0, help="under fsdp: the rank of 2 this process measures")
    parser.add_argument(
        "--backend",
        choices=["fake", "gloo"],
        default="fake",
        help="under fsdp: fake (one rank per process, exact) or gloo (2 real ranks under torchrun; an overcount)",
    )
    parser.add_argument("--all", action="store_true", help="every row of BENCHMARKS.md, a table")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 0 <= args.rank < 2:
        parser.error(f"--rank {args.rank}: the fsdp rows measure 2 ranks, 0 or 1")
    if args.all:
        print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch", torch.__version__)
        print(
            "| size | attention | strategy | batch | precision | AC | measured MiB | plan MiB | plan / measured | plan's peak at |"
        )
        print("|" + "---|" * 10)
        for row_args in ALL:
            print(line(run_row(row_args)), flush=True)
        return 0
    row = measure(args)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(row) if args.json else line(row), flush=True)
    if args.strategy == "fsdp" and args.backend == "gloo":
        # The row is out. Skip interpreter finalization: gloo's worker threads, torn down with it, now and then
        # abort the rank ("terminate called without an active exception") after destroy_process_group.
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
