"""Tokens per second and model FLOPs utilisation, logged every training step.

MFU = achieved training FLOPs per second (lightning_modules/costs/counts.py convention) / the device's peak dense bf16 rate from our
own table (docs/costs.md, "MFU": never the sparsity figure). On a device not in the table MFU is not logged, and the
run says so once.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import lightning as L
import torch

log = logging.getLogger(__name__)

# Peak dense bf16 FLOP/s per device (vendor datasheets, dense, no sparsity).
PEAK_BF16_FLOPS: dict[str, float] = {
    "H100": 989e12,
    "H200": 989e12,
    "GH200": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 70e12,
    "RTX 4090": 165e12,
}


def device_peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of one device of this kind, or None when we do not know it (CPUs included)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in sorted(PEAK_BF16_FLOPS.items(), key=lambda kv: -len(kv[0])):  # GH200 before H200
        if key in name:
            return peak
    return None


class ThroughputMonitor(L.Callback):
    """Logs train/tokens_per_s (all ranks) and train/mfu from the wall time between optimizer steps."""

    def __init__(self) -> None:
        self._last: float | None = None
        self._tokens_at_last = 0
        self._flops_at_last = 0.0
        self._peak: float | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._peak = device_peak_flops(pl_module.device)
        if self._peak is None:
            log.info("MFU not logged: no peak bf16 rate known for device %s", pl_module.device)
        self._last = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last = None  # the next step's interval would include validation time

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        now = time.perf_counter()
        if self._last is not None and now > self._last:
            elapsed = now - self._last
            tokens_per_s = (pl_module.tokens_seen - self._tokens_at_last) / elapsed
            pl_module.log("train/tokens_per_s", tokens_per_s)
            if self._peak is not None:
                flops_per_s = (pl_module.flops_seen - self._flops_at_last) / elapsed
                pl_module.log("train/mfu", flops_per_s / (self._peak * trainer.world_size))
        self._last = now
        self._tokens_at_last = pl_module.tokens_seen
        self._flops_at_last = pl_module.flops_seen
