"""The demo's comparison: every requested attention trains on one budget, is tested, and gets a row."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_modules.commands import compare
from tests.conftest import TINY_SEQ_LEN


@pytest.mark.slow
def test_compare_trains_tests_and_tabulates(
    tiny_shards: Path, mlflow_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data.yaml"
    data.write_text(f"data:\n  data_dir: {tiny_shards}\n  batch_size: 4\n  num_workers: 0\n")
    budget = tmp_path / "budget.yaml"
    budget.write_text("model:\n  budget:\n    flops: 4.0e9\n")
    extra = ["--model.arch.seq_len", str(TINY_SEQ_LEN), "--trainer.limit_val_batches", "2",
             "--trainer.enable_progress_bar", "false", "--trainer.limit_test_batches", "2"]  # fmt: skip
    assert (
        compare.main(
            ["--attentions", "mha", "lrkv", "--data", str(data), "--budget", str(budget), "--", *extra]
        )
        == 0
    )
    out = capsys.readouterr().out
    table = out[out.index("Equal-compute comparison") :].splitlines()
    rows = [line.split() for line in table if line.strip().startswith("nano")]
    assert [r[1] for r in rows] == ["mha", "lrkv-r8"]
    flops = [float(r[5]) for r in rows]
    step = 4 * TINY_SEQ_LEN * 9.4e6  # one step of nano at 32 tokens is about 1.2e9 FLOPs
    assert all(4.0e9 <= f < 4.0e9 + step for f in flops)
    assert all(0 < float(r[7]) < 10 and 0 < float(r[8]) < 10 for r in rows)  # test CE, bits per byte
    assert "make mlflow-ui" in out


def test_an_unknown_size_is_refused_in_one_line_before_training(capsys: pytest.CaptureFixture[str]) -> None:
    missing = "9x"
    with pytest.raises(SystemExit) as exit_info:
        compare.main(["--sizes", "nano", missing])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert f"--sizes: no conf/model/{missing}.yaml; allowed:" in captured.err and "nano" in captured.err
    assert "Traceback" not in captured.err and "===" not in captured.out  # nothing trained
