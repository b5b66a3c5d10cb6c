"""A non-finite loss on one rank stops every rank at the same step with the same error (host_sync.py): the
watch's records are gathered on the check steps, on 2 gloo processes; and a 2-process DDP fit through
main.py whose rank 1 alone sees a NaN ends on both ranks with one NonFiniteLossError. Checked once by hand
on the code before the gather: rank 1 stopped alone and rank 0 went on into the gradient all-reduce, where
gloo failed it with "Connection closed by peer" (NCCL would wait for the process group's timeout)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_modules.training.host_sync import LossWatch
from tests.conftest import TINY_SEQ_LEN
from tests.gloo_exit import leave
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
WORLD = 2
NAN = float("nan")
# Per case: each rank's losses by step, and the first bad (step, rank, batch) every rank must agree on.
CASES = {
    "rank 1 alone": ([[1.0] * 8, [1.0] * 5 + [NAN] * 3], (5, 1, 15)),
    "the earlier rank": ([[1.0] * 6 + [NAN] * 2, [1.0] * 5 + [NAN] * 3], (5, 1, 15)),
    "a tie: the lower rank": ([[1.0] * 4 + [NAN] * 4, [1.0] * 4 + [math.inf] * 4], (4, 0, 14)),
    "none": ([[1.0] * 8, [2.0] * 8], None),
}
CHECK_EVERY = 2  # the watch is read on steps 1, 3, 5, 7, as host_sync.due would at log_every_n_steps 2


def stopped_at(losses: list[float], gather: Callable[[torch.Tensor], torch.Tensor] | None) -> list:
    """Run the steps, reading the watch on the check steps; (step checked, first bad) where it stopped."""
    watch = LossWatch()
    for step, value in enumerate(losses):
        watch.observe(torch.tensor(value), step, batch_idx=10 + step)
        if (step + 1) % CHECK_EVERY == 0:
            bad = watch.first_bad(torch.device("cpu"), gather)
            if bad is not None:
                return [step, list(bad[:3])]
    return [None, None]


def gather_all(t: torch.Tensor) -> torch.Tensor:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.stack(out)


def test_one_gather_gives_the_earliest_bad_step_of_any_rank() -> None:
    for name, (losses, want) in CASES.items():
        other = LossWatch()
        for step, value in enumerate(losses[0]):
            other.observe(torch.tensor(value), step, 10 + step)
        mine = LossWatch()
        for step, value in enumerate(losses[1]):
            mine.observe(torch.tensor(value), step, 10 + step)
        # rank 1's view: rank 0's record first, as the collective orders them
        bad = mine.first_bad(gather=lambda t, o=other: torch.stack([o.record(t.device), t]))
        assert (bad[:3] if bad else None) == want, name
    assert LossWatch().first_bad(gather=lambda t: torch.stack([t, t])) is None  # nothing observed yet


def worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # A rank that stopped alone would leave the other waiting in a collective: give up after 30 s.
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=30))
    try:
        result = {name: stopped_at(losses[rank], gather_all) for name, (losses, _) in CASES.items()}
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    leave()  # checked and torn down (tests/gloo_exit.py says why)


@pytest.mark.slow
def test_two_gloo_ranks_stop_at_the_same_check_on_the_same_loss(tmp_path: Path) -> None:
    mp.spawn(worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert results[0] == results[1]
    for name, (_, want) in CASES.items():
        step, bad = results[0][name]
        if want is None:
            assert (step, bad) == (None, None), name
        else:  # the first check at or after the bad step, on both ranks
            assert (step, tuple(bad)) == (want[0] + (-want[0] - 1) % CHECK_EVERY, want), name


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_nan_on_rank_1_alone_stops_both_ddp_ranks_at_its_step(
    tiny_shards: Path, tmp_path: Path, store_at: Callable[[Path], str]
) -> None:
    out = tmp_path / "exceptions"
    out.mkdir()
    command = [
        sys.executable, str(ROOT / "main.py"), "fit",
        "--config", str(ROOT / "conf/base.yaml"),
        "--config", str(ROOT / "conf/model/nano.yaml"),
        "--config", str(ROOT / "conf/attention/mha.yaml"),
        "--model.arch.seq_len", str(TINY_SEQ_LEN),
        "--data.data_dir", str(tiny_shards),
        "--data.batch_size", "2",
        "--data.num_workers", "0",
        "--trainer.accelerator", "cpu",
        "--trainer.devices", "2",
        "--trainer.strategy", "ddp",
        "--trainer.precision", "32-true",
        "--model.optimizer.name", "muon",  # Newton-Schulz split over the DDP ranks on the way
        "--trainer.max_steps", "8",
        "--trainer.limit_val_batches", "0",
        "--trainer.log_every_n_steps", "1",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.callbacks+=tests.training_callbacks.PoisonAtStep",
        "--trainer.callbacks.step", "3",
        "--trainer.callbacks.rank", "1",
        "--trainer.callbacks+=tests.training_callbacks.RecordException",
        "--trainer.callbacks.folder", str(out),
    ]  # fmt: skip
    uri = store_at(tmp_path / "mlruns" / "mlflow.db")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1"}
    # Its own session, so that a hang can be ended with both processes (Lightning starts rank 1 as a child).
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        output = proc.communicate(timeout=240)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0]
        pytest.fail(f"the ranks did not stop together within 240 s:\n{output[-4000:]}")
    assert proc.returncode != 0, output[-4000:]
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    want = "non-finite training loss (nan) at step 3 (batch 3) on rank 1; stopped before the update."
    for rank, record in enumerate(records):
        assert record["type"] == "NonFiniteLossError", (rank, record, output[-4000:])
        assert record["message"].startswith(want), (rank, record)
        assert record["step"] == 3, (rank, record)
    assert records[0]["message"] == records[1]["message"]
