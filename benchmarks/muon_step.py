"""Muon's optimiser step under FSDP on gloo ranks: Newton-Schulz split over the ranks (each rank
orthogonalises the matrices it owns, lightning_modules/optim/distributed.py) against the earlier path
(every rank gathers and orthogonalises every matrix), same model, same gradients, same run.

    python benchmarks/muon_step.py [--size 20m] [--attention lrkv] [--world 2] [--steps 5] [--json]
    python benchmarks/muon_step.py --ddp [--size 20m] [--attention lrkv] [--world 2] [--steps 5] [--json]
    python benchmarks/muon_step.py --reference-loop [--size 20m] [--attention lrkv] [--threads 1] [--steps 5]
    python benchmarks/muon_step.py --adamw-paths [--size 20m] [--attention lrkv] [--optimizer adamw] [--steps 5]

--ddp: the same on a replicated model (no sharding, as DDP holds it): Newton-Schulz split over the ranks
and all-gathered (MuonAdamW replicated=True) against every rank orthogonalising every matrix.

--reference-loop: one process, no FSDP: Newton-Schulz batched over equal-shaped matrices (the default,
lightning_modules/optim/muon.py) against the per-matrix reference loop (batched_newton_schulz=False), same
model, same fixed gradients, alternating the two paths step by step so that load from other jobs falls on
both; median wall and CPU (process) time of the timed steps, and Newton-Schulz calls per step.

--adamw-paths: one process, no FSDP: the AdamW groups on each of torch's paths (MuonAdamW's adamw_path: one
tensor at a time, foreach, fused: the default), same model and gradients, alternating step by step; median
wall and CPU time of the whole optimiser step (with --optimizer muon, the Muon groups' work is in each), and the torch
operations one step calls (on a GPU, each at least one kernel launch).

Each rank runs one thread. The model is sharded by `parallelize` as in training, given fixed random
gradients, and each path takes warm-up steps, then `--steps` timed steps (median of the slowest rank per
step). Also printed: Newton-Schulz GFLOPs per rank per step on each path and the split's transient bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor
from torch.overrides import TorchFunctionMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_modules.costs import counts as costs  # noqa: E402
from lightning_modules.distributed.parallel import ParallelConfig, data_parallel_mesh, parallelize  # noqa: E402
from lightning_modules.model.attention import AttentionConfig  # noqa: E402
from lightning_modules.model.transformer import Transformer  # noqa: E402
from lightning_modules.optim.setup import OptimizerConfig, build_optimizer  # noqa: E402

WARMUP = 2
PATHS = ("single", "foreach", "fused")  # MuonAdamW's adamw_path, the reference first


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    lightning_mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
    mesh = data_parallel_mesh(lightning_mesh, "full", num_nodes=1)
    torch.manual_seed(0)
    config, _ = costs.load_configs([costs.fragment("model", args.size)])
    model = Transformer(config, AttentionConfig(kind=args.attention))
    if not args.ddp:
        parallelize(model, ParallelConfig(), mesh, param_dtype=None)
    g = torch.Generator().manual_seed(1)
    grads = {}
    for name, p in model.named_parameters():
        grad = torch.randn(p.shape, generator=g) * 1e-3  # the same on every rank, as after DDP's all-reduce
        grads[name] = grad if args.ddp else distribute_tensor(grad, p.device_mesh, p.placements)
    result = {}
    for label, distribute in (("earlier", False), ("split", True)):
        opt = build_optimizer(model, OptimizerConfig(name="muon", lr=0.02), replicated=args.ddp)
        opt.distribute_newton_schulz = distribute
        times = []
        for step in range(WARMUP + args.steps):
            for name, p in model.named_parameters():
                p.grad = grads[name]
            dist.barrier()
            start = time.perf_counter()
            opt.step()
            elapsed = torch.tensor(time.perf_counter() - start)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the step ends when the slowest rank ends
            if step >= WARMUP:
                times.append(elapsed.item())
        flops = [0] * world
        dist.all_gather_object(flops, opt.ns_flops // (WARMUP + args.steps))
        result[label] = {
            "step_s": statistics.median(times),
            "ns_gflops_per_rank": [f / 1e9 for f in flops],
            "transient_mib": opt.transient_bytes / 2**20,
            "ns_calls_per_rank": opt.ns_calls // (WARMUP + args.steps),
        }
    if rank == 0:
        result["params"] = sum(p.numel() for p in model.parameters())
        Path(out).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    # Past gloo's occasional abort in interpreter finalization (benchmarks/memory_plan.py says more).
    os._exit(0)


def reference_loop(args: argparse.Namespace) -> dict:
    """Batched against loop Newton-Schulz in one process: both optimisers step the same model from the same
    gradients (the parameters drift apart by float rounding at most, which does not change the work)."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config, _ = costs.load_configs([costs.fragment("model", args.size)])
    model = Transformer(config, AttentionConfig(kind=args.attention))
    g = torch.Generator().manual_seed(1)
    grads = {name: torch.randn(p.shape, generator=g) * 1e-3 for name, p in model.named_parameters()}
    opts = {}
    for label, batched in (("loop", False), ("batched", True)):
        opts[label] = build_optimizer(model, OptimizerConfig(name="muon", lr=0.02))
        opts[label].batched_newton_schulz = batched
    wall: dict[str, list[float]] = {label: [] for label in opts}
    cpu: dict[str, list[float]] = {label: [] for label in opts}
    for step in range(WARMUP + args.steps):
        for label, opt in opts.items():
            for name, p in model.named_parameters():
                p.grad = grads[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            opt.step()
            if step >= WARMUP:
                wall[label].append(time.perf_counter() - start)
                cpu[label].append(time.process_time() - start_cpu)
    muon = [
        s
        for g in opts["loop"].param_groups
        if g["use_muon"]
        for p in g["params"]
        for s in opts["loop"].block_shapes(p)
    ]
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "matrices": len(muon),
        "shapes": len(set(muon)),
        **{
            label: {
                "step_s": statistics.median(wall[label]),
                "cpu_s": statistics.median(cpu[label]),
                "ns_calls_per_step": opt.ns_calls // (WARMUP + args.steps),
                "ns_gflops_per_step": opt.ns_flops / (WARMUP + args.steps) / 1e9,
            }
            for label, opt in opts.items()
        },
    }


