"""`fit --ckpt_path auto` (lightning_modules/training/cli.py): the same command starts a run, then resumes it
from its newest readable checkpoint in the same folder under `--trainer.default_root_dir` and the same MLflow
run, saying which in one line; a truncated newest `last.ckpt` is set aside for the previous good checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import main as entry  # the repository root is on sys.path (pyproject.toml's pytest pythonpath)
from tests.training.helpers import args, losses, only_run

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]


def _fit(shards: Path, root: Path, steps: int) -> list[str]:
    return args(
        "fit", shards, "mha", "--trainer.max_steps", str(steps), "--trainer.limit_val_batches", "0",
        "--trainer.precision", "32-true", "--trainer.default_root_dir", str(root), "--ckpt_path", "auto",
    )  # fmt: skip


def _auto_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("--ckpt_path auto: ")]


def test_auto_starts_resumes_and_passes_over_a_truncated_last_checkpoint(
    tiny_shards: Path, mlflow_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    assert entry.run(_fit(tiny_shards, root, 3)) == 0
    (folder,) = (root / "checkpoints").iterdir()
    assert folder.name.startswith("nano-mha-seed7-")
    (line,) = _auto_lines(capsys.readouterr().err)
    assert (
        line
        == f"--ckpt_path auto: no readable checkpoint in {root / 'checkpoints'}/nano-mha-seed7-*: starting fresh"
    )

    assert entry.run(_fit(tiny_shards, root, 5)) == 0
    (line,) = _auto_lines(capsys.readouterr().err)
    assert line == f"--ckpt_path auto: resuming from {folder / 'last.ckpt'} (step 3)"
    assert list((root / "checkpoints").iterdir()) == [folder]  # the resumed run writes where it resumed from

    last = folder / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])  # a kill or a full disk mid-copy
    (good,) = folder.glob("*step=5.ckpt")
    assert entry.run(_fit(tiny_shards, root, 7)) == 0
    (line,) = _auto_lines(capsys.readouterr().err)
    assert line.startswith(f"--ckpt_path auto: resuming from {good} (step 5); skipped 1 unreadable: {last}")
    (aside,) = folder.glob("last.ckpt.unreadable-*")
    assert f"(kept as {aside.name})" in line
    assert torch.load(last, weights_only=True)["global_step"] == 7

    client, run = only_run(mlflow_uri)  # one MLflow run over the three fits
    assert run.info.status == "FINISHED" and sorted(losses(client, run.info.run_id)) == list(range(7))
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert len(history) == 7  # each step once


def test_auto_is_for_fit_only(tiny_shards: Path, mlflow_uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert entry.run(args("test", tiny_shards, "mha", "--ckpt_path", "auto")) != 0
    err = capsys.readouterr().err
    assert err.count(": error: ") == 1 and "--ckpt_path auto resumes a fit" in err and "Traceback" not in err
