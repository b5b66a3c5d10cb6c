"""One 2-rank job for tests/distributed/test_meta_init.py (run under torchrun): meta-device init of a large model under
FSDP2 (setup only, peak RSS per rank), then, at a medium size, the initialised shards against a
whole-model init and against a rerun. Each rank writes OUT/rank<r>.json."""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from lightning_modules.costs import counts as costs
from lightning_modules.distributed import meta_init
from lightning_modules.distributed.parallel import ParallelConfig, parallelize
from lightning_modules.model.attention import AttentionConfig
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.transformer import Transformer
from tests.gloo_exit import leave

SEED = 7


def sharded(model: ModelConfig, attention: AttentionConfig, seed: int) -> Transformer:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    net = meta_init.build_on_meta(model, attention)
    parallelize(net, ParallelConfig(), mesh, None)
    meta_init.materialize(net, "cpu", seed)
    return net


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=7)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result: dict = {"world": dist.get_world_size()}

    # 1. A 2.5b-wide model with fewer layers, sharded from the meta device: setup only.
    big, attention = costs.load_configs([costs.fragment("model", "2.5b"), costs.fragment("attention", "mha")])
    big = dataclasses.replace(big, n_layer=args.layers)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    net = sharded(big, attention, SEED)
    result["params"] = costs.param_counts(big, attention).total
    result["local_bytes"] = sum(p.to_local().numel() * 4 for p in net.parameters())
    result["rss_before_build"] = before
    result["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["finite"] = all(bool(torch.isfinite(p.to_local()).all()) for p in net.parameters())
    del net

    # 2. Medium size: per-matrix std against a whole-model init; same seed, same weights; shards differ.
    # (128m's matrices have 35k+ elements: two inits' std differ by ~0.5 % by chance, far inside 2 %)
    medium, attention = costs.load_configs(
        [costs.fragment("model", "128m"), costs.fragment("attention", "lrkv")]
    )
    medium = dataclasses.replace(medium, n_layer=2)
    torch.manual_seed(SEED)
    whole = Transformer(medium, attention)
    a, b, c = (sharded(medium, attention, s) for s in (SEED, SEED, SEED + 1))
    stds = {}
    for (name, p), q, r, w in zip(
        a.named_parameters(), b.parameters(), c.parameters(), whole.parameters(), strict=True
    ):
        full = p.full_tensor()
        stds[name] = [float(full.float().std()), float(w.std())] if p.numel() > 1 else None
        result.setdefault("same_seed_equal", True)
        result["same_seed_equal"] &= bool(torch.equal(p.to_local(), q.to_local()))
        if name.endswith("fc.weight"):
            result["other_seed_differs"] = not torch.equal(p.to_local(), r.to_local())
            halves = full.chunk(2)
            result["shards_differ"] = not torch.equal(halves[0], halves[1])
    result["stds"] = stds
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    leave()
