"""One multi-process job for tests/distributed/test_fsdp_training.py: for each attention, through main(), a straight fit,
the same fit interrupted at half way, its resume from the sharded checkpoint, and a test from the final one.

Run as `python -m tests.fsdp_driver --shards DIR --out DIR --kinds mha ... -- <more main() args>` with
--trainer.devices 2 (Lightning's launcher starts the second process by re-running this command), or under
torchrun. Every rank runs the same fits; each writes what it can see to OUT/<kind>/rank<r>.json. Losses and
tags are read from MLflow by the test; the straight and interrupted fits also write their global batches
(loss and sample digests, tests.training_callbacks.RecordGlobalBatches) to OUT/<kind>/<fit>.json. Three fits
per process keep the start-up cost (imports, launcher, process group) to once per job.

With `--resume CKPT --name NAME` the job runs only the fit resumed from CKPT (any world size: elastic
resume), recording to OUT/<kind>/NAME.json, its checkpoints in OUT/<kind>/NAME/.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from main import main
from tests.gloo_exit import leave

ROOT = Path(__file__).resolve().parents[1]
STEPS = 6
STOP = 3


def fit_args(kind: str, shards: str, extra: list[str], dirpath: Path) -> list[str]:
    return [
        "fit",
        "--config", str(ROOT / "conf/base.yaml"),
        "--config", str(ROOT / "conf/model/nano.yaml"),
        "--config", str(ROOT / f"conf/attention/{kind}.yaml"),
        "--model.arch.seq_len", "32",
        "--data.data_dir", shards,
        "--data.batch_size", "4",
        "--data.num_workers", "0",
        "--trainer.accelerator", "cpu",
        "--trainer.precision", "32-true",  # the equalities these fits check hold to 1e-5 in fp32, not in bf16
        "--trainer.max_steps", str(STEPS),
        "--trainer.limit_val_batches", "2",
        "--trainer.limit_test_batches", "2",
        "--trainer.val_check_interval", str(STOP),
        "--trainer.log_every_n_steps", "1",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--model.optimizer.name", "muon",
        *extra,
        "--trainer.callbacks+=ModelCheckpoint",
        "--trainer.callbacks.every_n_train_steps", str(STOP),
        "--trainer.callbacks.save_top_k", "-1",
        "--trainer.callbacks.dirpath", str(dirpath),
    ]  # fmt: skip


def record(path: Path) -> list[str]:
    return ["--trainer.callbacks+=tests.training_callbacks.RecordGlobalBatches", "--trainer.callbacks.path",
            str(path)]  # fmt: skip


def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """Largest |a - b| over all parameters and all ranks (each rank compares the shards it holds)."""
    worst = torch.zeros(())
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        p_local = p.to_local() if isinstance(p, DTensor) else p
        q_local = q.to_local() if isinstance(q, DTensor) else q
        if p_local.numel():
            worst = torch.maximum(worst, (p_local - q_local).abs().max().detach().cpu())
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


def run(kind: str, shards: str, out: Path, extra: list[str]) -> None:
    straight = main(fit_args(kind, shards, extra, out / "straight") + record(out / "straight.json"))
    stop = ["--trainer.callbacks+=tests.training_callbacks.StopAtStep", "--trainer.callbacks.step", str(STOP)]
    interrupted = main(
        fit_args(kind, shards, extra, out / "interrupted") + stop + record(out / "interrupted.json")
    )
    half = out / "interrupted" / f"epoch=0-step={STOP}.ckpt"
    resumed = main(fit_args(kind, shards, extra, out / "resumed") + ["--ckpt_path", str(half)])
    final = out / "resumed" / f"epoch=0-step={STEPS}.ckpt"
    test_args = fit_args(kind, shards, extra, out / "tested")
    tested = main(["test", *test_args[1:], "--ckpt_path", str(final)])
    params = dict(straight.model.model.named_parameters())
    rank = dist.get_rank()
    result = {
        "world_size": dist.get_world_size(),
        "steps": [straight.trainer.global_step, interrupted.trainer.global_step, resumed.trainer.global_step],
        "run_ids": {
            "straight": straight.trainer.logger.run_id if rank == 0 else None,
            "interrupted": interrupted.trainer.logger.run_id if rank == 0 else None,
            "resumed": resumed.trainer.logger.run_id if rank == 0 else None,
            "tested": tested.trainer.logger.run_id if rank == 0 else None,
        },
        "tokens_seen": [straight.model.tokens_seen, resumed.model.tokens_seen],
        "flops_seen": [straight.model.flops_seen, resumed.model.flops_seen],
        "max_param_difference": max_difference(resumed.model.model, straight.model.model),
        "placements": {
            name: [str(pl) for pl in p.placements] for name, p in params.items() if isinstance(p, DTensor)
        },
        "not_dtensor": [name for name, p in params.items() if not isinstance(p, DTensor)],
        "local_rows": {name: p.to_local().shape[0] for name, p in params.items() if isinstance(p, DTensor)},
        "global_rows": {name: p.shape[0] for name, p in params.items()},
        "mesh": str(straight.model.model.blocks[0].attn_norm.weight.device_mesh),
        "compiled_blocks": sum(
            getattr(b, "_compiled_call_impl", None) is not None for b in straight.model.model.blocks
        ),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result, indent=1))


def cli() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--kinds", nargs="+", required=True)
    parser.add_argument("--resume", help="only resume from this checkpoint")
    parser.add_argument(
        "--name", default="resumed-elsewhere", help="with --resume: the fit's folder and record"
    )
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more main() arguments")
    args = parser.parse_args()
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    for kind in args.kinds:
        out = Path(args.out) / kind
        out.mkdir(parents=True, exist_ok=True)
        if args.resume:
            fit = fit_args(kind, args.shards, extra, out / args.name) + record(out / f"{args.name}.json")
            main([*fit, "--ckpt_path", args.resume])
        else:
            run(kind, args.shards, out, extra)
    dist.barrier()  # neither rank tears down its connections while the other still uses them
    dist.destroy_process_group()


if __name__ == "__main__":
    cli()
    leave()
