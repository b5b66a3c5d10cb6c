"""One sharded optimiser step equals the single-process step (docs/architecture.md, "Scale"), on 2 gloo
processes: MuonAdamW given the same gradients as DTensor shards moves every shard exactly as the unsharded
parameter moves (where torch.optim.Muon, which orthogonalises each shard alone, does not); and a tiny
decoder sharded by `parallelize` (full, hybrid (replicate 2, shard 1) and hybrid (1, 2) meshes, with and
without activation checkpointing) gets the same gradients from half a batch per rank and takes the same
AdamW and Muon steps as one process on the whole batch. Both Muon paths are checked at the optimiser level:
Newton-Schulz split over the ranks (the default) and every rank orthogonalising every matrix (the earlier
path); end to end, the split one runs about 1/world of the Newton-Schulz FLOPs on each rank, and its transient buffers are bounded by the
rank's shard and the matrices it owns.
"""

from __future__ import annotations

import copy
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from lightning_modules.distributed.parallel import ParallelConfig, data_parallel_mesh, parallelize
from lightning_modules.model.transformer import Transformer
from lightning_modules.optim.muon import MuonAdamW
from lightning_modules.optim.setup import OptimizerConfig, build_optimizer
from tests.gloo_exit import leave
from tests.helpers import attn, free_port, tiny_model

WORLD = 2
STEPS = 3
# Gradients under FSDP differ from one process's by the order of summation only (fp32). Each step then feeds
# the sharded gradients to both optimisers, so that the optimiser steps are compared exactly: left to their
# own gradients, bf16 Newton-Schulz (as in torch.optim.Muon) and AdamW's ~lr x sign(g) first steps turn
# such rounding differences into up to ~1 % of a step (measured), which would hide nothing but prove less.
GRAD_TOL = {"rtol": 1e-5, "atol": 1e-7}


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def optimizer_level(rank: int) -> None:
    """Same full gradients in, same parameters out: exact, row blocks crossing the shard boundary included."""
    mesh = init_device_mesh("cpu", (WORLD,))
    torch.manual_seed(0)
    # (7, 5) in blocks (3, 4): rank 0 holds rows 0-3, rank 1 rows 4-6, so the block boundary (3) falls
    # inside rank 0's shard; (3, 6, 4): one matrix per slice; (10, 6): one matrix; (5,): AdamW.
    shapes = [(7, 5), (3, 6, 4), (10, 6), (5,)]
    ref = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    sharded = [torch.nn.Parameter(distribute_tensor(p.detach().clone(), mesh, [Shard(0)])) for p in ref]

    def groups(ps: list[torch.nn.Parameter]) -> list[dict]:
        return [{"params": ps[:3], "use_muon": True}, {"params": ps[3:], "use_muon": False}]

    again = [torch.nn.Parameter(distribute_tensor(p.detach().clone(), mesh, [Shard(0)])) for p in ref]
    opts = [MuonAdamW(groups(ps), lr=0.02, blocks={ps[0]: (3, 4)}) for ps in (ref, sharded)]
    opts.append(MuonAdamW(groups(again), lr=0.02, blocks={again[0]: (3, 4)}, distribute_newton_schulz=False))
    torch_muon = torch.optim.Muon(
        [torch.nn.Parameter(distribute_tensor(ref[2].detach().clone(), mesh, [Shard(0)]))], lr=0.02
    )
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        grads = [torch.randn(s, generator=g) for s in shapes]
        for p, q, r, grad in zip(ref, sharded, again, grads, strict=True):
            p.grad = grad
            q.grad = distribute_tensor(grad, mesh, [Shard(0)])
            r.grad = distribute_tensor(grad, mesh, [Shard(0)])
        torch_muon.param_groups[0]["params"][0].grad = sharded[2].grad.clone()
        for opt in (*opts, torch_muon):
            opt.step()
    for p, q, r in zip(ref, sharded, again, strict=True):
        assert torch.equal(q.full_tensor(), p.detach()), q.shape
        assert torch.equal(r.full_tensor(), p.detach()), r.shape
    # torch's Muon on the shards is another update (each half orthogonalised alone): the check can fail.
    wrong = torch_muon.param_groups[0]["params"][0].full_tensor()
    assert not torch.allclose(wrong, ref[2].detach(), atol=1e-4)


