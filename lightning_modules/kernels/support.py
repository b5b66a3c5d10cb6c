"""When a Triton kernel runs, its launch, and the plain-torch fallback when it cannot.

Triton is an optional extra: without it every caller keeps its plain-torch path. A kernel runs on a CUDA
tensor, or on a CPU tensor under Triton's interpreter (TRITON_INTERPRET=1), which is how tests/kernels/ checks
the kernels on a machine without a GPU. Triton reads TRITON_INTERPRET when it jits a function, its own
library's functions (tl.sum, tl.max) included, so the variable must be set before triton is first imported
(tests/conftest.py does so on a machine without a GPU); this project's kernels are jitted on first launch.

The switch, one per kernel (LRKV_FUSED_DECODE):
    auto (default)   every kernel, on CUDA tensors
    0                none
    1                every kernel, and on the CPU too when interpreting (the tests' way)
    lrkv / mla / ... only the kernels named (comma-separated), on CUDA or interpreted on the CPU

Caches in fp32 always take the plain path: the kernels are built for bf16 / fp16 caches, which is what a GPU
decodes with; an fp32 kernel would double the shared memory and the bytes for a cache nobody serves from.

A kernel that the device cannot launch (Triton's OutOfResources, a compile or ptxas error) is not fatal:
`attempt` warns once, naming the kernel and why, switches that kernel off for the process, and the caller
takes its plain path. kernels/aot.py checks ahead of time, for the real GPU targets, that this never happens
at the shapes in conf/model/.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import Tensor

MODE_ENV = "LRKV_FUSED_DECODE"
KERNELS = ("lrkv", "mla")  # the kernel names the switch accepts (attention classes' fused_decode_kernel)
CACHE_DTYPES = (torch.bfloat16, torch.float16)  # the caches a kernel reads; fp32 takes the plain path

# Kernels switched off in this process after a launch failed, with why (see attempt).
disabled: dict[str, str] = {}

T = TypeVar("T")


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _switched_on(kernel: str) -> tuple[bool, bool]:
    """(this kernel is on, the CPU may run it under the interpreter), from LRKV_FUSED_DECODE."""
    mode = os.environ.get(MODE_ENV, "auto").strip()
    if mode in ("auto", ""):
        return True, False
    if mode == "0":
        return False, False
    if mode == "1":
        return True, True
    names = {n.strip() for n in mode.split(",") if n.strip()}
    unknown = names - set(KERNELS)
    if unknown:
        raise ValueError(
            f"{MODE_ENV}={mode!r}: unknown kernel {sorted(unknown)}; use auto, 0, 1 or names from {list(KERNELS)}"
        )
    return kernel in names, True


def usable(kernel: str, t: Tensor, cache_dtype: torch.dtype) -> bool:
    """Whether a decode path uses the fused kernel `kernel` for query-side tensor t and a cache of cache_dtype:
    triton installed, the kernel switched on and not disabled by a failed launch, a bf16 / fp16 cache, and t a
    CUDA tensor (or a CPU tensor under the interpreter when the switch allows it, or a meta tensor while
    launches are captured)."""
    if kernel not in KERNELS:
        raise ValueError(f"no fused kernel named {kernel!r}; kernels: {list(KERNELS)}")
    on, cpu_ok = _switched_on(kernel)
    if not on or kernel in disabled or cache_dtype not in CACHE_DTYPES or not triton_installed():
        return False
    if t.is_cuda:
        return True
    if t.device.type == "meta":  # shapes without memory: only to record a launch (capture)
        return _captured is not None
    return cpu_ok and interpreting() and t.device.type == "cpu"


def _launch_failures() -> tuple[type[BaseException], ...]:
    """Triton's errors for a kernel the device cannot run: too much shared memory or registers, or a compile
    (MLIR / ptxas) failure for the device's architecture."""
    from triton.compiler.errors import CompilationError  # optional dependency: only once a kernel ran
    from triton.runtime.errors import OutOfResources, PTXASError

    return (OutOfResources, CompilationError, PTXASError)


def attempt(kernel: str, run: Callable[[], T]) -> T | None:
    """run() (a fused path), or None after one warning when the device cannot launch the kernel: the caller
    then takes its plain path, and so does every later call in this process."""
    try:
        return run()
    except _launch_failures() as error:
        why = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        disabled[kernel] = f"{type(error).__name__}: {why}"
        warnings.warn(
            f"fused {kernel} decode kernel cannot run on this device ({disabled[kernel]}); "
            f"using the plain-torch decode instead ({MODE_ENV}=0 silences this)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


@dataclass
class Launch:
    """One kernel launch as decode_step would make it: the function, grid, arguments and compile options."""

    fn: Callable[..., None]
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    do_not_specialize: tuple[str, ...] = ()


_captured: list[Launch] | None = None


@contextlib.contextmanager
def capture() -> Iterator[list[Launch]]:
    """Record launches instead of running them: decode_step on `meta` tensors then yields exactly the launch
    it would make at real shapes, which kernels/aot.py compiles for a GPU target without a GPU."""
    global _captured
    outer, _captured = _captured, []
    try:
        yield _captured
    finally:
        _captured = outer


@functools.cache
def _jitted(fn: Callable[..., None], interpret: bool, do_not_specialize: tuple[str, ...]) -> Any:
    import triton  # optional dependency: imported only when a kernel is launched

    return triton.jit(fn, do_not_specialize=do_not_specialize)


def launch(
    fn: Callable[..., None],
    grid: tuple[int, ...],
    *args: Any,
    do_not_specialize: tuple[str, ...] = (),
    **meta: Any,
) -> None:
    """fn[grid](*args, **meta), fn jitted for the current mode (compiled, or interpreted on the CPU).
    do_not_specialize: integer arguments that change from call to call (a decode's length): the JIT would
    otherwise compile again when one becomes 1 or a multiple of 16."""
    if _captured is not None:
        _captured.append(Launch(fn, grid, args, meta, do_not_specialize))
        return
    _jitted(fn, interpreting(), do_not_specialize)[grid](*args, **meta)


def next_power_of_2(n: int, floor: int = 16) -> int:
    """Block widths: powers of 2 (Triton's aranges), at least `floor` (tl.dot's smallest tile)."""
    return max(floor, 1 << max(0, n - 1).bit_length())


def dot_dtype(dtype: torch.dtype) -> Any:
    """The tl dtype a kernel's products take their inputs in: the cache's (bf16 / fp16) on a GPU, as flash-attn's
    are; fp32 under the interpreter, whose tl.dot misreads bf16 inputs (triton 3.9: bit patterns as ints)."""
    import triton.language as tl  # optional dependency: imported only when a kernel is launched

    if interpreting() or dtype == torch.float32:
        return tl.float32
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision: IEEE fp32 products for fp32 inputs (TF32 would round them to 10 bits); for
    bf16 / fp16 inputs the products are exact and the setting is moot."""
    return "ieee" if dtype == torch.float32 or interpreting() else "tf32"
