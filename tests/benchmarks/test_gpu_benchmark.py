"""benchmarks/gpu.py without a GPU: it says so and exits 0; its code runs end to end on a CPU at nano
(a smoke run, no figures); its verdicts follow the issue's targets."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
import torch

from lightning_modules.model.attention import kernel

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_benchmark", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_says_so_and_exits_cleanly(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main([]) == 0
    captured = capsys.readouterr()
    assert "no CUDA device here" in captured.err and captured.out == ""


def test_cpu_smoke_run_gives_every_row(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = ["--device", "cpu", "--sizes", "nano", "--seq-len", "32", "--batch-size", "2", "--steps", "1"]
    assert bench.main([*tiny, "--warmup", "0", "--compile", "off", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["rows"]
    labels = [r["attention"] for r in rows]
    assert labels == ["mha", "mqa", "gqa-g2", "mla-c64", "lrkv-r8 (factorized)", "lrkv-r8 (materialized)"]
    for r in rows:
        assert r["status"] == "ok" and r["kernel"] == r["kernel_ran"] == "sdpa" and r["tokens_per_s"] > 0
        assert r["mfu"] is None and r["peak_mem_gib"] is None  # no peak rate or memory counter on a CPU
        assert r["compile"] is False and r["plan_peak_gib"] > 0  # the memory plan's peak beside it
    assert report["environment"]["command"].startswith("python benchmarks/gpu.py --device cpu")
    if kernel.flash_attn_func is None:
        assert report["targets"][0].startswith("NOTE flash-attn not installed")


def test_verdicts_follow_the_targets(bench: ModuleType) -> None:
    def row(attention: str, kernel_name: str, tps: int, mfu: float) -> dict:
        return {"size": "128m", "attention": attention, "kernel": kernel_name, "tokens_per_s": tps, "mfu": mfu,
                "seq_len": 2048, "status": "ok"}  # fmt: skip

    rows = [
        row("mha", "sdpa", 100, 0.40),
        row("mha", "flash", 120, 0.46),
        row("mla-c128", "sdpa", 100, 0.3),
        row("lrkv-r46 (factorized)", "flash", 110, 0.4),
        row("lrkv-r46 (materialized)", "flash", 90, 0.3),
    ]
    verdicts = bench.compare(rows)
    assert "PASS 128m mha MFU 46.0% (target >= 45%, flash)" in verdicts
    assert "FAIL 128m mla-c128 83.3% of mha's tokens/s (target >= 90 %)" in verdicts  # 100 / 120
    assert "PASS 128m lrkv-r46 (factorized) 91.7% of mha's tokens/s (target >= 90 %)" in verdicts
    assert [r["vs_mha"] for r in rows] == [1.0, 1.0, 1.0, 0.917, 0.75]  # against mha on the same kernel


@pytest.mark.slow  # inductor compiles on first use
def test_compile_on_and_off_rows_with_the_memory_plan(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = ["--device", "cpu", "--sizes", "nano", "--seq-len", "32", "--batch-size", "2", "--steps", "1"]
    argv = [*tiny, "--warmup", "0", "--kinds", "mha", "--kernels", "sdpa", "--precision", "fp32", "--json"]
    assert bench.main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["attention"], r["compile"], r["status"]) for r in rows] == [
        ("mha", False, "ok"),
        ("mha", True, "ok"),
    ]
    assert rows[0]["plan_peak_gib"] == rows[1]["plan_peak_gib"]  # the plan does not depend on compile
    assert rows[0]["vs_mha"] == rows[1]["vs_mha"] == 1.0  # each against mha with the same compile setting
    assert "| compile |" in bench.table(rows) and "| plan GiB |" in bench.table(rows)
