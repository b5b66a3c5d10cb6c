"""`python -m lightning_modules costs`: parameters, FLOPs per token and KV-cache bytes (costs/counts.py), or with
--memory the per-rank memory plan of one training step (costs/memory.py, costs/fits.py).

    python -m lightning_modules costs                                   # every paper size and nano x attention
    python -m lightning_modules costs --config conf/model/128m.yaml --config conf/attention/lrkv.yaml
    python -m lightning_modules costs --memory --size 6.3b --attention lrkv --strategy fsdp --world 8 \\
        --micro-batch 8 --activation-checkpointing
    python -m lightning_modules costs --memory --fits     # which paper runs fit on 8 x 80 / 8 x 141 GB
    python -m lightning_modules costs --memory --size nano --device cpu   # the step on this CPU

The memory plan's micro-batch defaults to the size's recipe (conf/recipe/<size>.yaml, data.batch_size), else 1.
--device (default cuda) is what the step runs on: the paper's runs train on GPUs, where SDPA runs a fused
kernel (MLA too) and autocast runs norms and powers in fp32; cpu is the step benchmarks/memory_plan.py
measures, whose MLA attention takes SDPA's math path (docs/costs.md, "Memory plan").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import yaml

from lightning_modules.core.errors import ConfigError, run_entry
from lightning_modules.core.fragments import fragment
from lightning_modules.costs import memory
from lightning_modules.costs.counts import cost_row, default_rows
from lightning_modules.costs.fits import fits_table, format_fits, recipe_batch
from lightning_modules.costs.table import format_table
from lightning_modules.model.attention import AttentionConfig, load_configs
from lightning_modules.model.config import ModelConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_modules costs",
        description="Parameters, training and decode FLOPs per token and KV-cache bytes for sizes x attentions. "
        "With no --config: every paper size and nano x every attention with the paper's per-size settings.",
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        help="YAML fragment(s) as given to main.py, composed in order",
    )
    parser.add_argument(
        "--context", type=positive_int, default=None, help="decode context length (default: seq_len)"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list of rows instead of a table")
    parser.add_argument(
        "--memory", action="store_true", help="per-rank memory plan (lightning_modules/costs/memory.py)"
    )
    args, rest = parser.parse_known_args(argv)
    if args.memory:  # the plan's own options (--size, --strategy, ...) are parsed by memory_main
        return memory_main(args.config, rest, args.json)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return run_entry(lambda: _cost_rows(args), parser.prog)


def _cost_rows(args: argparse.Namespace) -> int:
    if args.config:
        rows = [cost_row(*_load_configs(args.config), args.context)]
    else:
        rows = default_rows(args.context)
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 0


def positive_int(text: str) -> int:
    """An argparse type: a count where 0 would otherwise quietly mean "the default"."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1 (leave the option out for its default)")
    return value


def _load_configs(paths: list[str]) -> tuple[ModelConfig, AttentionConfig]:
    """load_configs with a missing file or YAML that is not plain data (a !!python tag, a syntax error) as
    one ConfigError naming the file, like main.py's --config."""
    try:
        return load_configs(paths)
    except OSError as exc:
        raise ConfigError(f"{exc.filename or paths}: cannot read ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_problem(paths, exc)) from exc


def _yaml_problem(paths: list[str], exc: yaml.YAMLError) -> str:
    """Which --config file holds the YAML error, and where (the loader itself saw only a string)."""
    for path in paths:
        try:
            yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except yaml.YAMLError as found:
            exc = found
            break
    else:
        path = ", ".join(paths)
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return (
        f"{path}: not plain YAML{where} ({problem}); --config takes data only: no !!python tags, fix the file"
    )


def memory_main(config: list[str], argv: list[str], as_json: bool) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_modules costs --memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--size", default="128m", help="a conf/model fragment (ignored with --config)")
    parser.add_argument(
        "--attention", default="mha", help="a conf/attention fragment (ignored with --config)"
    )
    parser.add_argument("--strategy", choices=memory.STRATEGIES, default="single")
    parser.add_argument("--world", type=positive_int, default=1, help="ranks in all")
    parser.add_argument(
        "--nodes", type=positive_int, default=1, help="nodes (hybrid sharding shards within a node)"
    )
    parser.add_argument(
        "--micro-batch", type=positive_int, default=None, help="sequences per rank (default: recipe's)"
    )
    parser.add_argument("--seq-len", type=positive_int, default=None)
    parser.add_argument("--precision", choices=memory.PRECISIONS, default="bf16-mixed")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--optimizer", choices=memory.OPTIMIZERS, default="muon")
    parser.add_argument("--keep-gathered", action="store_true", help="reshard_after_forward false (FSDP)")
    parser.add_argument(
        "--device",
        choices=memory.DEVICES,
        default="cuda",
        help="what the step runs on: its SDPA kernels and autocast (default cuda; --fits is always cuda)",
    )
    parser.add_argument(
        "--fits", action="store_true", help="which paper runs fit on 8 x 80 GB and 8 x 141 GB"
    )
    args = parser.parse_args(argv)
    return run_entry(lambda: _memory_plan(config, args, as_json), parser.prog)


def _memory_plan(config: list[str], args: argparse.Namespace, as_json: bool) -> int:
    if args.fits:
        rows = fits_table()
        print(json.dumps(rows, indent=1) if as_json else format_fits(rows))
        return 0
    model, attention = _load_configs(
        config or [str(fragment("model", args.size)), str(fragment("attention", args.attention))]
    )
    if args.seq_len is not None:
        model = dataclasses.replace(model, seq_len=args.seq_len)
    setup = memory.Setup(
        strategy=args.strategy,
        world=args.world,
        nodes=args.nodes,
        micro_batch=args.micro_batch if args.micro_batch is not None else recipe_batch(model.name)[0],
        precision=args.precision,
        activation_checkpointing=args.activation_checkpointing,
        optimizer=args.optimizer,
        reshard_after_forward=not args.keep_gathered,
        device=args.device,
    )
    result = memory.plan(model, attention, setup)
    print(
        json.dumps(result.as_dict(), indent=1)
        if as_json
        else memory.format_plan(model, attention, setup, result)
    )
    return 0
