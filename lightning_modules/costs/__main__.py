"""`python -m lightning_modules.costs`: parameters, FLOPs per token and KV-cache bytes (costs/counts.py), or with
--memory the per-rank memory plan of one training step (costs/memory.py, costs/fits.py).

    python -m lightning_modules.costs                                   # every paper size and nano x attention
    python -m lightning_modules.costs --config conf/model/128m.yaml --config conf/attention/lrkv.yaml
    python -m lightning_modules.costs --memory --size 6.3b --attention lrkv --strategy fsdp --world 8 \\
        --micro-batch 8 --activation-checkpointing
    python -m lightning_modules.costs --memory --fits     # which paper runs fit on 8 x 80 / 8 x 141 GB

The memory plan's micro-batch defaults to the size's recipe (conf/recipe/<size>.yaml, data.batch_size), else 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from lightning_modules.core.errors import ConfigError
from lightning_modules.core.fragments import fragment
from lightning_modules.costs import memory
from lightning_modules.costs.counts import cost_row, default_rows
from lightning_modules.costs.fits import fits_table, format_fits, recipe_batch
from lightning_modules.costs.table import format_table
from lightning_modules.model.attention import load_configs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_modules.costs",
        description="Parameters, training and decode FLOPs per token and KV-cache bytes for sizes x attentions. "
        "With no --config: every paper size and nano x every attention with the paper's per-size settings.",
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        help="YAML fragment(s) as given to main.py, composed in order",
    )
    parser.add_argument("--context", type=int, default=None, help="decode context length (default: seq_len)")
    parser.add_argument("--json", action="store_true", help="print a JSON list of rows instead of a table")
    parser.add_argument(
        "--memory", action="store_true", help="per-rank memory plan (lightning_modules/costs/memory.py)"
    )
    args, rest = parser.parse_known_args(argv)
    if args.memory:  # the plan's own options (--size, --strategy, ...) are parsed by memory_main
        return memory_main(args.config, rest, args.json)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if args.config:
            rows = [cost_row(*load_configs(args.config), args.context)]
        else:
            rows = default_rows(args.context)
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 0


def memory_main(config: list[str], argv: list[str], as_json: bool) -> int:
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
        model, attention = load_configs(
            config or [fragment("model", args.size), fragment("attention", args.attention)]
        )
        if args.seq_len:
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


if __name__ == "__main__":
    sys.exit(main())
