"""A sharded checkpoint folder is read safely by every command (lightning_modules/checkpoint/reader.py): a crafted
index (.metadata) or a crafted non-tensor value is refused in one line without running its payload, an
incomplete folder is refused before training starts and before the MLflow run it continues is reopened, and
every `python -m lightning_modules consolidate` failure is one line."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from mlflow.tracking import MlflowClient

from lightning_modules.checkpoint.consolidation import ConsolidateError, consolidate, write_consolidated
from lightning_modules.checkpoint.reader import REQUIRED, read_checkpoint
from lightning_modules.core.errors import UserError
from lightning_modules.core.lightning_api import METADATA_FILENAME, load_sharded_values
from tests.checkpoint.crafted import copy, crafted_index, crafted_value, without_shards
from tests.conftest import TINY_SEQ_LEN
from tests.one_line import Case, assert_each_ends_in_one_line

ROOT = Path(__file__).resolve().parents[2]
WEIGHT = torch.arange(12.0).view(3, 4)


def small_folder(folder: Path) -> Path:
    """A sharded checkpoint as ModelParallelStrategy lays it out (model under "state_dict", the optimiser
    with plain-valued param groups), written by torch.distributed.checkpoint in this process."""
    state = {
        "state_dict": {"model.w": WEIGHT.clone()},
        "optimizer_0": {
            "state": {"model.w": {"step": torch.tensor(3.0), "exp_avg": torch.ones(3, 4)}},
            "param_groups": [{"name": "adamw", "lr": 0.1, "betas": (0.9, 0.95), "params": ["model.w"]}],
        },
    }
    dcp.save(state, checkpoint_id=folder)
    meta = {key: 1 for key in REQUIRED} | {"hyper_parameters": {"arch": {}}, "mlflow_run_id": "abc"}
    torch.save(meta, folder / METADATA_FILENAME)
    return folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return small_folder(tmp_path / "step.ckpt")


def test_a_real_folder_is_read_whole(folder: Path) -> None:
    meta = read_checkpoint(folder)
    assert meta["mlflow_run_id"] == "abc" and "state_dict" not in meta  # the CLI's read: meta.pt only
    full = read_checkpoint(folder, weights=True)
    torch.testing.assert_close(full["state_dict"]["model.w"], WEIGHT)
    assert not [key for key in full if key.startswith("optimizer_")]
    values = load_sharded_values(folder)  # the non-tensor values, read with weights_only=True
    group = values["optimizer_0"]["param_groups"][0]
    assert group == {"name": "adamw", "lr": 0.1, "betas": (0.9, 0.95), "params": ["model.w"]}


def test_a_crafted_index_is_refused_without_running_it(folder: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = crafted_index(folder, tmp_path / "evil.ckpt", marker)
    for weights in (False, True):
        with pytest.raises(
            UserError, match=r"evil\.ckpt: its \.metadata holds objects other than .*not loaded"
        ):
            read_checkpoint(evil, weights=weights)
    with pytest.raises(ConsolidateError, match="not loaded"):
        consolidate(evil)
    assert not marker.exists()


def test_a_crafted_value_in_a_shard_is_refused_without_running_it(folder: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = crafted_value(folder, tmp_path / "evil.ckpt", marker)
    with pytest.raises(UserError, match=r"evil\.ckpt: a shard holds objects other than tensors .*not loaded"):
        read_checkpoint(evil)
    with pytest.raises(pickle.UnpicklingError):
        load_sharded_values(evil)
    assert not marker.exists()


def test_an_index_naming_a_file_outside_the_folder_is_refused(folder: Path, tmp_path: Path) -> None:
    with open(folder / ".metadata", "rb") as file:
        index = pickle.load(file)  # the test's own index: trusted
    for info in index.storage_data.values():
        info.relative_path = "../outside.distcp"
    (folder / ".metadata").write_bytes(pickle.dumps(index))
    with pytest.raises(UserError, match=r"not a file inside the folder.*not loaded"):
        read_checkpoint(folder)


def test_an_incomplete_folder_is_named_in_one_line(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(
        UserError, match=r"1 of the 1 shard files its \.metadata names are missing \(__0_0\.distcp\)"
    ):
        read_checkpoint(without_shards(folder, tmp_path / "a.ckpt"))
    short = copy(folder, tmp_path / "b.ckpt")
    shard = short / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(UserError, match=r"shard file __0_0\.distcp is shorter .*\(truncated\)"):
        read_checkpoint(short)
    no_meta = copy(folder, tmp_path / "c.ckpt")
    (no_meta / METADATA_FILENAME).unlink()
    with pytest.raises(UserError, match=r"no meta\.pt in the folder"):
        read_checkpoint(no_meta)
    empty = copy(folder, tmp_path / "d.ckpt")
    (empty / ".metadata").write_bytes(b"")
    with pytest.raises(UserError, match=r"its \.metadata cannot be read \(EOFError"):
        read_checkpoint(empty)
    with pytest.raises(UserError, match=r"a folder without \.metadata"):
        read_checkpoint(tmp_path)


def test_consolidate_writes_whole_files_and_keeps_the_old_one_on_failure(
    folder: Path, tmp_path: Path
) -> None:
    out = write_consolidated(folder)
    assert out == tmp_path / "step.consolidated.ckpt"
    torch.testing.assert_close(torch.load(out, weights_only=True)["state_dict"]["model.w"], WEIGHT)
    before = out.read_bytes()
    broken = without_shards(folder, tmp_path / "broken.ckpt")
    with pytest.raises(ConsolidateError, match="missing"):
        write_consolidated(broken, out)
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.glob(".*tmp")) == []
    with pytest.raises(ConsolidateError, match="a folder; give a file name"):
        write_consolidated(folder, tmp_path)


# ---- through the real entry points -------------------------------------------------------------------------

FSDP = [
    "--config", str(ROOT / "conf/base.yaml"), "--config", str(ROOT / "conf/model/nano.yaml"),
    "--config", str(ROOT / "conf/attention/lrkv.yaml"), "--config", str(ROOT / "conf/strategy/fsdp.yaml"),
    "--trainer.devices", "1", "--trainer.accelerator", "cpu", "--model.arch.seq_len", str(TINY_SEQ_LEN),
    "--trainer.precision", "32-true", "--data.batch_size", "4", "--data.num_workers", "0",
    "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip


def _fit_sharded(shards: Path, cwd: Path) -> Path:
    """A real sharded checkpoint: two steps of nano under conf/strategy/fsdp.yaml on one CPU process."""
    ckpt = cwd / "ck"
    argv = [sys.executable, str(ROOT / "main.py"), "fit", *FSDP, "--data.data_dir", str(shards),
            "--trainer.max_steps", "2", "--trainer.callbacks+=ModelCheckpoint",
            "--trainer.callbacks.dirpath", str(ckpt), "--trainer.callbacks.save_last", "true"]  # fmt: skip
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(argv, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return ckpt / "last.ckpt"


@pytest.mark.slow
def test_every_command_refuses_crafted_and_incomplete_folders_in_one_line(
    tiny_shards: Path, mlflow_uri: str, tmp_path: Path
) -> None:
    real = _fit_sharded(tiny_shards, tmp_path)
    client = MlflowClient(mlflow_uri)
    run_id = torch.load(real / METADATA_FILENAME, weights_only=True)["mlflow_run_id"]
    assert client.get_run(run_id).info.status == "FINISHED"
    marker = tmp_path / "payload-ran"
    index = crafted_index(real, tmp_path / "evil-index.ckpt", marker)
    value = crafted_value(real, tmp_path / "evil-value.ckpt", marker)
    missing = without_shards(real, tmp_path / "missing.ckpt")
    plain = tmp_path / "plain.ckpt"
    torch.save({"state_dict": {}}, plain)
    main = [str(ROOT / "main.py")]
    data = ["--data.data_dir", str(tiny_shards), "--trainer.max_steps", "4"]
    generate = ["-m", "lightning_modules", "generate", "--prompt", "x", "--ckpt"]
    consolidate_ = ["-m", "lightning_modules", "consolidate"]
    refused = ["evil-index.ckpt: its .metadata holds objects other than", "not loaded"]
    cases: list[Case] = [
        ("fit crafted index", [*main, "fit", *FSDP, *data, "--ckpt_path", str(index)], {}, refused),
        ("validate crafted index", [*main, "validate", *FSDP, *data, "--ckpt_path", str(index)], {}, refused),
        ("test crafted index", [*main, "test", *FSDP, *data, "--ckpt_path", str(index)], {}, refused),
        ("generate crafted index", [*generate, str(index)], {}, refused),
        ("consolidate crafted index", [*consolidate_, str(index)], {}, refused),
        ("fit crafted value", [*main, "fit", *FSDP, *data, "--ckpt_path", str(value)], {},
         ["evil-value.ckpt: a shard holds objects other than tensors", "not loaded"]),
        ("consolidate crafted value", [*consolidate_, str(value)], {}, ["a shard holds objects", "not loaded"]),
        ("fit missing shard", [*main, "fit", *FSDP, *data, "--ckpt_path", str(missing)], {},
         ["missing.ckpt: 1 of the 1 shard files", "(__0_0.distcp)", "earlier checkpoint"]),
        ("consolidate missing shard", [*consolidate_, str(missing)], {}, ["missing.ckpt: 1 of the 1 shard files"]),
        ("consolidate a file", [*consolidate_, str(plain)], {}, ["plain.ckpt: a file, not a sharded checkpoint"]),
        ("consolidate no path", [*consolidate_, str(tmp_path / "nope")], {}, ["nope: no such folder"]),
        ("consolidate into a folder", [*consolidate_, str(real), str(tmp_path)], {}, ["a folder; give a file name"]),
    ]  # fmt: skip
    assert_each_ends_in_one_line(cases, tmp_path)
    assert not marker.exists()
    assert client.get_run(run_id).info.status == "FINISHED"  # no refused resume reopened the run
    assert sorted(p.name for p in real.iterdir()) == [".metadata", "__0_0.distcp", METADATA_FILENAME]
