"""SLURM without SLURM: two local processes, each started with the environment srun gives a task of a
2-node job with one task per node, run the command scripts/slurm/train.sbatch builds
(scripts/slurm/command.sh) on nano-sized CPU settings. Lightning must detect SLURM (SLURMEnvironment, no
process launched by Lightning itself), map SLURM_PROCID / SLURM_NODEID / SLURM_LOCALID to its ranks, derive
the rendezvous port from SLURM_JOB_ID, and shard the decoder on the hybrid (replicate = nodes, shard =
tasks per node) mesh; both tasks train to the end."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]
NODES = 2


def job_id_with_free_port() -> str:
    """A job id whose last four digits give a free port: Lightning's SLURMEnvironment listens on
    15000 + those digits (it reads no MASTER_PORT from srun)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if 15000 <= port < 25000:
            return f"73{port - 15000:04d}"
    for offset in range(10000):  # the kernel gave none in range: probe from 15000 up
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 15000 + offset))
            except OSError:
                continue
            return f"73{offset:04d}"
    raise RuntimeError("no free port in 15000-24999")


def test_two_slurm_tasks_train_on_the_hybrid_mesh(
    tiny_shards: Path, tmp_path: Path, store_at: Callable[[Path], str]
) -> None:
    record = tmp_path / "ranks"
    extra = [
        "--model.arch.seq_len", "32",
        "--data.data_dir", str(tiny_shards),
        "--data.num_workers", "0",
        "--data.global_batch_size", "8",
        "--trainer.precision", "32-true",
        "--trainer.max_steps", "2",
        "--trainer.limit_val_batches", "2",
        "--trainer.val_check_interval", "2",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.callbacks+=tests.training_callbacks.RecordEnvironment",
        "--trainer.callbacks.path", str(record),
    ]  # fmt: skip
    choice = {"SIZE": "nano", "ATTENTION": "mha", "STRATEGY": "hybrid-fsdp", "DATA": "shakespeare"}
    choice |= {"PYTHON": sys.executable, "ACCELERATOR": "cpu"}
    allocation = {"SLURM_JOB_NUM_NODES": str(NODES), "SLURM_NTASKS_PER_NODE": "1"}
    built = subprocess.run(
        ["bash", str(ROOT / "scripts/slurm/command.sh"), *extra],
        env={**os.environ, **choice, **allocation},
        capture_output=True,
        check=True,
    )
    command = built.stdout.decode().split("\0")[:-1]
    assert command[:3] == [sys.executable, str(ROOT / "main.py"), "fit"]
    uri = store_at(tmp_path / "mlruns" / "mlflow.db")  # tables made before, not raced by two tasks
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "SLURM_", "TORCHELASTIC"))}
    job = {
        **allocation,
        "SLURM_JOB_ID": job_id_with_free_port(),
        "SLURM_JOB_NAME": "lrkv-lab",
        "SLURM_NNODES": str(NODES),
        "SLURM_NTASKS": str(NODES),
        "SLURM_TASKS_PER_NODE": f"1(x{NODES})",
        "SLURM_NODELIST": "127.0.0.1,127.0.0.1",  # both "nodes" are this machine; the first is the root
        "SLURM_CPUS_PER_TASK": "1",
        "SLURM_SUBMIT_DIR": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
        "MLFLOW_TRACKING_URI": uri,
        "PYTHONUNBUFFERED": "1",
    }
    tasks = [
        {**base, **job, "SLURM_PROCID": str(r), "SLURM_NODEID": str(r), "SLURM_LOCALID": "0"}
        for r in range(NODES)
    ]
    procs = [
        subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for env in tasks
    ]
    outputs = [p.communicate(timeout=540)[0] for p in procs]
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output[-6000:]
    seen = [json.loads((record / f"rank{r}.json").read_text()) for r in range(NODES)]
    for r, rank in enumerate(seen):
        assert rank["environment"] == "SLURMEnvironment"
        assert (rank["global_rank"], rank["node_rank"], rank["local_rank"]) == (r, r, 0)
        assert rank["world_size"] == NODES and rank["global_step"] == 2
        assert rank["mesh"].startswith("DeviceMesh((replicate=2, shard=1)")
        assert rank["placements"] == ["R", "S(0)"]
