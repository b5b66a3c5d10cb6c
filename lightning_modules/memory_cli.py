"""`python -m lightning_modules.costs --memory ...`: the per-rank memory plan (lightning_modules/memory.py).

    python -m lightning_modules.costs --memory --size 6.3b --attention lrkv --strategy fsdp --world 8 \\
        --micro-batch 8 --activation-checkpointing
    python -m lightning_modules.costs --memory --fits     # which paper runs fit on 8 x 80 / 8 x 141 GB

The micro-batch defaults to the size's recipe (conf/recipe/<size>.yaml, data.batch_size), else 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from lightning_modules import costs, memory
from lightning_modules.attention import names
from lightning_modules.config import CONF_DIR, ConfigError

DEVICES_GB = (80, 141)  # H100 / A100 80 GB, H200 141 GB (decimal gigabytes, as sold)
GPUS = 8


def recipe_batch(size: str) -> tuple[int, int]:
    """(micro-batch, accumulation) of conf/recipe/<size>.yaml, or (1, 1) when there is none."""
    path = CONF_DIR / "recipe" / f"{size}.yaml"
    if not path.exists():
        return 1, 1
    recipe = yaml.safe_load(path.read_text())
    return int(recipe["data"]["batch_size"]), int(recipe.get("trainer", {}).get("accumulate_grad_batches", 1))


def fits_table() -> list[dict[str, Any]]:
    """For each paper size and device: the first setting, in order of preference (no sharding, sharding,
    then activation checkpointing, then smaller micro-batches with more accumulation to keep the recipe's
    global batch), whose peak fits with 10 % headroom for every attention."""
    rows = []
    for size in costs.PAPER_SIZES:
        micro, accumulation = recipe_batch(size)
        configs = [costs.load_configs([costs.fragment("model", size), costs.fragment("attention", k)])
                   for k in names()]  # fmt: skip
        candidates = []
        mb = micro
        while mb >= 1:
            for strategy, ac in (("ddp", False), ("fsdp", False), ("fsdp", True)):
                candidates.append((strategy, ac, mb))
            mb //= 2
        for device_gb in DEVICES_GB:
            device_gib = device_gb * 1e9 / 2**30
            chosen: dict[str, Any] = {"size": size, "device_gb": device_gb, "fits": False}
            for strategy, ac, mb in candidates:
                setup = memory.Setup(
                    strategy=strategy, world=GPUS, micro_batch=mb, activation_checkpointing=ac
                )
                plans = [memory.plan(m, a, setup) for m, a in configs]
                worst = max(plans, key=lambda p: p.peak)
                if memory.fits(worst, device_gib):
                    chosen.update(
                        fits=True, strategy=strategy, activation_checkpointing=ac, micro_batch=mb,
                        accumulation=accumulation * micro // mb, peak_gib=round(worst.peak / 2**30, 1),
                    )  # fmt: skip
                    break
            rows.append(chosen)
    return rows


def format_fits(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| size | GPU | strategy | micro-batch x accumulation | activation checkpointing | peak per GPU (worst attention) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        gpu = f"{GPUS} x {r['device_gb']} GB"
        if not r["fits"]:
            lines.append(f"| {r['size']} | {gpu} | does not fit at micro-batch 1 | - | - | - |")
            continue
        lines.append(
            f"| {r['size']} | {gpu} | {r['strategy']} | {r['micro_batch']} x {r['accumulation']} | "
            f"{'on' if r['activation_checkpointing'] else 'off'} | {r['peak_gib']} GiB |"
        )
    return "\n".join(lines)


def main(config: list[str], argv: list[str], as_json: bool) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_modules.costs --memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--size", default="128m", help="a conf/model fragment (ignored with --config)")
    parser.add_argument(
        "--attention", default="mha", help="a conf/attention fragment (ignored with --config)"
    )
    parser.add_argument("--strategy", choices=memory.STRATEGIES, default="single")
    parser.add_argument("--world", type=int, default=1, help="ranks in all")
    parser.add_argument("--nodes", type=int, default=1, help="nodes (hybrid sharding shards within a node)")
    parser.add_argument(
        "--micro-batch", type=int, default=None, help="sequences per rank (default: recipe's)"
    )
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--precision", choices=memory.PRECISIONS, default="bf16-mixed")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--optimizer", choices=memory.OPTIMIZERS, default="muon")
    parser.add_argument("--keep-gathered", action="store_true", help="reshard_after_forward false (FSDP)")
    parser.add_argument(
        "--fits", action="store_true", help="which paper runs fit on 8 x 80 GB and 8 x 141 GB"
    )
    args = parser.parse_args(argv)
    try:
        if args.fits:
            rows = fits_table()
            print(json.dumps(rows, indent=1) if as_json else format_fits(rows))
            return 0
        fragments = config or [
            costs.fragment("model", args.size),
            costs.fragment("attention", args.attention),
        ]
        model, attention = costs.load_configs(fragments)
        if args.seq_len:
            import dataclasses

            model = dataclasses.replace(model, seq_len=args.seq_len)
        setup = memory.Setup(
            strategy=args.strategy,
            world=args.world,
            nodes=args.nodes,
            micro_batch=args.micro_batch or recipe_batch(model.name)[0],
            precision=args.precision,
            activation_checkpointing=args.activation_checkpointing,
            optimizer=args.optimizer,
            reshard_after_forward=not args.keep_gathered,
        )
        result = memory.plan(model, attention, setup)
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        json.dumps(result.as_dict(), indent=1)
        if as_json
        else memory.format_plan(model, attention, setup, result)
    )
    return 0
