"""Train every attention under one budget, test each, print the comparison (the demo's main job).

    python -m lightning_modules.compare                                   # nano, seed 7, conf/budget/demo.yaml
    python -m lightning_modules.compare --sizes nano 20m --seeds 1 2 3    # several seeds and sizes

Each run goes through main.py's CLI (`fit` with the same configs a user would pass), then `test` on the
trained model in the same process, so fit and test land in one MLflow run. Extra arguments after `--` go
to every fit, e.g. `-- --trainer.max_steps 50`.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from lightning_modules import costs, tracking
from lightning_modules.attention import names
from lightning_modules.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]


def run_one(size: str, kind: str, seed: int, data: str, budget: str, extra: list[str]) -> dict[str, Any]:
    args = [
        "fit",
        "--config",
        str(ROOT / "conf/base.yaml"),
        "--config",
        str(ROOT / f"conf/model/{size}.yaml"),
    ]
    args += ["--config", str(ROOT / f"conf/attention/{kind}.yaml"), "--config", data, "--config", budget]
    args += ["--seed_everything", str(seed), *extra]
    cli = cli_main(args)
    (test,) = cli.trainer.test(cli.model, datamodule=cli.datamodule)
    model = cli.model
    row = costs.cost_row(model.arch, model.attention)
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="python -m lightning_modules.compare", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", nargs="+", default=["nano"])
    parser.add_argument("--attentions", nargs="+", default=list(names()), choices=names())
    parser.add_argument("--seeds", nargs="+", type=int, default=[7])
    parser.add_argument("--data", default=str(ROOT / "conf/data/shakespeare.yaml"), help="data fragment")
    parser.add_argument("--budget", default=str(ROOT / "conf/budget/demo.yaml"), help="budget fragment")
    args = parser.parse_args(argv)
    rows = []
    for size in args.sizes:
        for seed in args.seeds:
            for kind in args.attentions:
                print(f"\n=== {size} {kind} seed {seed} ===", flush=True)
                rows.append(run_one(size, kind, seed, args.data, args.budget, extra))
    print("\nEqual-compute comparison (test split of the data; CE in nats/token):")
    print(format_rows(rows))
    print(
        f"\nEvery run is in MLflow ({tracking.tracking_uri()}). Open the UI with `make mlflow-ui`, then "
        "http://127.0.0.1:5000; draw the curves with `make notebooks`."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
