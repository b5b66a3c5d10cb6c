"""The CUDA branches of the GPU scripts, run on the CPU with torch.cuda stubbed (tests/cuda_stub.py): each
script's set-up goes through torch's own device checks up to its first tensor on the device, where the stub
stops it with CudaReached. A device argument that real torch refuses (torch.cuda.set_device without an index)
fails here as it would on the GPU, before the GPU is ever lent."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace

import pytest
import torch

from lightning_modules.core import precision
from lightning_modules.model.attention import names
from lightning_modules.training.throughput import ThroughputMonitor, device_peak_flops
from tests.cuda_stub import H100, CudaReached, CudaSentinel, FakeGpu, stub_cuda
from tests.scripts import ROOT, load_script

TINY = ["--seq-len", "32", "--batch-size", "2", "--steps", "1", "--warmup", "0"]


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGpu]:
    """One stubbed H100 for the test, CudaSentinel on."""
    gpu = stub_cuda(monkeypatch)
    with CudaSentinel():
        yield gpu


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("benchmarks/gpu.py", "gpu_benchmark_stubbed")


@pytest.fixture(scope="module")
def steps_dir() -> None:
    """scripts/ on the path, as scripts/gpu_check.py puts it, so its step modules import."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))


def streamed_rows(text: str, mark: str) -> list[dict]:
    return [json.loads(line[len(mark) :]) for line in text.splitlines() if line.startswith(mark)]


def test_the_stub_refuses_what_torch_refuses(fake_gpu: FakeGpu) -> None:
    with pytest.raises(ValueError, match="specified index"):
        torch.cuda.set_device(torch.device("cuda"))  # torch's own check, as on a GPU
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.cuda.set_device(1)  # one device
    torch.cuda.set_device(torch.device("cuda", 0))
    torch.cuda.synchronize(torch.device("cuda"))  # the current device stands in for a missing index
    assert fake_gpu.calls[-3:] == ["setDevice(0)", "synchronize", "setDevice(0)"]  # entered, synced, left
    with pytest.raises(CudaReached):
        torch.zeros(2, device="cuda")
    with pytest.raises(CudaReached), torch.device("cuda"):
        torch.nn.Linear(2, 2)
    assert torch.zeros(2).to("cpu").device.type == "cpu"  # the CPU is untouched


def test_the_training_child_sets_its_device_up_and_reaches_the_first_allocation(
    bench: ModuleType, fake_gpu: FakeGpu, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--one-size", "nano", "--device", "cuda", *TINY, "--kernels", "sdpa", "--compile", "off"]
    assert bench.main([*argv, "--kinds", "mha", "lrkv"]) == 0
    rows = streamed_rows(capsys.readouterr().out, bench.ROW_MARK)
    assert [r["attention"] for r in rows] == ["mha", "lrkv-r8 (factorized)", "lrkv-r8 (materialized)"]
    for row in rows:  # each row got as far as building its model on the device
        assert row["status"] == "error" and row["error"].startswith("CudaReached"), row
    assert "setDevice(0)" in fake_gpu.calls and "synchronize" in fake_gpu.calls  # after each row's error


def test_a_training_row_past_its_steps_reads_the_device(
    bench: ModuleType, fake_gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a row does after its timed steps (the peak rate by device name, the peak memory), with the steps
    themselves replaced: they are the first allocation."""
    monkeypatch.setattr(bench, "time_steps", lambda *a, **k: 2.0)
    args = bench.build_parser().parse_args(["--device", "cuda", *TINY])
    args.bf16 = True
    row = bench.measure("nano", "mha", None, "sdpa", False, args, torch.device("cuda", 0))
    assert row["status"] == "ok", row
    assert row["tokens_per_s"] == 32 and row["mfu"] is not None and row["peak_mem_gib"] == 0.0
    assert "memoryStats(0)" in fake_gpu.calls


def test_decode_sets_its_device_up_and_reaches_the_first_allocation(
    fake_gpu: FakeGpu, capsys: pytest.CaptureFixture[str]
) -> None:
    decode = load_script("benchmarks/decode.py", "decode_benchmark_stubbed")
    argv = ["--device", "cuda", "--size", "nano", "--context", "32", "--batch", "2", "--steps", "1"]
    assert decode.main([*argv, "--repeats", "1", "--memory-mode", "in-process", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["attention"] for r in rows} == set(names())  # every registered attention
    for row in rows:
        assert row["status"] == "error" and row["error"].startswith("CudaReached"), row


def test_the_check_steps_set_their_device_up(
    steps_dir: None,
    fake_gpu: FakeGpu,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import gpu.ceiling  # scripts/gpu/ceiling.py
    import gpu.env_info  # scripts/gpu/env_info.py

    info = gpu.env_info.cuda_info()
    assert info["cuda_device"] == H100 and info["capability"] == "9.0" and info["bf16_supported"] is True
    monkeypatch.setattr(sys, "argv", ["ceiling.py"])  # the GPU run: no --dry-run
    with pytest.raises(CudaReached):
        gpu.ceiling.main()  # named the device, then made the GEMM's operands on it


def test_the_training_steps_device_set_up(fake_gpu: FakeGpu) -> None:
    """What a fit on one GPU runs of the project's own CUDA code before and around its steps: the precision
    chosen by the hardware (lightning_modules/core/precision.py, read by training/cli.py) and the throughput
    monitor's peak rate and clock syncs (lightning_modules/training/throughput.py), on the device Lightning
    gives a module (indexed) and on a bare "cuda"."""
    hardware = precision.detect("cuda")
    assert (hardware.device, hardware.bf16_native, hardware.name) == ("cuda", True, H100)
    assert precision.choose(None, hardware).precision == precision.BF16
    for device in (torch.device("cuda", 0), torch.device("cuda")):
        assert device_peak_flops(device) == pytest.approx(989.4e12)
        monitor = ThroughputMonitor()
        module = SimpleNamespace(device=device)
        monitor.on_train_start(SimpleNamespace(global_step=0), module)  # type: ignore[arg-type]
        assert monitor._peak == pytest.approx(989.4e12)
        monitor.on_validation_start(SimpleNamespace(), module)  # type: ignore[arg-type]
        monitor._last = 0.0  # a window open: validation is timed, with a sync each side
        monitor.on_validation_start(SimpleNamespace(), module)  # type: ignore[arg-type]
        monitor.on_validation_end(SimpleNamespace(), module)  # type: ignore[arg-type]
    assert fake_gpu.calls.count("synchronize") == 4
