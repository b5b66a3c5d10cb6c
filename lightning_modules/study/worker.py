"""One study run in its own process: fit (or resume) through main.py's CLI into a claimed MLflow run, then test.

    python -m lightning_modules.study.worker --run-id ID --checkpoint-dir DIR --every N [--resume CKPT] -- ARGS

ARGS are main.py's (without the subcommand; RunSpec.cli_args). The runner (runner.py) starts this, one per
run, so `--workers N` trains N runs at once. The run was created by the runner with the identity tags; the
MLflow logger continues it (run_id), so fit, a resumed fit and test all land in that one run. Checkpoints go
to DIR (one folder per run, named by the runner), only `last.ckpt`, every N steps and at the end: a study
makes dozens of runs, and a resumed run needs only the newest state (written atomically, so a kill never
leaves it half-written: tests/checkpoint/test_checkpoint_kill.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger

from lightning_modules.checkpoint.callback import EndOfFitModelCheckpoint
from lightning_modules.study.protocol import TAG
from lightning_modules.training.cli import main as cli_main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m lightning_modules.study.worker")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--checkpoint-dir", required=True, type=Path)
    parser.add_argument("--every", type=int, required=True, help="optimizer steps between checkpoints")
    parser.add_argument("--resume", type=Path, default=None, help="checkpoint to resume from")
    args = parser.parse_args(argv[:split])
    cli_args = [*argv[split + 1 :], "--trainer.logger.init_args.run_id", args.run_id]
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


if __name__ == "__main__":
    sys.exit(main())
