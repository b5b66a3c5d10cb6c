"""The fused kernels compiled ahead of time for the GPUs they will run on (lightning_modules/kernels/aot.py),
without a GPU: for the H100 / H200 (sm_90) at every size in conf/model/, for the B200 (sm_100) at the paper's
sizes, and every cache dtype a decode sends them (bf16, fp16; fp32 takes the plain path). The launch a
batch-64, 8K-context step records on meta tensors must fit the device's shared memory with no register spills
and compile in bounded time. benchmarks/kernel_resources.py compiles, as a child process (this one interprets
kernels); each compile's figures are printed (pytest -s).

The Triton that compiles is the one `make setup` pins (3.9.0, Makefile). The lent GPU machines' image carries
3.6.0, whose CPU interpreter fails on this project's numpy; BENCHMARKS.md, "Fused decode kernels", has the same
table compiled by 3.6.0 once by hand (every launch fits there too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_modules.core.fragments import CONF_DIR
from lightning_modules.kernels import support
from lightning_modules.model.launches import launches_at

if not support.triton_installed():  # make test installs it (the [triton] extra); elsewhere it is optional
    if os.environ.get("CI"):
        pytest.fail(
            "triton is not installed: the ahead-of-time kernel tests would be skipped in CI", pytrace=False
        )
    pytest.skip("triton not installed (pip install .[triton])", allow_module_level=True)

from lightning_modules.kernels import aot  # noqa: E402  (needs triton: after the skip above)

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_resources.py"
SIZES = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
PAPER_SIZES = ["128m", "1b", "2.5b", "6.3b"]  # Blackwell (sm_100) at the sizes a cluster trains
KERNELS = ("lrkv", "mla")
DTYPES = (torch.bfloat16, torch.float16)
COMPILE_S = 60.0  # per kernel; the first LRKV kernel took 20-30 s in bf16 and about 190 s in fp32


def _launches(
    size: str, kind: str, dtype: torch.dtype, batch: int = 64, context: int = 8192, max_len: int | None = None
) -> list[support.Launch]:
    return launches_at(size, kind, dtype, batch, context, max_len)


def _compile(*options: str) -> dict:
    """benchmarks/kernel_resources.py --json as a child without TRITON_INTERPRET: a process that interprets
    kernels (this one, tests/conftest.py) cannot compile them for a GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", *options],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "sizes"),
    [("sm_90", SIZES), ("sm_100", PAPER_SIZES)],
    ids=["h100-h200-every-size", "b200-paper-sizes"],
)
def test_every_kernel_fits_the_gpu_at_every_size(target: str, sizes: list[str]) -> None:
    found = _compile("--target", target, "--sizes", *sizes)
    rows = found["rows"]
    for row in rows:
        print(row)
    assert {(r["kernel"], r["size"], r["dtype"]) for r in rows} == {
        (k, s, d) for k in KERNELS for s in sizes for d in ("bf16", "fp16")
    }
    problems = [f"{r['kernel']} {r['size']} {r['dtype']}: {p}" for r in rows for p in r["problems"]]
    slow = [
        f"{r['kernel']} {r['size']} {r['dtype']}: {r['compile_s']} s"
        for r in rows
        if r["compile_s"] > COMPILE_S
    ]
    assert not problems and not slow, "\n".join(problems + slow)


@pytest.mark.slow
def test_the_check_sees_a_launch_that_would_not_fit() -> None:
    """A tile plan of 64 heads per program and 128-position blocks at 6.3b's latent: compiled for the H100 it
    needs more shared memory than the device has, and the check says so."""
    plan = "mla:HG=64,BLOCK_S=128,num_stages=3"
    found = _compile("--sizes", "6.3b", "--kernels", "mla", "--dtypes", "bf16", "--plan", plan)
    (row,) = found["rows"]
    assert any("shared memory" in p for p in row["problems"]), row


def test_a_bad_tile_plan_is_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--plan", "mla:WIDTH=3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "benchmarks/kernel_resources.py: error: --plan mla: unknown ['WIDTH']; known: "
        "['BLOCK_S', 'HG', 'num_stages', 'num_warps']"
    ]


def test_one_compile_serves_a_whole_generation() -> None:
    """The arguments that grow with a generation (length, positions per split) are not specialised on, so the
    JIT compiles each kernel once, not again whenever one becomes 1 or a multiple of 16 (the cache, and so its
    strides, is allocated once for the whole generation)."""
    for kind in KERNELS:
        keys = {
            repr(aot.specialise(launch))
            for context in (1, 2, 16, 17, 64, 65, 300, 1024)
            for launch in _launches("nano", kind, torch.bfloat16, batch=2, context=context, max_len=1024)
        }
        assert len(keys) == 1, f"{kind}: {len(keys)} compiles over one generation"


def test_launches_are_recorded_with_the_real_shapes() -> None:
    """What the compile check compiles is what decode_step passes at 128m: one head per program, every sequence,
    the cache's bf16 pointers."""
    (launch,) = _launches("128m", "lrkv", torch.bfloat16)
    assert launch.grid[0] == 6 and launch.grid[2] == 64
    meta = launch.meta
    assert (meta["H"], meta["DH"], meta["R"], meta["RP"]) == (6, 128, 46, 64)
    cache_pointers = [a for a in launch.args if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16]
    assert len(cache_pointers) == 5  # k_rot, sigma, l_k, v_s, l_v
    assert all(a.device.type == "meta" for a in cache_pointers)
