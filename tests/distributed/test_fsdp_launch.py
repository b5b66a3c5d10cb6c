"""The multi-node launch scripts compose configs that exist and parse, with the allocation wired into
trainer.num_nodes and trainer.devices: scripts/torchrun/train.sh through real torchrun (one CPU worker),
scripts/slurm/train.sbatch through bash with `srun` standing in for the scheduler's launcher. Both end in
`main.py fit ... --print_config`, which stops after parsing, so no GPU is needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def run(script: str, env: dict[str, str], tmp_path: Path) -> dict:
    env = {**os.environ, "PYTHON": sys.executable, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db", **env}
    done = subprocess.run(
        ["bash", str(ROOT / script), "--print_config"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return yaml.safe_load(done.stdout)


def assert_paper_hybrid(config: dict, nodes: int, devices: int) -> None:
    trainer, model = config["trainer"], config["model"]
    assert trainer["strategy"]["class_path"] == "lightning_modules.distributed.strategy.FSDP2Strategy"
    # devices parses as a string from the command line ("8"), which Lightning reads like 8
    assert (trainer["num_nodes"], str(trainer["devices"]), trainer["accelerator"]) == (
        nodes,
        str(devices),
        "gpu",
    )
    assert model["parallel"]["sharding"] == "hybrid" and model["optimizer"]["name"] == "muon"
    assert (model["arch"]["name"], model["attention"]["kind"]) == ("1b", "lrkv")
    assert config["data"]["data_dir"] == "artifacts/fineweb-edu" and config["data"]["batch_size"] == 8


def test_sbatch_composes_the_paper_run(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"  # the scheduler would start one such task per GPU; one is enough to parse
    srun.write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    srun.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_SUBMIT_DIR": str(ROOT)}
    env |= {"SLURM_JOB_NUM_NODES": "4", "SLURM_NTASKS_PER_NODE": "8"}
    assert_paper_hybrid(run("scripts/slurm/train.sbatch", env, tmp_path), nodes=4, devices=8)


def test_torchrun_script_composes_the_paper_run(tmp_path: Path) -> None:
    env = {"NNODES": "1", "GPUS_PER_NODE": "1", "MASTER_PORT": "0"}
    assert_paper_hybrid(run("scripts/torchrun/train.sh", env, tmp_path), nodes=1, devices=1)
