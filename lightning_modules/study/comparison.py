"""Train attentions under one budget, test each in the same process, and the comparison as a table (the demo's
main job; the command: python -m lightning_modules compare).

Each run goes through main.py's CLI (`fit` with the same configs a user would pass), then `test` on the
trained model in the same process, so fit and test land in one MLflow run.
"""

from __future__ import annotations

import math
from typing import Any

from lightning_modules.core.fragments import CONF_DIR, fragment
from lightning_modules.costs.counts import cost_row
from lightning_modules.training.cli import main as cli_main


def run_one(size: str, kind: str, seed: int, data: str, budget: str, extra: list[str]) -> dict[str, Any]:
    args = [
        "fit",
        "--config",
        str(CONF_DIR / "base.yaml"),
        "--config",
        str(fragment("model", size)),
    ]
    args += ["--config", str(fragment("attention", kind)), "--config", data, "--config", budget]
    args += ["--seed_everything", str(seed), *extra]
    cli = cli_main(args)
    (test,) = cli.trainer.test(cli.model, datamodule=cli.datamodule)
    model = cli.model
    row = cost_row(model.arch, model.resolved)
    return {
        "size": size,
        "attention": model.attention.label(),
        "seed": seed,
        "params": row["params"],
        "kv_cache_bytes_per_token": row["kv_cache_bytes_per_token"],
        "train_flops": model.flops_seen,
        "tokens": model.tokens_seen,
        "steps": cli.trainer.global_step,
        "test_loss": float(test["test/loss"]),
        "test_bpb": float(test.get("test/bpb", math.nan)),
    }


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = f"{'size':>5} {'attention':<10} {'seed':>4} {'params':>10} {'KV B/tok':>9} {'train FLOPs':>11} {'tokens':>10} "
    head += f"{'test CE':>8} {'bits/byte':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['size']:>5} {r['attention']:<10} {r['seed']:>4} {r['params']:>10,} {r['kv_cache_bytes_per_token']:>9,} "
            f"{r['train_flops']:>11.3e} {r['tokens']:>10,} {r['test_loss']:>8.4f} {r['test_bpb']:>9.4f}"
        )
    return "\n".join(lines)
