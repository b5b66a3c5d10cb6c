"""Which paper runs fit on which GPUs: the memory plan (costs/memory.py) searched over strategies and batches.

`python -m lightning_modules costs --memory --fits` prints it. A size's micro-batch comes from its recipe
(conf/recipe/<size>.yaml, data.batch_size), else 1.
"""

from __future__ import annotations

from typing import Any

import yaml

from lightning_modules.core.fragments import CONF_DIR, fragment
from lightning_modules.costs import memory
from lightning_modules.costs.counts import PAPER_SIZES
from lightning_modules.model.attention import load_configs, names

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
    for size in PAPER_SIZES:
        micro, accumulation = recipe_batch(size)
        configs = [load_configs([fragment("model", size), fragment("attention", k)])
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
