"""The fused kernels compiled ahead of time for a real GPU, on a machine without one: what the hardware will check.
Needs triton (imported here at the top: this module is only imported where it is installed).

A kernel that passes Triton's interpreter can still fail to launch on an H100: the interpreter has no shared
memory, registers or local memory. Triton compiles for a target it is told (GPUTarget("cuda", 90, 32)) with the
ptxas and cuobjdump it ships, so the resources a launch needs are known on the CPU. `compile_launch` takes a
launch recorded by support.capture() from decode_step on `meta` tensors (the real shapes, strides and dtypes,
no memory) and specialises its arguments as Triton's JIT does at a launch (integers equal to 1 become
constants, pointers and multiples of 16 get divisibility hints), so what is compiled is what would run.

Reported per compile: dynamic shared memory (Triton's launch refuses more than the device's opt-in limit),
registers per thread, local memory per thread (register spills and stack; LOCAL + STACK in cuobjdump's words)
and compile seconds. tests/kernels/test_aot.py asserts the limits at every conf/model/ shape;
benchmarks/kernel_resources.py writes the table in BENCHMARKS.md.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import triton
from triton import knobs
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from lightning_modules.kernels.support import Launch


@dataclass(frozen=True)
class Target:
    """A GPU the kernels must launch on: Triton's target and the device's limits."""

    name: str
    arch: int  # compute capability as Triton writes it (90: H100 / H200)
    max_shared: int  # bytes of shared memory a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin)
    max_registers: int = 255  # per thread


# H100 and H200 are both sm_90 with 227 KB opt-in shared memory per block (NVIDIA's Hopper tuning guide);
# B200 (sm_100) keeps 227 KB.
SM90 = Target("sm_90 (H100, H200)", 90, 232_448)
SM100 = Target("sm_100 (B200)", 100, 232_448)


@dataclass(frozen=True)
class Resources:
    shared: int  # dynamic shared memory, bytes
    registers: int  # per thread
    local: int  # local memory per thread, bytes: spills and stack
    num_warps: int
    num_stages: int
    compile_s: float

    def problems(self, target: Target, max_local: int = 0) -> list[str]:
        """What would stop (shared, registers) or slow (local memory over max_local) a launch on target."""
        found = []
        if self.shared > target.max_shared:
            found.append(f"shared memory {self.shared:,} B > {target.max_shared:,} B")
        if self.registers > target.max_registers:
            found.append(f"{self.registers} registers > {target.max_registers}")
        if self.local > max_local:
            found.append(f"{self.local:,} B of local memory per thread (spills) > {max_local:,} B")
        return found


def specialise(launch: Launch) -> tuple[dict[str, str], dict[str, Any], dict[tuple[int, ...], Any]]:
    """(signature, constants, attributes) for launch's function, as the JIT would make them from its
    arguments at a launch."""

    names = list(_compilable(launch.fn).arg_names)
    signature: dict[str, str] = {}
    constants: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    options = {"num_warps", "num_stages", "num_ctas", "maxnreg"}
    given = {k: v for k, v in launch.meta.items() if k not in options}
    if len(launch.args) + len(given) != len(names):
        raise ValueError(
            f"{launch.fn.__name__}: {len(launch.args)} arguments and {sorted(given)} for {names}"
        )
    for i, name in enumerate(names):
        if name in given:
            signature[name], constants[name] = "constexpr", given[name]
            continue
        specialize = name not in launch.do_not_specialize
        kind, key = native_specialize_impl(CUDABackend, launch.args[i], False, specialize, specialize)
        if kind == "constexpr":
            signature[name], constants[name] = "constexpr", key
            continue
        signature[name] = kind
        hints = CUDABackend.parse_attr(key) if isinstance(key, str) else []
        if hints:
            attrs[(i,)] = hints
    return signature, constants, attrs


def compile_launch(launch: Launch, target: Target) -> Resources:
    """Compile launch's kernel for target (no GPU needed) and read the resources its binary declares."""

    signature, constants, attrs = specialise(launch)
    options = {k: launch.meta[k] for k in ("num_warps", "num_stages") if k in launch.meta}
    start = time.perf_counter()
    compiled = triton.compile(
        ASTSource(_compilable(launch.fn), signature, constants, attrs),
        target=GPUTarget("cuda", target.arch, 32),
        options=options,
    )
    seconds = time.perf_counter() - start
    usage = _resource_usage(compiled.asm["cubin"], launch.fn.__name__)
    return Resources(
        shared=int(compiled.metadata.shared),
        registers=usage["REG"],
        local=usage["LOCAL"] + usage["STACK"],
        num_warps=int(compiled.metadata.num_warps),
        num_stages=int(compiled.metadata.num_stages),
        compile_s=seconds,
    )


def _compilable(fn: Callable[..., None]) -> Any:
    """fn as a JITFunction, which triton.compile takes, even under TRITON_INTERPRET=1 (the tests' setting),
    where triton.jit would return an interpreted function instead."""

    return JITFunction(fn)


def compile_once(launch: Launch, target: Target, seen: dict[str, Resources]) -> Resources:
    """compile_launch, once per distinct specialisation and options (seen: the compiles so far)."""
    key = repr((specialise(launch), launch.meta.get("num_warps"), launch.meta.get("num_stages"), target))
    if key not in seen:
        seen[key] = compile_launch(launch, target)
    return seen[key]


def _resource_usage(cubin: bytes, function: str) -> dict[str, int]:
    """REG, STACK, SHARED, LOCAL of `function` in a cubin, from Triton's own cuobjdump."""

    cuobjdump = knobs.nvidia.cuobjdump.path
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        out = subprocess.run(
            [cuobjdump, "--dump-resource-usage", str(path)], capture_output=True, text=True, check=True
        ).stdout
    match = re.search(rf"Function {re.escape(function)}:\s*\n\s*(.+)", out)
    if match is None:
        raise RuntimeError(f"cuobjdump reported no resource usage for {function}:\n{out}")
    return {k: int(v) for k, v in re.findall(r"([A-Z]+):(\d+)", match.group(1))}
