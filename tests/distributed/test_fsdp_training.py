"""FSDP2 through main() on CPU with gloo, two processes (docs/architecture.md, "Scale"): every attention fits, writes a
sharded checkpoint, resumes from it exactly as an uninterrupted run continues, and tests from it; hybrid
sharding runs across two torchrun "nodes" on this machine and trains the same model; a consolidated
checkpoint serves generation and a single-process test. Elastic resume: a checkpoint written by 2 ranks
resumes on 1 rank and on 4 ranks (and the two-node hybrid run on one node) with the same global batches
and losses as the uninterrupted run.

One job per launch (tests/fsdp_driver.py runs all the fits of all attentions in the same two processes),
so the start-up cost is paid once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow.tracking import MlflowClient

from lightning_modules.checkpoint.consolidation import consolidate
from lightning_modules.core.fragments import fragment
from lightning_modules.generation.checkpoint import load_model
from lightning_modules.model.attention import load_configs, resolve
from main import main
from tests.fsdp_driver import STEPS, STOP
from tests.helpers import KINDS, free_port
from tests.training.helpers import args as single_process_args

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]


def launch(commands: list[list[str]], cwd: Path, uri: str, timeout: float = 540) -> None:
    """Run the commands at once (one per node) and fail with their output if any fails."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(c, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for c in commands
    ]
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output[-6000:]


# A global batch of 8 in 4 data slices (data/datamodule.py): 4 samples per rank on 2 ranks, and the
# checkpoints resume on 1 or 4 ranks with the same global batches.
ELASTIC = ["--data.global_batch_size", "8", "--data.data_slices", "4"]


def driver(shards: Path, out: Path, kinds: tuple[str, ...], *more: str) -> list[str]:
    return ["-m", "tests.fsdp_driver", "--shards", str(shards), "--out", str(out), "--kinds", *kinds, *more,
            "--", *ELASTIC]  # fmt: skip


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, store_at: Callable[[Path], str]) -> tuple[Path, str]:
    """A working directory and an MLflow store created up front: processes that start together under
    torchrun would otherwise race to create its tables."""
    work = tmp_path_factory.mktemp("fsdp")
    return work, store_at(work / "mlruns" / "mlflow.db")


