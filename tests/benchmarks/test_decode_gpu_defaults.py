"""benchmarks/decode.py's GPU-minded code paths, run on the CPU at tiny shapes: the defaults chosen by device (the
device check faked), the memory probe in one process, one arm's failure isolated from the others, the CUDA-graph
bookkeeping (capture faked) and the fixed-context step a graph replays."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from lightning_modules.model.attention.cache import caches_nbytes
from lightning_modules.model.transformer import Transformer
from tests.helpers import KINDS, attn, tiny_model

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "decode.py"
CONTEXT, BATCH = 12, 2


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("decode_benchmark_gpu_defaults", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_net(kind: str) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_model(), attn(kind)).eval()


def run_args(**overrides: Any) -> argparse.Namespace:
    fields: dict[str, Any] = dict(
        steps=2, repeats=1, chunk=5, memory=False, memory_mode="in-process", cuda_graph=False
    )
    fields.update(overrides)
    return argparse.Namespace(**fields)


def all_arms(bench: ModuleType, nets: dict[str, Transformer]) -> dict[str, tuple[str, str | None, bool]]:
    arms: dict[str, tuple[str, str | None, bool]] = {}
    for kind, net in nets.items():
        arms.update(bench.arms_of(net, kind, True, torch.device("cpu")))
    return arms


# ----- defaults by device --------------------------------------------------------------------------------
def test_defaults_follow_the_device(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = bench.parser().parse_args([])
    gpu = bench.settle(parsed, torch.device("cuda"))
    assert (gpu.size, gpu.batch, gpu.memory_mode) == ("128m", (64,), "in-process")
    assert 8192 in gpu.context and min(gpu.batch) >= 64
    cpu = bench.settle(parsed, torch.device("cpu"))
    assert (cpu.size, cpu.batch, cpu.context, cpu.memory_mode) == (
        "nano",
        (1,),
        (128, 256, 512, 1024, 2048),
        "child",
    )
    # The command line wins over the device: batch 1 stays an option on CUDA, and several batches are one run.
    mine = bench.settle(bench.parser().parse_args(["--batch", "64", "1", "--size", "nano", "--context", "8192"]),
                        torch.device("cuda"))  # fmt: skip
    assert (mine.size, mine.batch, mine.context) == ("nano", (64, 1), (8192,))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert bench.pick_device("auto").type == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.pick_device("auto").type == "cpu"


def test_bad_batch_is_one_line(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--device", "cpu", "--batch", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "benchmarks/decode.py: error: --batch 0: every value must be >= 1"


# ----- memory in one process -----------------------------------------------------------------------------
class FakeMeter:
    """Fixed readings, and a log of calls, so the probe's arithmetic and its windows can be checked exactly."""

    kind = "fake"

    def __init__(self, start: int = 1000, peak: int = 1700) -> None:
        self.readings, self.log = (start, peak), []  # type: ignore[var-annotated]

    def start(self) -> int:
        self.log.append("start")
        return self.readings[0]

    def peak(self) -> int:
        self.log.append("peak")
        return self.readings[1]


class _Counted:
    """A Step whose calls go through `call` and are counted, with the Step's fields."""

    def __init__(self, step: Any, call: Callable[[], Any] | None = None) -> None:
        self.net, self.caches, self.call, self.calls = step.net, step.caches, call or step, 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.call()


def test_in_process_probe_counts_the_arm_alone(bench: ModuleType) -> None:
    net = tiny_net("lrkv")
    step = _Counted(bench.prepare_steps(net, CONTEXT, BATCH, 5, torch.device("cpu")))
    probe = bench.probe_in_process(step, 3, FakeMeter())
    resident = sum(p.nbytes for p in net.parameters()) + caches_nbytes(step.caches)
    assert probe == {
        "memory_status": "ok",
        "peak_memory_bytes": resident + 700,
        "memory_baseline_bytes": resident,
        "step_transient_bytes": 700,
        "process_peak_bytes": 1700,
        "peak_memory_kind": "fake_in_process",
    }
    assert step.calls == 4  # one warm step outside the window, three inside