# What CountOps leaves out: attribute reads, reads of the host step counters, grad mode, profiler marks, and
# host scalars made from Python numbers; none of them is a kernel on a GPU.
NOT_KERNELS = (
    "__get__",
    "device",
    "item",
    "is_complex",
    "_set_grad_enabled",
    "tensor",
    "_record_function_enter_new",
    "_record_function_exit",
)


class CountOps(TorchFunctionMode):
    """Counts the torch operations called that compute on tensors (a foreach operation once, however many
    tensors it takes): on a GPU each is at least one kernel launch."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += getattr(func, "__name__", "") not in NOT_KERNELS
        return func(*args, **(kwargs or {}))


def adamw_paths(args: argparse.Namespace) -> dict:
    """The optimiser step with the AdamW groups on each path: the optimisers step the same model from the
    same gradients, alternating."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config, _ = costs.load_configs([costs.fragment("model", args.size)])
    model = Transformer(config, AttentionConfig(kind=args.attention))
    g = torch.Generator().manual_seed(1)
    grads = {name: torch.randn(p.shape, generator=g) * 1e-3 for name, p in model.named_parameters()}
    opts = {}
    for label in PATHS:
        opts[label] = build_optimizer(model, OptimizerConfig(name=args.optimizer, lr=0.02))
        opts[label].adamw_path = label
    wall: dict[str, list[float]] = {label: [] for label in opts}
    cpu: dict[str, list[float]] = {label: [] for label in opts}
    for step in range(WARMUP + args.steps):
        for label, opt in opts.items():
            for name, p in model.named_parameters():
                p.grad = grads[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            opt.step()
            if step >= WARMUP:
                wall[label].append(time.perf_counter() - start)
                cpu[label].append(time.process_time() - start_cpu)
    ops = {}
    for label, opt in opts.items():  # one more step each, counting the operations it calls
        for name, p in model.named_parameters():
            p.grad = grads[name]
        with CountOps() as counter:
            opt.step()
        ops[label] = counter.count
    adamw = [p for g in opts["single"].param_groups if not g["use_muon"] for p in g["params"]]
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "adamw_tensors": len(adamw),
        "adamw_params": sum(p.numel() for p in adamw),
        **{
            label: {
                "step_s": statistics.median(wall[label]),
                "cpu_s": statistics.median(cpu[label]),
                "ops_per_step": ops[label],
            }
            for label in opts
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="20m")
    parser.add_argument("--attention", default="lrkv")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--reference-loop", action="store_true", help="one process: batched vs loop")
    parser.add_argument("--ddp", action="store_true", help="a replicated model (DDP) instead of FSDP shards")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (--reference-loop, --adamw-paths)"
    )
    parser.add_argument("--adamw-paths", action="store_true", help="one process: AdamW's three paths")
    parser.add_argument("--optimizer", default="adamw", choices=["adamw", "muon"], help="with --adamw-paths")
    args = parser.parse_args()
    if args.adamw_paths:
        result = adamw_paths(args)
        if args.json:
            print(json.dumps(result))
            return
        print(
            f"{args.size} {args.attention} {args.optimizer}, {result['params'] / 1e6:.1f}M parameters, "
            f"{result['adamw_tensors']} AdamW tensors ({result['adamw_params'] / 1e6:.1f}M), one process, "
            f"{args.threads} thread(s)"
        )
        for label in PATHS:
            r = result[label]
            print(
                f"  {label:8s} step {r['step_s'] * 1e3:8.2f} ms  CPU {r['cpu_s'] * 1e3:8.2f} ms  "
                f"operations {r['ops_per_step']}"
            )
        for label in PATHS[1:]:
            print(
                f"  single / {label} {result['single']['step_s'] / result[label]['step_s']:.2f}x (wall), "
                f"{result['single']['cpu_s'] / result[label]['cpu_s']:.2f}x (CPU)"
            )
        return
    if args.reference_loop:
        result = reference_loop(args)
        if args.json:
            print(json.dumps(result))
            return
        print(
            f"{args.size} {args.attention}, {result['params'] / 1e6:.1f}M parameters, one process, "
            f"{args.threads} thread(s), {result['matrices']} Muon matrices in {result['shapes']} shapes"
        )
        for label in ("loop", "batched"):
            r = result[label]
            print(
                f"  {label:8s} step {r['step_s'] * 1e3:8.1f} ms  CPU {r['cpu_s'] * 1e3:8.1f} ms  "
                f"Newton-Schulz calls {r['ns_calls_per_step']:5d}  GFLOPs {r['ns_gflops_per_step']:.2f}"
            )
        print(
            f"  speed-up {result['loop']['step_s'] / result['batched']['step_s']:.2f}x (wall), "
            f"{result['loop']['cpu_s'] / result['batched']['cpu_s']:.2f}x (CPU)"
        )
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"muon_step_{os.getpid()}.json"
    mp.spawn(worker, args=(args.world, port, args, str(out)), nprocs=args.world, join=True)
    result = json.loads(out.read_text())
    out.unlink()
    if args.json:
        print(json.dumps(result))
        return
    how = "DDP (replicated)" if args.ddp else "FSDP"
    print(
        f"{args.size} {args.attention}, {result['params'] / 1e6:.1f}M parameters, {args.world} gloo ranks, {how}"
    )
    for label in ("earlier", "split"):
        r = result[label]
        gflops = ", ".join(f"{f:.2f}" for f in r["ns_gflops_per_rank"])
        print(
            f"  {label:8s} step {r['step_s'] * 1e3:8.1f} ms   Newton-Schulz GFLOPs per rank [{gflops}], "
            f"calls on rank 0 {r['ns_calls_per_rank']}"
        )
    print(f"  speed-up {result['earlier']['step_s'] / result['split']['step_s']:.2f}x")
    print(f"  split exchange transient buffers {result['split']['transient_mib']:.1f} MiB per rank")


if __name__ == "__main__":
    main()
