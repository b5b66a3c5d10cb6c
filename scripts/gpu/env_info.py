"""Step 1 of scripts/gpu_check.py: the machine and the versions, as one JSON object on stdout.

nvidia-smi's own report goes to stderr (kept in the step's .stderr file), the fields that matter to the JSON.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from typing import Any

import torch

from lightning_modules.core.precision import cpu_name

SMI_FIELDS = "name,driver_version,memory.total,clocks.max.sm,power.limit,mig.mode.current"


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def nvidia_smi() -> str:
    """The query's CSV line per GPU; 'skipped: ...' without the tool."""
    if shutil.which("nvidia-smi") is None:
        return "skipped: nvidia-smi not on PATH"
    full = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=15)
    print(full.stdout, file=sys.stderr)
    query = ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"]
    done = subprocess.run(query, capture_output=True, text=True, timeout=15)
    return done.stdout.strip() or f"failed: {done.stderr.strip()[:200]}"


def cuda_info() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"cuda_device": "skipped: no CUDA device"}
    props = torch.cuda.get_device_properties(0)
    return {
        "cuda_device": props.name,
        "cuda_devices": torch.cuda.device_count(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        "sdpa_flash_enabled": torch.backends.cuda.flash_sdp_enabled(),
        "sdpa_efficient_enabled": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "sdpa_cudnn_enabled": torch.backends.cuda.cudnn_sdp_enabled(),
        "bf16_supported": torch.cuda.is_bf16_supported(),
    }


def main() -> None:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none (CPU build)",
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": version("triton"),
        "lightning": version("lightning"),
        "torchmetrics": version("torchmetrics"),
        "numpy": version("numpy"),
        "flash_attn": version("flash-attn"),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "nvidia_smi": nvidia_smi(),
        **cuda_info(),
    }
    print(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