def end_to_end(rank: int, optimizer: str) -> None:
    """parallelize() on several meshes: half the batch per rank gives the whole batch's gradients, and the
    optimiser, given those gradients, moves the shards exactly as one process moves the whole parameters."""
    lightning_mesh = init_device_mesh("cpu", (WORLD, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
    cases = [
        ("lrkv", ParallelConfig(), 1),
        ("mla", ParallelConfig(activation_checkpointing=True), 1),
        ("gqa", ParallelConfig(sharding="hybrid"), 2),  # (replicate 2, shard 1): a replica per "node"
        ("lrkv", ParallelConfig(sharding="hybrid", reshard_after_forward=False), 1),  # (1, 2)
    ]
    g = torch.Generator().manual_seed(1)
    for kind, config, nodes in cases:
        torch.manual_seed(0)
        ref = Transformer(tiny_model(), attn(kind))
        model = copy.deepcopy(ref)
        mesh = data_parallel_mesh(lightning_mesh, config.sharding, num_nodes=nodes)
        parallelize(model, config, mesh, param_dtype=None)
        opt_config = OptimizerConfig(name=optimizer, lr=0.02, embed_lr=0.1, head_lr=0.004)
        ref_opt, opt = build_optimizer(ref, opt_config), build_optimizer(model, opt_config)
        start = [p.detach().clone() for p in ref.parameters()]
        for _ in range(STEPS):
            batch = torch.randint(0, 128, (2 * WORLD, 17), generator=g)
            for net, tokens in ((ref, batch), (model, batch.chunk(WORLD)[rank])):
                logits = net(tokens[:, :-1])
                F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
            for (name, p), q in zip(ref.named_parameters(), model.parameters(), strict=True):
                assert isinstance(q, DTensor), name
                torch.testing.assert_close(full(q.grad), p.grad, **GRAD_TOL, msg=f"{kind} {name} grad")
                # The same gradients into both optimisers (see GRAD_TOL): the steps must then be identical.
                p.grad = full(q.grad).clone()
            for o in (ref_opt, opt):
                o.step()
                o.zero_grad()
        for (name, p), q, p0 in zip(ref.named_parameters(), model.parameters(), start, strict=True):
            assert not torch.equal(p.detach(), p0) or name.endswith("norm.weight"), f"{name} did not move"
            assert torch.equal(full(q).detach(), p.detach()), f"{optimizer} {kind} {config.sharding} {name}"
        if optimizer == "muon":
            check_work_and_memory(ref_opt, opt)


def check_work_and_memory(ref_opt: MuonAdamW, opt: MuonAdamW) -> None:
    """Newton-Schulz FLOPs: the ranks' counts add up to one process's, and each rank runs about 1/world of
    them. Transient bytes of the split exchange: fp32 in and bf16 out of
    this rank's shard and of the matrices it owns, 8 bytes per element of each, never the whole group."""
    flops = [0] * WORLD
    dist.all_gather_object(flops, opt.ns_flops)
    total = ref_opt.ns_flops
    assert sum(flops) == total, (flops, total)
    assert max(flops) <= 1.05 * total / WORLD, (flops, total)
    group = next(g for g in opt.param_groups if g["use_muon"])
    (plan,) = opt._plans.values()
    shard = sum(p.to_local().numel() for p in group["params"])
    owned = sum(m.shape.numel() for m in plan.owned)
    whole = sum(p.numel() for p in group["params"])
    assert owned <= 1.05 * whole / WORLD, (owned, whole)
    assert 0 < opt.transient_bytes <= 8 * (shard + owned), (opt.transient_bytes, shard, owned)


def worker(rank: int, port: int, scenario: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # A failing check on one rank leaves the other waiting in a collective: give up after a minute.
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    try:
        if scenario == "optimizer":
            optimizer_level(rank)
        else:
            end_to_end(rank, scenario)
        dist.barrier()  # neither rank tears down its connections while the other still uses them
    finally:
        dist.destroy_process_group()
    leave()  # checked and torn down (tests/gloo_exit.py says why)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["optimizer", "adamw", "muon"])
def test_sharded_step_equals_single_process_step(scenario: str) -> None:
    mp.spawn(worker, args=(free_port(), scenario), nprocs=WORLD, join=True)
