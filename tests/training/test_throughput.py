"""MFU's peak table matches exact device names (an H100 PCIe never gets the SXM peak), an unknown device gets
no MFU and one warning, LRKV_PEAK_FLOPS overrides; the causal-half count follows counts.py; the monitor
syncs once per window of steps."""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lightning_modules.core.errors import ConfigError
from lightning_modules.costs import counts as costs
from lightning_modules.training import throughput
from lightning_modules.training.throughput import (
    PEAK_ENV,
    ThroughputMonitor,
    causal_half_flops_per_token,
    device_peak_flops,
    peak_for_name,
)

CUDA = torch.device("cuda", 0)


@pytest.fixture
def gpu_named(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make torch.cuda.get_device_name report `name` (no GPU needed: only the name is read)."""
    monkeypatch.delenv(PEAK_ENV, raising=False)
    monkeypatch.setattr(throughput, "_warned", set())

    def name(value: str) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: value)

    return name


def test_h100_parts_get_their_own_peaks_not_the_sxm_one(gpu_named: Any) -> None:
    expected = {
        "NVIDIA H100 80GB HBM3": 989.4e12,
        "NVIDIA H100 PCIe": 756e12,
        "NVIDIA H100 NVL": 835.5e12,
        "NVIDIA H200": 989.4e12,
        "NVIDIA H200 NVL": 835.5e12,
        "NVIDIA A100-SXM4-80GB": 312e12,
        "NVIDIA A100 80GB PCIe": 312e12,
    }
    for name, peak in expected.items():
        gpu_named(name)
        assert device_peak_flops(CUDA) == peak, name


def test_names_match_exactly_apart_from_case_and_spacing() -> None:
    assert peak_for_name("nvidia  h100 pcie ") == 756e12
    # Substrings of known names, and known names with more after them (a MIG slice), are not known.
    for name in ("NVIDIA H100", "H100", "NVIDIA H100 PCIe MIG 1g.10gb", "NVIDIA H200 NVL 2", "NVIDIA GH200"):
        assert peak_for_name(name) is None, name


def test_unknown_device_has_no_mfu_and_warns_once_naming_it(
    gpu_named: Any, caplog: pytest.LogCaptureFixture
) -> None:
    gpu_named("NVIDIA Imaginary X1")
    with caplog.at_level(logging.WARNING, logger=throughput.__name__):
        assert device_peak_flops(CUDA) is None
        assert device_peak_flops(CUDA) is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "'NVIDIA Imaginary X1'" in warnings[0] and PEAK_ENV in warnings[0]
    assert "PEAK_BF16_FLOPS in lightning_modules/training/throughput.py" in warnings[0]


def test_env_override_wins_on_any_device_and_bad_values_are_rejected(
    gpu_named: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu_named("NVIDIA H100 80GB HBM3")
    assert device_peak_flops(torch.device("cpu")) is None
    monkeypatch.setenv(PEAK_ENV, "123.5e12")
    assert device_peak_flops(CUDA) == 123.5e12
    assert device_peak_flops(torch.device("cpu")) == 123.5e12
    for bad in ("fast", "0", "-1e12", "inf", "nan"):
        monkeypatch.setenv(PEAK_ENV, bad)
        with pytest.raises(ConfigError, match=rf"{PEAK_ENV}={bad}: give one device's peak"):
            device_peak_flops(CUDA)


def test_causal_half_removes_half_the_attention_term_that_counts_py_counts() -> None:
    model, attention = costs.load_configs(
        [costs.fragment("model", "nano"), costs.fragment("attention", "mha")]
    )
    tokens = 4 * model.seq_len
    full = costs.train_flops_per_token(model, attention, tokens)
    half = causal_half_flops_per_token(model, attention, tokens)
    d_h = model.d_model // model.n_head
    assert full - half == 3 * model.n_layer * model.seq_len * model.n_head * 2 * d_h  # (d_qk + d_v) / 2
    # counts.py's term is linear in T, everything else not: doubling T adds exactly the full term once.
    longer = dataclasses.replace(model, seq_len=2 * model.seq_len)
    assert costs.train_flops_per_token(longer, attention, tokens) - full == pytest.approx(2 * (full - half))


class FakeModule:
    """What the monitor reads of a LanguageModel: counters, device, the cost model; what it logs."""

    def __init__(self) -> None:
        self.tokens_seen, self.flops_seen, self.device = 0, 0.0, torch.device("cpu")
        self.logged: list[tuple[str, float]] = []

    def log(self, key: str, value: float) -> None:
        self.logged.append((key, value))

    def flops_per_token(self, tokens_per_forward: int) -> float:
        return 10.0

    @property
    def arch(self) -> Any:
        raise AssertionError("not read without a peak")


def fake_trainer(every: int, max_steps: int = 100) -> SimpleNamespace:
    epoch_loop = SimpleNamespace(_batches_that_stepped=0)
    return SimpleNamespace(
        log_every_n_steps=every, max_steps=max_steps, should_stop=False, global_step=0, world_size=1,
        fit_loop=SimpleNamespace(epoch_loop=epoch_loop),
    )  # fmt: skip


def test_monitor_syncs_once_per_window_and_never_mid_accumulation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PEAK_ENV, raising=False)
    monitor, module, trainer = ThroughputMonitor(), FakeModule(), fake_trainer(every=4)
    clock = iter(range(1000))
    syncs: list[int] = []

    def sync(pl_module: Any) -> float:
        syncs.append(trainer.global_step)
        return float(next(clock))

    monkeypatch.setattr(monitor, "_sync", sync)
    monitor.on_train_start(trainer, module)  # type: ignore[arg-type]
    batch = torch.zeros(2, 9, dtype=torch.long)
    for step in range(12):
        for micro in range(2):  # two micro-batches per optimizer step: the first does not step
            module.tokens_seen += 16
            if micro == 1:
                trainer.global_step += 1
            monitor.on_train_batch_end(trainer, module, None, batch, 2 * step + micro)  # type: ignore[arg-type]
        trainer.fit_loop.epoch_loop._batches_that_stepped += 1
    assert syncs == [4, 8, 12]  # log steps 3, 7, 11: Lightning's logged steps at log_every_n_steps=4
    # The first window only starts the clock; each later one covers 4 steps of 32 tokens in 1 s.
    assert module.logged == [("train/tokens_per_s", 128.0), ("train/tokens_per_s", 128.0)]


def test_monitor_cadence_can_be_set_apart_from_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    monitor, module, trainer = (
        ThroughputMonitor(every_n_steps=2),
        FakeModule(),
        fake_trainer(every=1, max_steps=5),
    )
    syncs: list[int] = []
    monkeypatch.setattr(monitor, "_sync", lambda m: syncs.append(trainer.global_step) or 0.0)
    monitor.on_train_start(trainer, module)  # type: ignore[arg-type]
    for _ in range(5):
        trainer.global_step += 1
        monitor.on_train_batch_end(trainer, module, None, torch.zeros(1, 2), 0)  # type: ignore[arg-type]
        trainer.fit_loop.epoch_loop._batches_that_stepped += 1
    assert syncs == [2, 4, 5]  # every 2 steps, and the last one
    with pytest.raises(ConfigError, match="every_n_steps=0: must be >= 1"):
        ThroughputMonitor(every_n_steps=0)