@pytest.mark.slow
def test_memory_probe_runs_in_this_process_reset_per_arm(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("the in-process probe started a child process")

    monkeypatch.setattr(subprocess, "run", no_child)
    meter = FakeMeter()
    monkeypatch.setattr(bench, "meter_for", lambda device: meter)
    nets = {"mqa": tiny_net("mqa"), "lrkv": tiny_net("lrkv")}
    arms = all_arms(bench, nets)
    rows = bench.decode_speed(nets, arms, CONTEXT, BATCH, run_args(memory=True), torch.device("cpu"))
    assert list(rows) == ["mqa", "lrkv", "lrkv:rebuilt", "lrkv:materialized"]
    assert meter.log == ["start", "peak"] * len(arms)  # a fresh peak window for every arm
    for row in rows.values():
        assert row["status"] == row["memory_status"] == "ok"
        assert row["memory_baseline_bytes"] == row["weights_bytes"] + row["run_cache_bytes"]
        assert row["peak_memory_bytes"] == row["memory_baseline_bytes"] + 700


def test_in_process_probe_reads_this_process_memory(bench: ModuleType) -> None:
    """The real CPU meter (VmHWM / VmRSS) in this process: a transient >= 0 on top of the arm's own bytes."""
    nets = {"mha": tiny_net("mha")}
    rows = bench.decode_speed(
        nets, all_arms(bench, nets), CONTEXT, BATCH, run_args(memory=True), torch.device("cpu")
    )
    row = rows["mha"]
    assert row["peak_memory_kind"] == "process_peak_rss_vmhwm_in_process"
    assert row["process_peak_bytes"] > row["peak_memory_bytes"] >= row["memory_baseline_bytes"] > 0


# ----- one arm's failure ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_one_arm_failing_leaves_the_others(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    prepare = bench.prepare_steps

    def failing(net: Transformer, context: int, batch: int, chunk: int, device: torch.device,
                path: str | None = None, plain: bool = False) -> Any:  # fmt: skip
        if path == "rebuilt":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if path == "materialized":
            raise RuntimeError("something else\nsecond line")
        step = prepare(net, context, batch, chunk, device, path, plain)
        if net.attention_config.kind == "mqa":  # fails in the timed rounds, after its first call

            def later() -> Any:
                if counted.calls > 1:
                    raise RuntimeError(
                        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"
                    )
                return step()

            counted = _Counted(step, later)
            return counted
        return step

    monkeypatch.setattr(bench, "prepare_steps", failing)
    nets = {"mqa": tiny_net("mqa"), "lrkv": tiny_net("lrkv"), "mha": tiny_net("mha")}
    rows = bench.decode_speed(nets, all_arms(bench, nets), CONTEXT, BATCH, run_args(), torch.device("cpu"))
    assert {arm: r["status"] for arm, r in rows.items()} == {
        "mqa": "oom",
        "lrkv": "ok",
        "lrkv:rebuilt": "oom",
        "lrkv:materialized": "error",
        "mha": "ok",
    }
    assert rows["lrkv:rebuilt"]["error"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert rows["lrkv:materialized"]["error"] == "RuntimeError: something else"
    assert (
        "tokens_per_s" not in rows["mqa"]
        and rows["mha"]["tokens_per_s"] > 0
        and rows["lrkv"]["step_flops"] > 0
    )
    table = bench.markdown([{"arm_label": arm, "attention": arm, **r} for arm, r in rows.items()])
    assert (
        "| lrkv:rebuilt | oom |" in table and "| lrkv:materialized | 2 | 12 | error | RuntimeError:" in table
    )


@pytest.mark.slow
def test_a_failing_memory_probe_keeps_the_speed(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken(FakeMeter):
        def peak(self) -> int:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(bench, "meter_for", lambda device: Broken())
    nets = {"gqa": tiny_net("gqa")}
    row = bench.decode_speed(
        nets, all_arms(bench, nets), CONTEXT, BATCH, run_args(memory=True), torch.device("cpu")
    )["gqa"]
    assert (row["status"], row["memory_status"]) == ("ok", "oom") and row["tokens_per_s"] > 0
    assert "peak_memory_bytes" not in row


# ----- CUDA graphs ---------------------------------------------------------------------------------------
def test_graph_speed_bookkeeping(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Capture faked (a 'replay' that reruns the step): an arm whose capture fails has that graph_status, its
    caches rewound, and the others are timed. On the CPU every arm is skipped."""
    nets = {"mla": tiny_net("mla"), "mha": tiny_net("mha")}
    device = torch.device("cpu")
    steps = {arm: bench.prepare_steps(nets[arm], CONTEXT, BATCH, 5, device) for arm in nets}
    skipped = bench.graph_speed(steps, run_args(), device)
    assert {arm: r["graph_status"] for arm, r in skipped.items()} == {"mla": "skipped", "mha": "skipped"}

    def fake_capture(step: Any, device: torch.device) -> Callable[[], None]:
        if step.net.attention_config.kind == "mla":
            for cache in step.caches:
                cache.length += 1  # as if the capture stopped inside decode, after an append
            raise RuntimeError("operation not permitted when stream is capturing")
        return step

    monkeypatch.setattr(bench, "sync", lambda device: None)  # timing on a 'cuda' device that is this CPU
    out = bench.graph_speed(steps, run_args(), torch.device("cuda"), capturer=fake_capture)
    assert out["mla"] == {
        "graph_status": "error",
        "graph_error": "RuntimeError: operation not permitted when stream is capturing",
    }
    assert all(cache.length == CONTEXT - 1 for cache in steps["mla"].caches)
    assert out["mha"]["graph_status"] == "ok" and out["mha"]["graph_tokens_per_s"] > 0


def test_graph_speed_sits_beside_eager(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    def graphs(steps: dict[str, Any], args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
        return {
            arm: {"graph_status": "ok", "graph_tokens_per_s": 1000.0, "graph_ms_per_step": 2.0}
            for arm in steps
        }

    monkeypatch.setattr(bench, "graph_speed", graphs)
    nets = {"mha": tiny_net("mha")}
    args = run_args(cuda_graph=True)
    row = bench.decode_speed(nets, all_arms(bench, nets), CONTEXT, BATCH, args, torch.device("cpu"))["mha"]
    assert (row["status"], row["graph_status"], row["graph_tokens_per_s"]) == ("ok", "ok", 1000.0)
    assert row["graph_speedup"] == pytest.approx(1000.0 / row["tokens_per_s"])


@pytest.mark.parametrize("kind", KINDS)
def test_fixed_context_step_is_replayable(bench: ModuleType, kind: str) -> None:
    """What a CUDA graph of the benchmark's step replays: every call writes the same slot and reads the same
    views, so calls give bit-identical logits and leave identical caches, and those logits are the full
    forward's at the last position (every decode path)."""
    net = tiny_net(kind)
    paths = type(net.blocks[0].attn).decode_paths
    for path in paths:
        step = bench.prepare_steps(net, CONTEXT, BATCH, 5, torch.device("cpu"), path)
        first = step().clone()
        after_first = [{n: b.clone() for n, b in c.buffers.items()} for c in step.caches]
        second = step()
        assert torch.equal(first, second), path
        assert all(c.length == CONTEXT - 1 for c in step.caches)
        for cache, before in zip(step.caches, after_first, strict=True):
            assert all(torch.equal(cache.buffers[n], before[n]) for n in before), path
        gen = torch.Generator(device="cpu").manual_seed(CONTEXT)  # prepare_steps' tokens
        tokens = torch.randint(0, net.config.vocab_size, (BATCH, CONTEXT), generator=gen)
        with torch.no_grad():
            full = net(tokens)[:, -1:]
        torch.testing.assert_close(first, full, atol=1e-4, rtol=1e-4, msg=path)


# ----- end to end ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_one_process_run_with_graph_flag_and_output_file(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a child process was started"))
    out = tmp_path / "rows" / "decode.json"
    argv = ["--device", "cpu", "--size", "nano", "--attention", "mqa", "lrkv", "--context", "16", "--batch", "2", "1",
            "--steps", "2", "--repeats", "1", "--check-tokens", "24", "--memory-mode", "in-process",
            "--cuda-graph", "--json", "--output", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert json.loads(out.read_text()) == rows
    assert [(r["arm"], r["batch"]) for r in rows] == [("mqa", 2), ("lrkv", 2), ("mqa", 1), ("lrkv", 1)]
    for r in rows:
        assert (r["status"], r["memory_status"], r["graph_status"]) == ("ok", "ok", "skipped")
        assert (
            r["tokens_per_s"] > 0 and r["memory_baseline_bytes"] == r["weights_bytes"] + r["run_cache_bytes"]
        )
    assert [rows[0]["run_cache_bytes"], rows[1]["run_cache_bytes"]] == [
        2 * r["run_cache_bytes"] for r in rows[2:]
    ]
    assert bench.GRAPH_NOTE in captured.err
    assert "tokens/s (CUDA graph replay)" in bench.markdown(rows)
