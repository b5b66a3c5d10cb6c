"""Which numeric precision a run uses when the user does not say: the hardware decides.

bf16 pays off only where the hardware multiplies bf16 natively. On a CUDA device with bf16 support and on a
CPU with native bf16 (AVX-512 BF16 or AMX: oneDNN reports it) bf16-mixed is the fast choice. On a CPU with
AVX2 only, torch runs bf16 matrix products through a slow path: measured 40-60x slower than fp32 on an AMD
EPYC (BENCHMARKS.md, "Precision"), so such a machine trains in fp32 (32-true). An explicit precision
(`--trainer.precision ...`, `--precision ...`) always wins over the choice. Between the two sits the
environment: `LRKV_PRECISION=bf16|fp32` replaces the hardware's choice for every entry point and benchmark
that is not given one (e.g. `LRKV_PRECISION=bf16 make test` runs the suite as a CPU with native bf16 would
choose, to time it on this one).

One rule for training (lightning_modules/training/cli.py), the benchmarks and generation (lightning_modules/commands/generate.py).
"""

from __future__ import annotations

import argparse
import os
import platform
from dataclasses import dataclass

import torch

from lightning_modules.core.errors import UserError

BF16 = "bf16-mixed"
FP32 = "32-true"
ENV = "LRKV_PRECISION"
FLAG_VALUES = {"bf16": BF16, "fp32": FP32}


class PrecisionSettingError(UserError, ValueError):
    """LRKV_PRECISION holds something other than auto, bf16 or fp32."""


@dataclass(frozen=True)
class Hardware:
    """What the choice depends on: the device kind that will run the model and its bf16 support."""

    device: str  # "cuda" or "cpu" (any other accelerator is treated as having no fast bf16)
    bf16_native: bool
    name: str  # e.g. "NVIDIA H200" or the CPU model, for logs and benchmark tables

    @property
    def capability(self) -> str:
        """A short tag for MLflow and BENCHMARKS.md, e.g. "cpu-native-bf16" or "cpu-no-native-bf16"."""
        return f"{self.device}-{'native' if self.bf16_native else 'no-native'}-bf16"


@dataclass(frozen=True)
class PrecisionChoice:
    precision: str  # a Lightning precision string
    source: str  # "user", "environment" (LRKV_PRECISION) or "hardware"
    reason: str


def cpu_name() -> str:
    """The CPU model as the OS names it (lscpu's "Model name"), or platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_has_native_bf16() -> bool:
    """True where oneDNN runs bf16 matrix products natively (AVX-512 BF16 / AMX on x86)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN: assume the slow path
        return False


def detect(accelerator: str | None = "auto") -> Hardware:
    """The hardware a Trainer with this accelerator setting would run on."""
    accelerator = (accelerator or "auto").lower()
    use_cuda = accelerator in ("cuda", "gpu") or (accelerator == "auto" and torch.cuda.is_available())
    if use_cuda and torch.cuda.is_available():
        return Hardware("cuda", torch.cuda.is_bf16_supported(), torch.cuda.get_device_name())
    if accelerator in ("auto", "cpu", "cuda", "gpu"):
        return Hardware("cpu", cpu_has_native_bf16(), cpu_name())
    return Hardware(accelerator, False, accelerator)


def choose(requested: str | int | None, hardware: Hardware) -> PrecisionChoice:
    """The precision to train in: `requested` when set (the user's word wins), else the hardware's choice."""
    if requested is not None and str(requested) != "auto":
        return PrecisionChoice(str(requested), "user", "set explicitly")
    env = os.environ.get(ENV, "").strip()
    if env and env != "auto":
        if env not in FLAG_VALUES:
            raise PrecisionSettingError(f"{ENV}={env!r}: set it to auto, bf16 or fp32, or unset it")
        return PrecisionChoice(FLAG_VALUES[env], "environment", f"set by {ENV}={env}")
    if hardware.bf16_native and hardware.device in ("cuda", "cpu"):
        what = "CUDA device" if hardware.device == "cuda" else "CPU"
        return PrecisionChoice(BF16, "hardware", f"{what} with native bf16 ({hardware.name})")
    if hardware.device == "cpu":
        reason = f"CPU without native bf16 ({hardware.name}): bf16 matmuls would take a slow path"
    else:
        reason = f"{hardware.device} device without bf16 support ({hardware.name})"
    return PrecisionChoice(FP32, "hardware", reason)


def uses_bf16(choice: PrecisionChoice) -> bool:
    return choice.precision.startswith("bf16")


def describe(choice: PrecisionChoice) -> str:
    """The line a run prints once, saying what was chosen, why, and how to choose by hand."""
    if choice.source == "user":
        return f"precision {choice.precision} (set explicitly)"
    if choice.source == "environment":
        return f"precision {choice.precision}, {choice.reason} (unset it to let the hardware choose)"
    return (
        f"precision {choice.precision}, chosen by the hardware: {choice.reason}; "
        "set --trainer.precision to choose by hand"
    )


def from_flag(value: str, hardware: Hardware | None = None) -> PrecisionChoice:
    """A benchmark's or generation's `--precision auto|bf16|fp32` under the same rule as training."""
    if value not in ("auto", *FLAG_VALUES):
        raise ValueError(f"--precision {value!r}: choose auto, bf16 or fp32")
    return choose(FLAG_VALUES.get(value), hardware or detect())


def add_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--precision",
        choices=["auto", *FLAG_VALUES],
        default="auto",
        help="auto: bf16 where the hardware has native bf16, else fp32 (lightning_modules/core/precision.py)",
    )


def weights_dtype(flag: str, device: torch.device | str) -> torch.dtype:
    """The dtype to cast a model to for inference on `device` (generation, decode benchmarks)."""
    device = torch.device(device)
    hardware = detect("cuda" if device.type == "cuda" else device.type)
    return torch.bfloat16 if uses_bf16(from_flag(flag, hardware)) else torch.float32
