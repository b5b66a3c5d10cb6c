"""The precision rule: the user's setting wins; otherwise bf16-mixed where the hardware has native bf16,
32-true elsewhere. Checked for every case, and through the CLI on this machine (whatever its CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_modules.core import precision
from lightning_modules.core.precision import BF16, FP32, Hardware, choose
from lightning_modules.training.cli import LanguageModelCLI, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_precision_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the rule; a suite run under LRKV_PRECISION=... must not change them."""
    monkeypatch.delenv(precision.ENV, raising=False)


CASES = [
    (None, Hardware("cuda", True, "NVIDIA H200"), BF16, "hardware"),
    (None, Hardware("cuda", False, "Tesla V100"), FP32, "hardware"),
    (None, Hardware("cpu", True, "Intel Xeon (AMX)"), BF16, "hardware"),
    (None, Hardware("cpu", False, "AMD EPYC (AVX2)"), FP32, "hardware"),
    (None, Hardware("mps", False, "mps"), FP32, "hardware"),
    ("auto", Hardware("cpu", False, "AMD EPYC (AVX2)"), FP32, "hardware"),
    ("bf16-mixed", Hardware("cpu", False, "AMD EPYC (AVX2)"), BF16, "user"),
    ("32-true", Hardware("cuda", True, "NVIDIA H200"), FP32, "user"),
    ("16-mixed", Hardware("cuda", True, "NVIDIA H200"), "16-mixed", "user"),
]


@pytest.mark.parametrize(("requested", "hardware", "expected", "source"), CASES)
def test_choice(requested: str | None, hardware: Hardware, expected: str, source: str) -> None:
    choice = choose(requested, hardware)
    assert (choice.precision, choice.source) == (expected, source)
    assert choice.precision in precision.describe(choice)


@pytest.mark.parametrize(
    ("env", "requested", "hardware", "expected", "source"),
    [
        ("fp32", None, Hardware("cpu", True, "Intel Xeon (AMX)"), FP32, "environment"),
        ("bf16", None, Hardware("cpu", False, "AMD EPYC (AVX2)"), BF16, "environment"),
        ("bf16", "auto", Hardware("cuda", False, "Tesla V100"), BF16, "environment"),
        ("auto", None, Hardware("cpu", True, "Intel Xeon (AMX)"), BF16, "hardware"),
        ("", None, Hardware("cpu", False, "AMD EPYC (AVX2)"), FP32, "hardware"),
        ("bf16", "32-true", Hardware("cpu", True, "Intel Xeon (AMX)"), FP32, "user"),  # the user's word wins
    ],
)  # fmt: skip
def test_environment_sits_between_the_user_and_the_hardware(
    monkeypatch: pytest.MonkeyPatch, env: str, requested: str | None, hardware: Hardware, expected: str,
    source: str,
) -> None:  # fmt: skip
    monkeypatch.setenv(precision.ENV, env)
    choice = choose(requested, hardware)
    assert (choice.precision, choice.source) == (expected, source)
    assert choice.precision in precision.describe(choice)
    if source == "environment":
        assert f"LRKV_PRECISION={env}" in precision.describe(choice)


def test_bad_environment_value_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(precision.ENV, "fp16")
    with pytest.raises(
        precision.PrecisionSettingError, match="LRKV_PRECISION='fp16': set it to auto, bf16 or fp32"
    ):
        choose(None, Hardware("cpu", False, "x"))
    assert choose("bf16-mixed", Hardware("cpu", False, "x")).precision == BF16  # not read when not needed


def test_capability_tags_name_the_kind() -> None:
    assert Hardware("cpu", False, "x").capability == "cpu-no-native-bf16"
    assert Hardware("cuda", True, "x").capability == "cuda-native-bf16"


def test_detect_on_this_machine_matches_torch() -> None:
    hardware = precision.detect("cpu")
    assert hardware.device == "cpu"
    assert hardware.bf16_native == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert hardware.name


def _cli(tiny_shards: Path, *extra: str) -> LanguageModelCLI:
    args = [
        "--config", str(ROOT / "conf/base.yaml"),
        "--config", str(ROOT / "conf/model/nano.yaml"),
        "--config", str(ROOT / "conf/attention/mqa.yaml"),
        "--model.arch.seq_len", "32",
        "--data.data_dir", str(tiny_shards),
        "--trainer.accelerator", "cpu",
        *extra,
    ]  # fmt: skip
    return main(args, run=False)


@pytest.mark.slow
def test_cli_default_is_the_hardware_choice(tiny_shards: Path, mlflow_uri: str) -> None:
    cli = _cli(tiny_shards)
    expected = BF16 if precision.cpu_has_native_bf16() else FP32
    assert cli.config.trainer.precision == expected
    assert str(cli.trainer.precision) == expected
    (logger,) = cli.trainer.loggers
    tags = logger.tags  # type: ignore[attr-defined]
    assert tags["precision"] == expected and tags["precision_source"] == "hardware"
    assert tags["hardware"] == precision.detect("cpu").capability


def test_cli_precision_from_the_environment_is_tagged_so(
    tiny_shards: Path, mlflow_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(precision.ENV, "fp32")
    cli = _cli(tiny_shards)
    assert str(cli.trainer.precision) == FP32
    (logger,) = cli.trainer.loggers
    assert logger.tags["precision_source"] == "environment"  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", [BF16, FP32])
def test_cli_explicit_precision_wins(tiny_shards: Path, mlflow_uri: str, value: str) -> None:
    cli = _cli(tiny_shards, "--trainer.precision", value)
    assert str(cli.trainer.precision) == value
    (logger,) = cli.trainer.loggers
    assert logger.tags["precision_source"] == "user"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("flag", "hardware", "expected"),
    [
        ("auto", Hardware("cpu", False, "AVX2"), FP32),
        ("auto", Hardware("cpu", True, "AMX"), BF16),
        ("bf16", Hardware("cpu", False, "AVX2"), BF16),
        ("fp32", Hardware("cuda", True, "H200"), FP32),
    ],
)
def test_benchmark_and_generation_flag_follows_the_rule(flag: str, hardware: Hardware, expected: str) -> None:
    assert precision.from_flag(flag, hardware).precision == expected


def test_bad_flag_is_refused() -> None:
    with pytest.raises(ValueError, match="choose auto, bf16 or fp32"):
        precision.from_flag("fp16", Hardware("cpu", False, "x"))


def test_generation_dtype_on_this_cpu() -> None:
    native = precision.cpu_has_native_bf16()
    assert precision.weights_dtype("auto", "cpu") == (torch.bfloat16 if native else torch.float32)
    assert precision.weights_dtype("fp32", "cpu") == torch.float32
    assert precision.weights_dtype("bf16", "cpu") == torch.bfloat16
