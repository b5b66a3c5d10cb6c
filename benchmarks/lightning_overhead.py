"""What the framework costs: tokens/s of a nano fit through Lightning (main.py, real shards, every callback,
MLflow logging) against the bare decoder's training loop at the same config, in the same process.

    python benchmarks/lightning_overhead.py [--attention lrkv] [--steps 60] [--precision auto|bf16|fp32] [--json]

Both use the same model, optimiser (MuonAdamW in AdamW mode with the warmup-cosine schedule), precision (bf16
autocast or fp32; auto follows lightning_modules/core/precision.py),
gradient clipping, batch (16 x 256 tokens) and thread count. The bare loop reads random tokens (no data
loading); the Lightning figure is the median of its per-step train/tokens_per_s after a warm-up, so it
includes data loading, logging and callbacks but not start-up or validation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_modules.core import precision  # noqa: E402
from lightning_modules.optim.setup import OptimizerConfig, build_optimizer, build_schedule  # noqa: E402
from lightning_modules.training.cli import main as cli_main  # noqa: E402


def bare_tokens_per_s(
    model: torch.nn.Module, batch: int, seq_len: int, vocab: int, steps: int, warmup: int, bf16: bool
) -> float:
    optimizer = build_optimizer(model, OptimizerConfig(lr=3e-3, warmup_steps=20))
    schedule = build_schedule(optimizer, OptimizerConfig(lr=3e-3, warmup_steps=20), steps + warmup)
    tokens = torch.randint(0, vocab, (batch, seq_len + 1))
    times = []
    for i in range(steps + warmup):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(tokens[:, :-1], targets=tokens[:, 1:])  # LanguageModel's loss (model/loss.py)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return batch * seq_len / statistics.median(times)


def lightning_tokens_per_s(
    attention: str, steps: int, warmup: int, data_dir: str, trainer_precision: str | None
) -> tuple[float, torch.nn.Module]:
    """Median tokens/s of a nano fit through main.py; trainer_precision None keeps the CLI's own choice."""
    chosen = [] if trainer_precision is None else ["--trainer.precision", trainer_precision]
    cwd = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # checkpoints/ and the store land in the temporary folder
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        cli = cli_main(
            [
                "fit",
                "--config", str(ROOT / "conf/base.yaml"),
                "--config", str(ROOT / "conf/model/nano.yaml"),
                "--config", str(ROOT / f"conf/attention/{attention}.yaml"),
                "--config", str(ROOT / "conf/data/shakespeare.yaml"),
                "--data.data_dir", data_dir,
                "--trainer.max_steps", str(steps + warmup),
                "--trainer.limit_val_batches", "0",
                "--trainer.log_every_n_steps", "1",
                "--trainer.enable_progress_bar", "false",
                *chosen,
            ]
        )  # fmt: skip
        from mlflow.tracking import MlflowClient

        client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
        history = client.get_metric_history(cli.trainer.logger.run_id, "train/tokens_per_s")
        rates = [m.value for m in history if m.step >= warmup]
        os.chdir(cwd)
    return statistics.median(rates), cli.model


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--attention", default="mha")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--data-dir", default=str(ROOT / "artifacts/shakespeare"))
    parser.add_argument("--json", action="store_true")
    precision.add_flag(parser)
    args = parser.parse_args()
    hardware = precision.detect("cpu")
    choice = precision.from_flag(args.precision, hardware)
    lightning, module = lightning_tokens_per_s(
        args.attention, args.steps, args.warmup, args.data_dir, choice.precision
    )
    arch = module.arch
    torch.manual_seed(0)
    from lightning_modules.model.transformer import Transformer

    bare = bare_tokens_per_s(
        Transformer(arch, module.attention),
        16,
        arch.seq_len,
        arch.vocab_size,
        args.steps,
        args.warmup,
        precision.uses_bf16(choice),
    )
    row = {
        "attention": module.attention.label(),
        "lightning_tokens_per_s": round(lightning, 1),
        "bare_tokens_per_s": round(bare, 1),
        "ratio": round(lightning / bare, 3),
        "threads": torch.get_num_threads(),
        "precision": choice.precision,
        "hardware": hardware.capability,
        "cpu": hardware.name,
    }
    print(json.dumps(row) if args.json else "\n".join(f"{k}: {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
