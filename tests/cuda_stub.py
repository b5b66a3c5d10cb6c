"""A CUDA device stubbed into a CPU-only torch, far enough for the GPU scripts' set-up to run to their first
allocation on the device.

Only torch's C entry points (torch._C._cuda_*) and the few Python hooks that stand in for them on a CPU build
are replaced; torch.cuda's own Python functions (set_device, synchronize, memory_stats, get_device_properties,
is_bf16_supported, the `torch.cuda.device` context) run as installed, so a device argument they would refuse on
a GPU (torch.device("cuda") without an index given to set_device, say) is refused here by the same code.
The first tensor made on or moved to a CUDA device raises CudaReached (CudaSentinel): past that point a CPU
cannot follow, and reaching it is what a test asserts.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

H100 = "NVIDIA H100 80GB HBM3"  # the name torch.cuda.get_device_name gives on an H100 SXM


class CudaReached(Exception):
    """The code under test made its first tensor on a CUDA device: its set-up went through."""


@dataclasses.dataclass
class FakeGpu:
    """What the stub reports, and what the code asked of it (`calls`: the C entry points, in order)."""

    name: str = H100
    capability: tuple[int, int] = (9, 0)
    total_memory: int = 80 * 2**30
    multiprocessors: int = 132
    count: int = 1
    current: int = 0
    calls: list[str] = dataclasses.field(default_factory=list)

    def index(self, idx: int, what: str) -> int:
        """An index the driver accepts; the error a real driver gives for any other."""
        if not isinstance(idx, int) or not 0 <= idx < self.count:
            raise RuntimeError(f"CUDA error: invalid device ordinal ({what}({idx!r}))")
        self.calls.append(f"{what}({idx})")
        return idx

    def set_device(self, idx: int) -> None:
        self.current = self.index(idx, "setDevice")

    def exchange(self, idx: int) -> int:
        """torch.cuda.device's __enter__ / __exit__: select idx (a negative one selects nothing)."""
        previous = self.current
        if idx >= 0:
            self.set_device(idx)
        return previous

    def properties(self, idx: int) -> SimpleNamespace:
        self.index(idx, "getDeviceProperties")
        major, minor = self.capability
        return SimpleNamespace(
            name=self.name,
            major=major,
            minor=minor,
            total_memory=self.total_memory,
            multi_processor_count=self.multiprocessors,
        )

    def reset_peak(self, idx: int) -> None:
        self.index(idx, "resetPeakMemoryStats")

    def reset_accumulated(self, idx: int) -> None:
        self.index(idx, "resetAccumulatedMemoryStats")

    def memory_stats(self, idx: int) -> dict[str, Any]:
        self.index(idx, "memoryStats")
        zero = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}
        return {"allocated_bytes": {"all": dict(zero)}, "reserved_bytes": {"all": dict(zero)}}


def is_cuda(value: Any) -> bool:
    """A CUDA device, device string or tensor, or a container holding one."""
    if isinstance(value, torch.Tensor):
        return value.device.type == "cuda"
    if isinstance(value, torch.device):
        return value.type == "cuda"
    if isinstance(value, str):
        return value == "cuda" or value.startswith("cuda:")
    if isinstance(value, list | tuple):
        return any(is_cuda(v) for v in value)
    if isinstance(value, dict):
        return any(is_cuda(v) for v in value.values())
    return False


class CudaSentinel(TorchFunctionMode):
    """Raises CudaReached at the first torch call that makes or moves a tensor to a CUDA device, whether it
    names the device itself or gets it from a `with torch.device("cuda")` inside (that mode adds the device
    to the call before passing it down to this one)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is not torch.device and (is_cuda(args) or is_cuda(kwargs)):  # naming a device makes nothing
            raise CudaReached(f"{getattr(func, '__name__', func)} on a CUDA device")
        return func(*args, **kwargs)


def stub_cuda(monkeypatch: pytest.MonkeyPatch, gpu: FakeGpu | None = None) -> FakeGpu:
    """torch.cuda as on a machine with `gpu` (default: one H100), initialised, for the rest of the test."""
    gpu = gpu or FakeGpu()
    cuda, c = torch.cuda, torch._C
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: gpu.count)
    # Initialised: torch.cuda._lazy_init returns at once (it would raise "Torch not compiled with CUDA").
    monkeypatch.setattr(cuda, "_initialized", True)
    monkeypatch.setattr(cuda, "_is_in_bad_fork", lambda: False)
    monkeypatch.setattr(cuda, "_exchange_device", gpu.exchange)
    monkeypatch.setattr(cuda, "_maybe_exchange_device", gpu.exchange)
    monkeypatch.setattr(cuda, "_get_device_properties", gpu.properties, raising=False)
    # torch.manual_seed seeds every CUDA device's generator once CUDA is initialised: CPU generators stand in.
    monkeypatch.setattr(cuda, "default_generators", tuple(torch.Generator() for _ in range(gpu.count)))
    stubs = {
        "_cuda_getDeviceCount": lambda: gpu.count,
        "_cuda_setDevice": gpu.set_device,
        "_cuda_getDevice": lambda: gpu.current,
        "_cuda_synchronize": lambda: gpu.calls.append("synchronize"),
        "_cuda_memoryStats": gpu.memory_stats,
        "_cuda_resetPeakMemoryStats": gpu.reset_peak,
        "_cuda_resetAccumulatedMemoryStats": gpu.reset_accumulated,
        "_cuda_emptyCache": lambda: gpu.calls.append("emptyCache"),
        "_cuda_getArchFlags": lambda: "sm_90",
    }
    for name, fn in stubs.items():
        monkeypatch.setattr(c, name, fn, raising=False)
    return gpu