@pytest.fixture(scope="module")
def fsdp_runs(request: pytest.FixtureRequest, tiny_shards: Path, store: tuple[Path, str]) -> Path:
    """Every selected attention under conf/strategy/fsdp.yaml, 2 processes started by Lightning's own launcher:
    the kinds of the selected test_fsdp_fit_checkpoint_resume cases (`-k <kind>` runs one), and mha and lrkv,
    whose runs the other tests here read."""
    work, uri = store
    out = work / "fsdp"
    selected = {
        item.callspec.params["kind"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_fsdp_fit_checkpoint_resume"
    }
    kinds = tuple(k for k in KINDS if k in selected or k in ("mha", "lrkv"))
    strategy = ["--config", str(ROOT / "conf/strategy/fsdp.yaml"), "--trainer.devices", "2"]
    # 4 fits per kind, each well under 45 s
    launch(
        [[sys.executable, *driver(tiny_shards, out, kinds), *strategy]], work, uri, timeout=180 * len(kinds)
    )
    return out


def results(out: Path) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def losses(uri: str, run_id: str, name: str = "train/loss") -> dict[int, float]:
    return {m.step: m.value for m in MlflowClient(uri).get_metric_history(run_id, name)}


def assert_resumed_exactly(out: Path, uri: str) -> None:
    rank0, rank1 = results(out)
    assert rank0["world_size"] == 2 and rank0["steps"] == [STEPS, STOP, STEPS]
    runs = rank0["run_ids"]
    straight, interrupted, resumed = (losses(uri, runs[k]) for k in ("straight", "interrupted", "resumed"))
    assert sorted(straight) == list(range(STEPS))
    # the resume continued the MLflow run it resumes (the run id is read from the sharded checkpoint's meta.pt)
    assert runs["resumed"] == runs["interrupted"]
    assert sorted(resumed) == list(range(STEPS))
    for step in range(STEPS):
        assert {**interrupted, **resumed}[step] == pytest.approx(straight[step], abs=1e-6), step
    val = losses(uri, runs["straight"], "val/loss")
    assert losses(uri, runs["resumed"], "val/loss")[STEPS - 1] == pytest.approx(val[STEPS - 1], abs=1e-6)
    # every parameter shard of the resumed run equals the uninterrupted run's, on both ranks
    assert rank0["max_param_difference"] == rank1["max_param_difference"] == 0.0
    assert rank0["tokens_seen"][0] == rank0["tokens_seen"][1] == STEPS * 2 * 4 * 32
    assert rank0["flops_seen"][0] == pytest.approx(rank0["flops_seen"][1])
    test_loss = MlflowClient(uri).get_run(runs["tested"]).data.metrics["test/loss"]
    assert torch.isfinite(torch.tensor(test_loss))


@pytest.mark.parametrize("kind", KINDS)
def test_fsdp_fit_checkpoint_resume(kind: str, fsdp_runs: Path, store: tuple[Path, str]) -> None:
    out, uri = fsdp_runs / kind, store[1]
    assert_resumed_exactly(out, uri)
    rank0, rank1 = results(out)
    # Sharded: every parameter a DTensor split on dim 0 between the two ranks.
    assert not rank0["not_dtensor"] and set(map(tuple, rank0["placements"].values())) == {("S(0)",)}
    for name, rows in rank0["global_rows"].items():
        assert rank0["local_rows"][name] + rank1["local_rows"][name] == rows, name
    assert rank0["local_rows"]["embed.weight"] < rank0["global_rows"]["embed.weight"]
    # The checkpoint is a directory: one shard file per rank, plus Lightning's metadata.
    ckpt = out / "interrupted" / f"epoch=0-step={STOP}.ckpt"
    assert sorted(p.name for p in ckpt.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    meta = torch.load(ckpt / "meta.pt", weights_only=False)
    assert meta["compute"]["tokens_seen"] == STOP * 2 * 4 * 32
    assert meta["hyper_parameters"]["parallel"]["sharding"] == "full"
    tags = MlflowClient(uri).get_run(rank0["run_ids"]["straight"]).data.tags
    # CPU: flash-attn cannot run; SDPA's CPU flash kernel takes equal head dims, unequal ones (mla's) take math
    model, attention = load_configs([fragment("model", "nano"), fragment("attention", kind)])
    resolved = resolve(model, attention)
    d_qk, d_v = resolved.variant.score_dims(model, resolved.knobs)
    assert tags["attention_kernel"] == ("sdpa:flash" if d_qk == d_v else "sdpa:math")


def records(path: Path) -> dict[int, dict]:
    return {int(k): v for k, v in json.loads(path.read_text()).items()}


def assert_continues(out: Path, name: str) -> None:
    """The fit `name`, resumed from the interrupted run's checkpoint, trains on exactly the global batches
    of the uninterrupted run (none lost, none repeated, same order) with the same losses (1e-5)."""
    straight, interrupted = records(out / "straight.json"), records(out / "interrupted.json")
    resumed = records(out / f"{name}.json")
    assert sorted(straight) == list(range(STEPS)) and sorted(interrupted) == list(range(STOP))
    assert sorted(resumed) == list(range(STOP, STEPS))
    joined = {**interrupted, **resumed}
    seen = [s for step in range(STEPS) for s in joined[step]["samples"]]
    assert len(seen) == STEPS * 8 and len(set(seen)) == len(seen)  # a global batch of 8, no sample twice
    for step in range(STEPS):
        assert joined[step]["samples"] == straight[step]["samples"], step
        assert joined[step]["loss"] == pytest.approx(straight[step]["loss"], abs=1e-5), step


@pytest.mark.parametrize("world", [1, 4])
def test_two_rank_checkpoint_resumes_on_another_world_size(
    world: int, fsdp_runs: Path, store: tuple[Path, str], tiny_shards: Path
) -> None:
    work, uri = store
    out = fsdp_runs / "lrkv"
    half = out / "interrupted" / f"epoch=0-step={STOP}.ckpt"
    name = f"resumed-on-{world}"
    more = ("--resume", str(half), "--name", name)
    strategy = ["--config", str(ROOT / "conf/strategy/fsdp.yaml"), "--trainer.devices", str(world)]
    launch([[sys.executable, *driver(tiny_shards, fsdp_runs, ("lrkv",), *more), *strategy]], work, uri)
    assert_continues(out, name)
    # the consolidate command reads what 1 or 4 ranks wrote: the uninterrupted run's model
    final = consolidate(out / name / f"epoch=0-step={STEPS}.ckpt")["state_dict"]
    reference = consolidate(out / "straight" / f"epoch=0-step={STEPS}.ckpt")["state_dict"]
    assert final.keys() == reference.keys()
    for key, weight in reference.items():
        torch.testing.assert_close(final[key], weight, rtol=0, atol=1e-4, msg=key)


def test_consolidated_checkpoint_serves_one_device(
    fsdp_runs: Path, store: tuple[Path, str], tiny_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lightning_modules.commands.consolidate gathers a sharded checkpoint into one file that generation and a
    single-process test read; the test continues the MLflow run that wrote the checkpoint."""
    work, uri = store
    out = fsdp_runs / "lrkv"
    straight, resumed, half = (
        consolidate(out / run / f"epoch=0-step={step}.ckpt")
        for run, step in (("straight", STEPS), ("resumed", STEPS), ("interrupted", STOP))
    )
    assert not any(key.startswith("optimizer") for key in straight)
    weights = straight["state_dict"]
    assert weights["model.embed.weight"].shape == (512, 128)  # whole, not a shard
    assert all(torch.equal(weights[k], resumed["state_dict"][k]) for k in weights)  # exact resume, again
    assert not torch.equal(weights["model.head.weight"], half["state_dict"]["model.head.weight"])
    single = work / "lrkv-step6.ckpt"
    torch.save(resumed, single)
    model, _ = load_model(single)
    assert torch.isfinite(model(torch.randint(0, 512, (1, 8)))).all()
    monkeypatch.chdir(work)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tested = main(single_process_args("test", tiny_shards, "lrkv", "--ckpt_path", str(single), *ELASTIC,
                                      "--trainer.limit_test_batches", "2"))  # fmt: skip
    assert tested.trainer.logger.run_id == results(out)[0]["run_ids"]["resumed"]
    assert "test/loss" in MlflowClient(uri).get_run(tested.trainer.logger.run_id).data.metrics


def test_hybrid_fsdp_across_two_torchrun_nodes(
    tiny_shards: Path, store: tuple[Path, str], fsdp_runs: Path
) -> None:
    """Two torchrun agents, one per "node", one process each (docs/cluster.md's multi-node command on one
    machine): a (replicate 2, shard 1) mesh; fit, sharded checkpoint and exact resume, and the same losses
    as full sharding over the same two ranks (both are data parallel over the same batches)."""
    work, uri = store
    out, port = work / "hybrid", free_port()
    nodes = [
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
         *driver(tiny_shards, out, ("mha",)),
         "--config", str(ROOT / "conf/strategy/hybrid-fsdp.yaml"), "--trainer.num_nodes", "2",
         "--trainer.devices", "1"]
        for rank in range(2)
    ]  # fmt: skip
    launch(nodes, work, uri)
    assert_resumed_exactly(out / "mha", uri)
    rank0, _ = results(out / "mha")
    assert rank0["mesh"].startswith("DeviceMesh((replicate=2, shard=1)")
    assert set(map(tuple, rank0["placements"].values())) == {("R", "S(0)")}
    assert rank0["local_rows"] == rank0["global_rows"]  # one shard per node: each node holds everything
    hybrid = losses(uri, rank0["run_ids"]["straight"])
    full = losses(uri, results(fsdp_runs / "mha")[0]["run_ids"]["straight"])
    assert hybrid[0] == full[0]  # same weights, same batches
    # Afterwards the two differ by summation order (all-reduce vs reduce-scatter, clipping norms from other
    # partial sums), which bf16 weights and bf16 Newton-Schulz amplify: seen up to 4e-5 relative. The
    # gradients themselves are compared tightly in tests/optim/test_fsdp_muon.py.
    for step in range(1, STEPS):
        assert hybrid[step] == pytest.approx(full[step], rel=2e-4), step
    # Elastic: the two-node checkpoint resumes on one node (one process, a (replicate 1, shard 1) mesh).
    half = out / "mha" / "interrupted" / f"epoch=0-step={STOP}.ckpt"
    one_node = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "1",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                *driver(tiny_shards, out, ("mha",), "--resume", str(half), "--name", "one-node"),
                "--config", str(ROOT / "conf/strategy/hybrid-fsdp.yaml"), "--trainer.num_nodes", "1",
                "--trainer.devices", "1"]  # fmt: skip
    launch([one_node], work, uri)
    assert_continues(out / "mha", "one-node")


def test_fsdp_with_compile_and_checkpointing_resumes_exactly(
    tiny_shards: Path, store: tuple[Path, str]
) -> None:
    """model.compile + activation checkpointing under FSDP2 (each block compiled, then sharded): fit, sharded
    checkpoint and exact resume as eager does. Compiled against eager losses: tests/distributed/test_compile.py."""
    work, uri = store
    out = work / "compiled"
    extra = ["--config", str(ROOT / "conf/strategy/fsdp.yaml"), "--trainer.devices", "2", "--model.compile", "true",
             "--model.parallel.activation_checkpointing", "true"]  # fmt: skip
    launch(
        [[sys.executable, *driver(tiny_shards, out, ("mha",)), *extra]], work, uri, timeout=900
    )  # compiles
    assert_resumed_exactly(out / "mha", uri)
    assert results(out / "mha")[0]["compiled_blocks"] == 4  # every block of nano (conf/model/nano.yaml)
