"""The fused kernels compiled ahead of time for a real GPU, on a machine without one: what the hardware will check.
Needs triton (imported here at the top: this module is only imported where it is installed).

A kernel that passes Triton's interpreter can still fail to launch on an H100: the interpreter has no shared
memory, registers or local memory. Triton compiles for a target it is told (GPUTarget("cuda", 90, 32)) with the
ptxas it ships, so the resources a launch needs are known on the CPU. `compile_launch` takes a
launch recorded by support.capture() from decode_step on `meta` tensors (the real shapes, strides and dtypes,
no memory) and specialises its arguments as Triton's JIT does at a launch (integers equal to 1 become
constants, pointers and multiples of 16 get divisibility hints), so what is compiled is what would run.

Reported per compile: dynamic shared memory (Triton's launch refuses more than the device's opt-in limit),
registers, register spills and stack frame per thread (ptxas -v on the kernel's PTX; a stack without spills is
sin / cos's rarely taken large-argument path) and compile seconds. tests/kernels/test_aot.py asserts the limits at every conf/model/ shape;
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
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend, get_ptxas, sm_arch_from_capability
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
    spills: int  # bytes of register spill stores per thread (ptxas -v)
    stack: (
        int  # stack frame per thread, bytes: spills, and local arrays such as sin / cos's large-argument path
    )
    num_warps: int
    num_stages: int
    compile_s: float

    def problems(self, target: Target) -> list[str]:
        """What would stop (shared memory, registers) or slow (register spills) a launch on target."""
        found = []
        if self.shared > target.max_shared:
            found.append(f"shared memory {self.shared:,} B > {target.max_shared:,} B")
        if self.registers > target.max_registers:
            found.append(f"{self.registers} registers > {target.max_registers}")
        if self.spills:
            found.append(f"{self.spills:,} B of register spills per thread")
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
    usage = _ptxas_usage(compiled.asm["ptx"], target)
    return Resources(
        shared=int(compiled.metadata.shared),
        registers=usage["registers"],
        spills=usage["spills"],
        stack=usage["stack"],
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


def _ptxas_usage(ptx: str, target: Target) -> dict[str, int]:
    """Registers, stack frame and spill stores per thread, as Triton's own ptxas reports them (-v) when it
    assembles the kernel's PTX for target (the same assembler and architecture triton.compile used)."""
    arch = sm_arch_from_capability(target.arch)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        done = subprocess.run(
            [
                get_ptxas(target.arch).path,
                "-v",
                f"--gpu-name={arch}",
                str(source),
                "-o",
                str(Path(tmp) / "k.cubin"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    log = done.stderr + done.stdout
    found = {
        "registers": re.search(r"Used (\d+) registers", log),
        "stack": re.search(r"(\d+) bytes stack frame", log),
        "spills": re.search(r"(\d+) bytes spill stores", log),
    }
    missing = [k for k, m in found.items() if m is None]
    if missing:
        raise RuntimeError(f"ptxas -v reported no {missing}:\n{log}")
    return {k: int(m.group(1)) for k, m in found.items() if m is not None}
