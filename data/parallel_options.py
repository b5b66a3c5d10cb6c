"""The --tasks / --workers / --executor / --slurm-* options of `python -m lightning_modules prepare` (no heavy imports:
data/distributed_prepare.py, which runs them on datatrove, is imported only when --tasks is given)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

EXECUTORS = ("local", "slurm")


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    time: str = "04:00:00"
    cpus_per_task: int = 2
    mem_per_cpu_gb: int = 2
    qos: str = ""  # empty: no --qos line (many clusters have no "normal" qos, datatrove's default)
    venv: str = sys.prefix  # activated in every job


@dataclass(frozen=True)
class DistributedOptions:
    tasks: int = 1
    workers: int | None = (
        None  # local: processes at once (default min(tasks, CPUs)); slurm: array tasks at once
    )
    executor: str = "local"
    slurm: SlurmOptions = field(default_factory=SlurmOptions)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("parallel preparation on datatrove (data/distributed_prepare.py)")
    g.add_argument("--tasks", type=int, help="split the input files over N datatrove tasks")
    g.add_argument(
        "--workers", type=int, help="tasks at once (local default: min(tasks, CPUs); slurm default: all)"
    )
    g.add_argument("--executor", choices=EXECUTORS, default="local", help="run the tasks here or on SLURM")
    g.add_argument("--slurm-partition", help="SLURM partition (required with --executor slurm)")
    g.add_argument("--slurm-time", default="04:00:00", help="time limit per task (default %(default)s)")
    g.add_argument("--slurm-cpus-per-task", type=int, default=2, help="CPUs per task (default %(default)s)")
    g.add_argument("--slurm-mem-per-cpu-gb", type=int, default=2, help="GB per CPU (default %(default)s)")
    g.add_argument("--slurm-qos", default="", help="SLURM qos (default: none)")
    g.add_argument(
        "--slurm-venv", default=sys.prefix, help="virtualenv the jobs activate (default: this one)"
    )


def options_from(parser: argparse.ArgumentParser, args: argparse.Namespace) -> DistributedOptions | None:
    if args.tasks is None:
        if args.executor != "local" or args.workers is not None:
            parser.error("--executor and --workers need --tasks")
        return None
    slurm = SlurmOptions(
        partition=args.slurm_partition,
        time=args.slurm_time,
        cpus_per_task=args.slurm_cpus_per_task,
        mem_per_cpu_gb=args.slurm_mem_per_cpu_gb,
        qos=args.slurm_qos,
        venv=args.slurm_venv,
    )
    return DistributedOptions(tasks=args.tasks, workers=args.workers, executor=args.executor, slurm=slurm)
