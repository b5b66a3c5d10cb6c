"""Step 2 of scripts/gpu_check.py: the bf16 matrix-product ceiling and the device copy bandwidth, as JSON.

On a GPU: an 8192^3 bf16 matmul (TFLOP/s = 2 n^3 / time) and a 1 GiB device-to-device copy (GB/s counts the
bytes read plus the bytes written), each the median of repeats timed with CUDA events after a warm-up, with
the peak that MFU divides by (lightning_modules/training/throughput.py's table) beside the GEMM figure: MFU
targets are only as good as that peak. With --dry-run: the same code on the CPU at tiny sizes, timed with the
wall clock; what needs CUDA is reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from lightning_modules.training.throughput import device_peak_flops


def median_seconds(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
        else:
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def gemm(device: torch.device, n: int, repeats: int) -> dict[str, Any]:
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    seconds = median_seconds(lambda: a @ b, device, repeats)
    tflops = 2 * n**3 / seconds / 1e12
    peak = device_peak_flops(device)
    return {
        "gemm_n": n,
        "gemm_bf16_tflops": float(f"{tflops:.4g}"),  # 4 digits: a CPU at the dry run's size is far below 0.01
        "table_peak_bf16_tflops": round(peak / 1e12, 1) if peak else None,
        "gemm_vs_table_peak": round(tflops * 1e12 / peak, 3) if peak else None,
    }


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int) -> dict[str, Any]:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), device, repeats)
    return {"copy_mib": nbytes // 2**20, "copy_gb_per_s": round(2 * nbytes / seconds / 1e9, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    args = parser.parse_args()
    if args.dry_run or not torch.cuda.is_available():
        cpu = torch.device("cpu")
        result = {"device": "cpu", **gemm(cpu, 256, 3), **copy_bandwidth(cpu, 16 * 2**20, 3)}
        result["cuda"] = "skipped: no CUDA device (dry run: a 256^3 CPU matmul and a 16 MiB copy instead)"
    else:
        cuda = torch.device("cuda")
        result = {"device": torch.cuda.get_device_name(cuda), **gemm(cuda, 8192, 20)}
        result.update(copy_bandwidth(cuda, 2**30, 20))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
