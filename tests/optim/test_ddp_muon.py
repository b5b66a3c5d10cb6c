"""Newton-Schulz split over DDP ranks (lightning_modules/optim/distributed.py, ReplicatedPlan), on 2 gloo
processes: a tiny decoder wrapped in torch's DistributedDataParallel, half the batch per rank, gets the whole
batch's gradients, and MuonAdamW(replicated=True) given those gradients takes exactly the step one process
takes, on every rank, while each rank runs about half of the Newton-Schulz FLOPs (every rank ran all of them
before). Both Newton-Schulz paths (batched, the per-matrix loop) are checked."""

from __future__ import annotations

import copy
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from lightning_modules.model.transformer import Transformer
from lightning_modules.optim.setup import OptimizerConfig, build_optimizer
from tests.gloo_exit import leave
from tests.helpers import attn, free_port, tiny_model

WORLD = 2
STEPS = 3
GRAD_TOL = {
    "rtol": 1e-5,
    "atol": 1e-7,
}  # DDP's averaged gradients differ from one process's by summation order


def run(rank: int) -> None:
    g = torch.Generator().manual_seed(1)
    for kind in (
        "lrkv",
        "gqa",
        "mla",
    ):  # 3-D stacks and row blocks (lrkv), fused weights (gqa), latents (mla)
        for batched in (True, False):
            torch.manual_seed(0)
            ref = Transformer(tiny_model(), attn(kind))
            model = DistributedDataParallel(copy.deepcopy(ref))
            config = OptimizerConfig(name="muon", lr=0.02, embed_lr=0.1, head_lr=0.004)
            ref_opt = build_optimizer(ref, config)
            opt = build_optimizer(model.module, config, replicated=True)
            for o in (ref_opt, opt):
                o.batched_newton_schulz = batched
            for _ in range(STEPS):
                batch = torch.randint(0, 128, (2 * WORLD, 17), generator=g)
                for net, tokens in ((ref, batch), (model, batch.chunk(WORLD)[rank])):
                    logits = net(tokens[:, :-1])
                    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
                for (name, p), q in zip(ref.named_parameters(), model.module.parameters(), strict=True):
                    torch.testing.assert_close(q.grad, p.grad, **GRAD_TOL, msg=f"{kind} {name} grad")
                    p.grad = q.grad.clone()  # the same gradients into both: the steps must then be identical
                for o in (ref_opt, opt):
                    o.step()
                    o.zero_grad()
            for (name, p), q in zip(ref.named_parameters(), model.module.parameters(), strict=True):
                assert torch.equal(q.detach(), p.detach()), f"{kind} batched={batched} {name}"
            flops = [0] * WORLD
            dist.all_gather_object(flops, opt.ns_flops)
            assert sum(flops) == ref_opt.ns_flops, (flops, ref_opt.ns_flops)  # every matrix once, all told
            assert max(flops) <= 0.6 * ref_opt.ns_flops, (kind, flops, ref_opt.ns_flops)
            muon = sum(p.numel() for grp in opt.param_groups if grp["use_muon"] for p in grp["params"])
            # bf16: the all-gather's input (one slot) and output (world slots), the updates assembled from it;
            # a slot is the busiest rank's share, within 20 % of an even one
            slot = 1.2 * muon / WORLD
            assert 0 < opt.transient_bytes <= 2 * (slot * (1 + WORLD) + muon), (opt.transient_bytes, muon)


def worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # A failing check on one rank leaves the other waiting in a collective: give up after a minute.
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    try:
        run(rank)
        dist.barrier()  # neither rank tears down its connections while the other still uses them
    finally:
        dist.destroy_process_group()
    leave()  # checked and torn down (tests/gloo_exit.py says why)


@pytest.mark.slow
def test_ddp_step_split_over_ranks_equals_single_process_step() -> None:
    mp.spawn(worker, args=(free_port(),), nprocs=WORLD, join=True)
