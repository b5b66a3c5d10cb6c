"""One study run in its own process: fit (or resume) through main.py's CLI into a claimed MLflow run, then test.

    python -m lightning_modules study-worker --run-id ID --checkpoint-dir DIR --every N [--resume CKPT] -- ARGS

ARGS are main.py's (without the subcommand; RunSpec.cli_args). The runner (runner.py) starts this, one per
run, so `--workers N` trains N runs at once. The run was created by the runner with the identity tags; the
MLflow logger continues it (run_id), so fit, a resumed fit and test all land in that one run. Checkpoints go
to DIR (one folder per run, named by the runner), only `last.ckpt`, every N steps and at the end: a study
makes dozens of runs, and a resumed run needs only the newest state (written atomically, so a kill never
leaves it half-written: tests/checkpoint/test_checkpoint_kill.py).

Before anything else it ties itself to its runner (`--runner-pid`: it dies with the runner, SIGKILL
included) and takes the run's lock (lock.py): a second worker on the same run ends at once, trains nothing
and exits with LOCKED_EXIT, so no step is logged twice and no two processes write one last.ckpt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger

from lightning_modules.checkpoint.callback import EndOfFitModelCheckpoint
from lightning_modules.core.errors import report, run_entry
from lightning_modules.study import lock
from lightning_modules.study.protocol import TAG
from lightning_modules.training.cli import main as cli_main

PROG = "python -m lightning_modules study-worker"


@dataclass(frozen=True)
class WorkerOptions:
    """What the runner tells a worker (lightning_modules/commands/study_worker.py parses it)."""

    run_id: str
    checkpoint_dir: Path
    every: int  # optimizer steps between checkpoints
    resume: Path | None = None  # the checkpoint to resume from
    runner_pid: int | None = None  # die with this process (the runner)


def run(args: WorkerOptions, main_args: list[str]) -> int:
    """Train one claimed run to its end, then test it; main_args are main.py's (without the subcommand)."""
    return run_entry(lambda: _run(args, main_args), PROG)


def _run(args: WorkerOptions, main_args: list[str]) -> int:
    if args.runner_pid is not None:
        lock.die_with_runner(args.runner_pid)
    try:
        held = lock.hold(args.checkpoint_dir, args.run_id)
    except lock.RunLockedError as e:
        # One line, and its own exit code: the runner reads it as "trained by another worker", not a failure.
        report(e, PROG)
        return lock.LOCKED_EXIT
    with held:  # the lock lasts as long as the training
        return _train(args, main_args)


def _train(args: WorkerOptions, main_args: list[str]) -> int:
    cli_args = [*main_args, "--trainer.logger.init_args.run_id", args.run_id]
    cli_args += ["--trainer.enable_progress_bar", "false"]  # the output goes to a log file
    cli = cli_main(cli_args, run=False)
    cli._check_tracking()
    trainer = cli.trainer
    kept = [c for c in trainer.callbacks if not isinstance(c, ModelCheckpoint)]
    checkpoint = EndOfFitModelCheckpoint(
        dirpath=str(args.checkpoint_dir), every_n_train_steps=args.every, save_top_k=0, save_last=True,
        enable_version_counter=False,
    )  # fmt: skip
    trainer.callbacks[:] = [*kept, checkpoint]
    logger = trainer.logger
    if isinstance(logger, MLFlowLogger):  # the device for results/ (the runner records the CPU)
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        logger.experiment.set_tag(args.run_id, TAG + "device", f"{device}, precision {trainer.precision}")
        # MLflow applies a logger's tags only to a run it creates; the runner created this one, so the CLI's
        # precision tags (precision, its source, the hardware's bf16 capability) are set here.
        for key, value in cli.precision_tags.items():
            logger.experiment.set_tag(args.run_id, key, str(value))
    if args.resume is not None:
        step = torch.load(args.resume, map_location="cpu", mmap=True, weights_only=True)["global_step"]
        print(f"resuming {args.run_id} from {args.resume} (step {step})", flush=True)
        if isinstance(logger, MLFlowLogger):
            logger.experiment.set_tag(args.run_id, TAG + "resumed_from_step", str(step))
    trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=str(args.resume) if args.resume else None)
    trainer.test(cli.model, datamodule=cli.datamodule)
    return 0
