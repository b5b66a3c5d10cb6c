"""The fused decode kernels compiled for a GPU without one, and the bytes and FLOPs a decode step moves.

    python benchmarks/kernel_resources.py                        # every size, both kernels, bf16 and fp16, sm_90
    python benchmarks/kernel_resources.py --sizes 128m 1b --json
    python benchmarks/kernel_resources.py --sizes 6.3b --kernels mla --plan mla:HG=32,BLOCK_S=64  # try a tile plan
    python benchmarks/kernel_resources.py --traffic              # bytes, FLOPs and HBM-bound time per step

Compile table: for each size in conf/model/, kernel and cache dtype, the launch a decode step makes at
--batch and --context is recorded on meta tensors (lightning_modules/model/launches.py) and compiled for the
target with Triton's own ptxas (lightning_modules/kernels/aot.py), each distinct compile once, in a fresh
Triton cache so compile times are real. Reported: dynamic shared memory against the device's limit,
registers, register spills and stack frame per thread (ptxas -v), warps, pipeline stages, compile seconds. It runs with
TRITON_INTERPRET unset (an interpreting process cannot compile for a GPU): tests/kernels/test_aot.py runs
this script as a child for that reason.

Traffic table (--traffic): per decode step at --batch and --context, every layer: the cache bytes read from
HBM (each cached element once), the weights (bf16, once per step), the extra rows a kernel re-reads from L2
(lrkv: the shared key and value once per head; mla: the latent once per group of 16 heads), the attention's
context-dependent FLOPs (lightning_modules/costs/counts.py's decode count), and the HBM-bound time at the
data sheet's bandwidth (lightning_modules/costs/step_time.py's devices) against MHA's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file from anywhere

import torch  # noqa: E402

from lightning_modules.core.errors import UserError, run_entry  # noqa: E402
from lightning_modules.core.fragments import CONF_DIR, fragment  # noqa: E402
from lightning_modules.costs import counts  # noqa: E402
from lightning_modules.costs.step_time import H100, H200  # noqa: E402
from lightning_modules.kernels import support  # noqa: E402
from lightning_modules.model.attention import as_resolved, load_configs, names  # noqa: E402
from lightning_modules.model.launches import launches_at  # noqa: E402

SIZES = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def parse_plans(texts: list[str]) -> dict[str, dict[str, int]]:
    """--plan kernel:KEY=VALUE,... -> {kernel: overrides}."""
    plans: dict[str, dict[str, int]] = {}
    for text in texts:
        kernel, _, body = text.partition(":")
        if kernel not in support.KERNELS or not body:
            raise UserError(
                f"--plan {text!r}: write kernel:KEY=VALUE,... with kernel one of {list(support.KERNELS)}"
            )
        try:
            plans[kernel] = {k: int(v) for k, v in (item.split("=", 1) for item in body.split(","))}
        except ValueError:
            raise UserError(
                f"--plan {text!r}: each override is KEY=INTEGER, e.g. mla:HG=16,BLOCK_S=32"
            ) from None
    return plans


def apply_plans(plans: dict[str, dict[str, int]]) -> None:
    """Override tile plans for this process: mla's plan() keys, lrkv's BLOCK / NUM_WARPS / NUM_STAGES."""
    if "mla" in plans:
        from lightning_modules.kernels import mla_decode

        base = mla_decode.plan
        extra = plans["mla"]
        unknown = set(extra) - set(base(1, 16))
        if unknown:
            raise UserError(f"--plan mla: unknown {sorted(unknown)}; known: {sorted(base(1, 16))}")
        mla_decode.plan = lambda n_head, d_c: {**base(n_head, d_c), **extra}  # type: ignore[assignment]
    if "lrkv" in plans:
        from lightning_modules.kernels import lrkv_decode

        known = {"BLOCK", "NUM_WARPS", "NUM_STAGES"}
        unknown = set(plans["lrkv"]) - known
        if unknown:
            raise UserError(f"--plan lrkv: unknown {sorted(unknown)}; known: {sorted(known)}")
        for key, value in plans["lrkv"].items():
            setattr(lrkv_decode, key, value)


def compile_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from lightning_modules.kernels import aot  # needs triton

    target = {"sm_90": aot.SM90, "sm_100": aot.SM100}[args.target]
    seen: dict[str, aot.Resources] = {}
    rows = []
    for size in args.sizes:
        for kernel in args.kernels:
            for name in args.dtypes:
                for launch in launches_at(size, kernel, DTYPES[name], args.batch, args.context):
                    found = aot.compile_once(launch, target, seen)
                    rows.append(
                        {
                            "kernel": kernel,
                            "size": size,
                            "dtype": name,
                            "grid": list(launch.grid),
                            "shared": found.shared,
                            "registers": found.registers,
                            "spills": found.spills,
                            "stack": found.stack,
                            "num_warps": found.num_warps,
                            "num_stages": found.num_stages,
                            "compile_s": round(found.compile_s, 2),
                            "problems": found.problems(target),
                        }
                    )
                    if not args.json:
                        print(markdown_row(rows[-1]), flush=True)
    return rows


def markdown_row(row: dict[str, Any]) -> str:
    verdict = "; ".join(row["problems"]) or "fits"
    return (
        f"| {row['kernel']} | {row['size']} | {row['dtype']} | {row['shared']:,} | {row['registers']} | "
        f"{row['spills']} | {row['stack']} | {row['num_warps']} / {row['num_stages']} | {row['compile_s']:.1f} | {verdict} |"
    )


def traffic_rows(sizes: list[str], batch: int, context: int) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        mha_seconds = 0.0
        for kind in names():  # mha first: the others are read against it
            model, attention = load_configs([fragment("model", size), fragment("attention", kind)])
            resolved = as_resolved(model, attention)
            knobs = resolved[2]
            params = counts.param_counts(model, resolved)
            cache = batch * context * counts.kv_cache_bytes_per_token(model, resolved)
            weights = 2 * params.total
            flops = batch * (
                counts.decode_flops_per_token(model, resolved, context)
                - counts.decode_flops_per_token(model, resolved, 0)
            )
            H, dh = model.n_head, model.head_dim
            if kind == "lrkv":  # k_rot and v_s read by each head's program; the first read is the cache's
                l2 = batch * context * model.n_layer * (H - 1) * 2 * dh * 2
            elif kind == "mla":  # the latent read by each group of 16 heads (kernels/mla_decode.py)
                groups = -(-H // 16)
                l2 = (
                    batch
                    * context
                    * model.n_layer
                    * (groups - 1)
                    * (knobs.kv_latent_dim + knobs.rope_head_dim)
                    * 2
                )
            else:
                l2 = 0
            seconds = {d.name: (cache + weights) / d.hbm_bytes_per_s for d in (H100, H200)}
            if kind == "mha":
                mha_seconds = seconds[H100.name]
            rows.append(
                {
                    "size": size,
                    "attention": kind,
                    "cache_mb": cache / 1e6,
                    "weights_mb": weights / 1e6,
                    "l2_rereads_mb": l2 / 1e6,
                    "attention_gflop": flops / 1e9,
                    "flop_per_cache_byte": flops / cache,
                    "h100_ms": 1e3 * seconds[H100.name],
                    "h200_ms": 1e3 * seconds[H200.name],
                    "vs_mha": seconds[H100.name] / mha_seconds if mha_seconds else float("nan"),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="+", default=SIZES, choices=SIZES)
    parser.add_argument("--kernels", nargs="+", default=list(support.KERNELS), choices=support.KERNELS)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--target", default="sm_90", choices=["sm_90", "sm_100"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument(
        "--plan", action="append", default=[], help="kernel:KEY=VALUE,... overrides a tile plan"
    )
    parser.add_argument(
        "--traffic", action="store_true", help="the bytes and FLOPs table instead of compiles"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.context < 1:
        parser.error("--batch and --context must be >= 1")
    stamp = (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.processor() or platform.machine()}"
    )
    if args.traffic:
        rows = traffic_rows(
            [s for s in args.sizes if s in ("128m", "1b")] or args.sizes, args.batch, args.context
        )
        if args.json:
            print(json.dumps(rows))
            return 0
        print(f"{stamp}; batch {args.batch}, context {args.context}; bf16 cache and weights")
        print("| size | attention | cache MB | weights MB | L2 re-reads MB | attention GFLOP | FLOP / cache byte | "
              "H100 ms | H200 ms | vs mha |")  # fmt: skip
        print("|" + "---|" * 10)
        for r in rows:
            print(
                f"| {r['size']} | {r['attention']} | {r['cache_mb']:,.0f} | {r['weights_mb']:,.0f} | "
                f"{r['l2_rereads_mb']:,.0f} | {r['attention_gflop']:,.1f} | {r['flop_per_cache_byte']:.1f} | "
                f"{r['h100_ms']:.2f} | {r['h200_ms']:.2f} | {r['vs_mha']:.2f}x |"
            )
        return 0
    if not support.triton_installed():
        raise UserError("triton is not installed: pip install .[triton] (make setup does)")
    if support.interpreting():
        raise UserError(
            "TRITON_INTERPRET is set: a process that interprets kernels cannot compile them; unset it"
        )
    apply_plans(parse_plans(args.plan))
    import triton

    # Every compile timed from scratch; FP fusion on, as Triton compiles by default (3.6 on the GPU image;
    # 3.9 warns that its default will change).
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-aot-")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    if not args.json:
        print(
            f"{stamp}; triton {triton.__version__}; target {args.target}; batch {args.batch}, context {args.context}"
        )
        print(
            "| kernel | size | dtype | shared B | registers | spills B | stack B | warps / stages | compile s | verdict |"
        )
        print("|" + "---|" * 10)
    rows = compile_rows(args)
    if args.json:
        print(json.dumps({"triton": triton.__version__, "target": args.target, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(run_entry(main, "benchmarks/kernel_resources.py"))
