"""The default precision against forced fp32 (and forced bf16) on this CPU: a nano fit through main.py.

    python benchmarks/precision.py [--attention mha] [--steps 30] [--bf16-steps 6] [--json]

Prints the CPU, whether it has native bf16, the precision the CLI chose, and tokens/s of the default fit,
of the same fit forced to 32-true and forced to bf16-mixed (fewer steps: on a CPU without native bf16 it is
tens of times slower). Target: default / fp32 >= 0.8 on a CPU without native bf16; on one with it the
default is bf16-mixed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_overhead import lightning_tokens_per_s  # noqa: E402

from lightning_modules.core import precision  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--attention", default="mha")
    parser.add_argument("--steps", type=int, default=30, help="timed steps of the default and fp32 fits")
    parser.add_argument(
        "--bf16-steps", type=int, default=6, help="timed steps of the forced-bf16 fit (0: skip)"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--data-dir", default=str(ROOT / "artifacts/shakespeare"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    hardware = precision.detect("cpu")
    chosen = precision.choose(None, hardware)
    default, _ = lightning_tokens_per_s(args.attention, args.steps, args.warmup, args.data_dir, None)
    fp32, _ = lightning_tokens_per_s(args.attention, args.steps, args.warmup, args.data_dir, precision.FP32)
    row: dict[str, object] = {
        "cpu": hardware.name,
        "hardware": hardware.capability,
        "threads": torch.get_num_threads(),
        "default_precision": chosen.precision,
        "default_tokens_per_s": round(default, 1),
        "fp32_tokens_per_s": round(fp32, 1),
        "default_vs_fp32": round(default / fp32, 3),
    }
    if args.bf16_steps:
        bf16, _ = lightning_tokens_per_s(
            args.attention, args.bf16_steps, min(args.warmup, 1), args.data_dir, precision.BF16
        )
        row["bf16_tokens_per_s"] = round(bf16, 1)
        row["bf16_vs_fp32"] = round(bf16 / fp32, 3)
    print(json.dumps(row) if args.json else "\n".join(f"{k}: {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
