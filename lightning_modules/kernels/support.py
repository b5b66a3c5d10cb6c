"""When a Triton kernel can run, and its launch.

Triton is an optional extra: without it every caller keeps its plain-torch path. A kernel runs on a CUDA
tensor, or on a CPU tensor under Triton's interpreter (TRITON_INTERPRET=1), which is how tests/kernels/ checks
the kernels on a machine without a GPU. Triton reads TRITON_INTERPRET when it jits a function, its own
library's functions (tl.sum, tl.max) included, so the variable must be set before triton is first imported
(tests/conftest.py does so on a machine without a GPU); this project's kernels are jitted on first launch.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

MODE_ENV = (
    "LRKV_FUSED_DECODE"  # "auto" (default): on CUDA; "0": never; "1": also on the CPU when interpreting
)


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def usable(t: Tensor) -> bool:
    """Whether the decode paths use a fused kernel for t: triton installed, and t a CUDA tensor (unless
    LRKV_FUSED_DECODE=0), or a CPU tensor with LRKV_FUSED_DECODE=1 under the interpreter (the tests' way)."""
    mode = os.environ.get(MODE_ENV, "auto")
    if mode == "0" or not triton_installed():
        return False
    if t.is_cuda:
        return True
    return mode == "1" and interpreting() and t.device.type == "cpu"


@functools.cache
def _jitted(fn: Callable[..., None], interpret: bool) -> Any:
    import triton  # optional dependency: imported only when a kernel is launched

    return triton.jit(fn)


def launch(fn: Callable[..., None], grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
    """fn[grid](*args, **meta), fn jitted for the current mode (compiled, or interpreted on the CPU)."""
    _jitted(fn, interpreting())[grid](*args, **meta)


def next_power_of_2(n: int, floor: int = 16) -> int:
    """Block widths: powers of 2 (Triton's aranges), at least `floor` (tl.dot's smallest tile)."""
    return max(floor, 1 << max(0, n - 1).bit_length())


def dot_dtype(dtype: torch.dtype) -> Any:
    """The tl dtype a kernel's products take their inputs in: the cache's (bf16 / fp16) on a GPU; fp32 for an
    fp32 cache, and under the interpreter, whose tl.dot misreads bf16 inputs (triton 3.9: bit patterns as ints)."""
    import triton.language as tl  # optional dependency: imported only when a kernel is launched

    if interpreting() or dtype == torch.float32:
        return tl.float32
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision: IEEE fp32 products for an fp32 cache (TF32 would round its inputs to 10 bits);
    for bf16 / fp16 inputs the products are exact and the setting is moot."""
    return "ieee" if dtype == torch.float32 else "tf32"
