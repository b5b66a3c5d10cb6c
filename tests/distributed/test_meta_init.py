"""Meta-device init (lightning_modules/distributed/meta_init.py) on 2 gloo ranks under FSDP2: a model of 600M+
parameters is set up with each rank's peak RSS at most 60 % of the whole model's fp32 bytes + 1 GiB (a whole
build would need 100 %, more than that bound); the shards' per-matrix std is within 2 % of a whole-model
init's; the same seed gives the same weights, another seed others, and the two shards are not copies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_modules.distributed import meta_init
from lightning_modules.model.transformer import Transformer
from tests.helpers import attn, tiny_model

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30


@pytest.mark.slow
def test_meta_init_shards_a_large_model_within_the_memory_bound(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
               "-m", "tests.meta_init_driver", "--out", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    whole_bytes = 4 * ranks[0]["params"]
    bound = 0.6 * whole_bytes + GIB
    assert ranks[0]["params"] >= 500e6 and whole_bytes > bound  # building it whole would break the bound
    for r in ranks:
        assert r["world"] == 2 and r["finite"]
        assert r["local_bytes"] <= 0.51 * whole_bytes  # half of every parameter, rows padded
        assert r["peak_rss"] <= bound, (r["peak_rss"] / GIB, bound / GIB)
        assert r["same_seed_equal"] and r["other_seed_differs"] and r["shards_differ"]
        for name, pair in r["stds"].items():
            if pair is None or pair[1] == 0:  # gains: all ones, std 0 in both
                continue
            meta_std, whole_std = pair
            assert meta_std == pytest.approx(whole_std, rel=0.02), name


def test_materialize_on_one_device_is_seeded_and_rebuilds_rope() -> None:
    model, attention = tiny_model(), attn("lrkv")
    nets = []
    for seed in (3, 3, 4):
        net = meta_init.build_on_meta(model, attention)
        assert meta_init.is_meta(net)
        meta_init.materialize(net, "cpu", seed)
        nets.append(net)
    same, other = nets[1], nets[2]
    assert all(torch.equal(p, q) for p, q in zip(nets[0].parameters(), same.parameters(), strict=True))
    assert not torch.equal(nets[0].blocks[0].mlp.fc.weight, other.blocks[0].mlp.fc.weight)
    eager = Transformer(model, attention)
    assert torch.equal(nets[0].rope.cos, eager.rope.cos) and torch.equal(nets[0].rope.sin, eager.rope.sin)
    assert nets[0].embed.weight.std().item() == pytest.approx(model.init_std, rel=0.05)


@pytest.mark.slow
def test_meta_init_through_main_on_one_device(tiny_shards: Path, mlflow_uri: str) -> None:
    """model.parallel.meta_init without sharding: the module starts on the meta device, configure_model
    materialises and initialises it, and it trains."""
    from main import main
    from tests.training.helpers import args

    extra = (
        "--model.parallel.meta_init",
        "true",
        "--trainer.max_steps",
        "2",
    )
    cli = main(args("fit", tiny_shards, "lrkv", *extra))
    assert cli.trainer.global_step == 2
    assert not meta_init.is_meta(cli.model.model) and torch.isfinite(cli.trainer.logged_metrics["train/loss"])
