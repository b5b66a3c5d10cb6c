"""Tokens per second and model FLOPs utilisation, measured over windows of training steps.

MFU = achieved training FLOPs per second (lightning_modules/costs/counts.py convention: causal attention's
scores and mixing counted over the full T^2, not halved) / the device's peak dense bf16 rate from our own
table (docs/costs.md, "MFU": never the sparsity figure). `train/mfu_causal_half` counts that attention term
over half the context instead (the convention of FlashAttention's benchmarks), so the two bracket what the
hardware did. The table is keyed by the exact name torch.cuda.get_device_name reports: a part missing from
it (or a MIG slice) logs no MFU and says so once; LRKV_PEAK_FLOPS sets the peak by hand.

The wall time is read once per window of `every_n_steps` optimizer steps (default: the trainer's
log_every_n_steps, the steps Lightning logs anyway): reading it needs a host-device sync, and a sync every
step would stop the host from queueing the next step's kernels while the device runs this one's.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import lightning as L
import torch

from lightning_modules.core.errors import ConfigError
from lightning_modules.costs import counts as costs
from lightning_modules.model.attention import AttentionConfig, Resolved, as_resolved
from lightning_modules.model.config import ModelConfig
from lightning_modules.training import host_sync

log = logging.getLogger(__name__)

PEAK_ENV = "LRKV_PEAK_FLOPS"  # FLOP/s of one device, e.g. 989.4e12: overrides the table, any device

# Peak dense bf16 Tensor Core FLOP/s (FP32 accumulate), keyed by torch.cuda.get_device_name as normalised by
# _normalise. Each is half the "with sparsity" figure of NVIDIA's data sheet named beside it (the data sheets
# print the 2:4-sparse rate and say dense is half).
PEAK_BF16_FLOPS: dict[str, float] = {
    "NVIDIA H100 80GB HBM3": 989.4e12,  # H100 SXM5: NVIDIA H100 Tensor Core GPU data sheet, 1,979 sparse
    "NVIDIA H100 PCIe": 756e12,  # same data sheet, PCIe column: 1,513 sparse
    "NVIDIA H100 NVL": 835.5e12,  # same data sheet, NVL column: 1,671 sparse (check: older sheets, per pair)
    "NVIDIA H200": 989.4e12,  # H200 SXM: NVIDIA H200 Tensor Core GPU data sheet, 1,979 sparse
    "NVIDIA H200 NVL": 835.5e12,  # same data sheet, NVL column: 1,671 sparse (check)
    "NVIDIA GH200 480GB": 989.4e12,  # NVIDIA GH200 Grace Hopper Superchip data sheet, 1,979 sparse
    "NVIDIA GH200 144G HBM3e": 989.4e12,  # same data sheet, HBM3e part
    "NVIDIA B200": 2250e12,  # NVIDIA HGX B200 data sheet, per GPU: 4.5 PFLOPS sparse (check)
    "NVIDIA A100-SXM4-40GB": 312e12,  # NVIDIA A100 Tensor Core GPU data sheet: 624 sparse, every A100
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-PCIE-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA L40S": 362.05e12,  # NVIDIA L40S data sheet: 733 sparse
    "NVIDIA A10": 125e12,  # NVIDIA A10 Tensor Core GPU data sheet: 250 sparse
    "NVIDIA GeForce RTX 4090": 165.2e12,  # NVIDIA Ada GPU Architecture whitepaper, FP32 accumulate
}


def _normalise(name: str) -> str:
    """Case and runs of spaces only: "H100 PCIe" and "H100 80GB HBM3" stay different names."""
    return " ".join(name.split()).casefold()


_PEAKS = {_normalise(name): peak for name, peak in PEAK_BF16_FLOPS.items()}
_warned: set[str] = set()


def peak_for_name(name: str) -> float | None:
    """The table's peak for this exact device name (case and spacing aside), else None."""
    return _PEAKS.get(_normalise(name))


def env_peak() -> float | None:
    """LRKV_PEAK_FLOPS as FLOP/s, or None when unset."""
    text = os.environ.get(PEAK_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{PEAK_ENV}={text}: give one device's peak dense bf16 FLOP/s, e.g. 989.4e12")
    return value


def device_peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of one device of this kind: LRKV_PEAK_FLOPS if set, else the table's entry for
    the device's exact name, else None (CPUs included), with a warning once per unknown GPU name."""
    override = env_peak()
    if override is not None:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = peak_for_name(name)
    if peak is None and name not in _warned:
        _warned.add(name)
        log.warning(
            "MFU not reported: no peak bf16 rate known for %r. Add its dense (not sparse) bf16 FLOP/s from "
            "NVIDIA's data sheet to PEAK_BF16_FLOPS in lightning_modules/training/throughput.py, or set "
            "%s=<FLOP/s>",
            name,
            PEAK_ENV,
        )
    return peak


def causal_half_flops_per_token(
    model: ModelConfig, attention: AttentionConfig | Resolved, tokens_per_forward: int | None = None
) -> float:
    """Training FLOPs per token with attention's scores and mixing counted over T / 2 instead of T: the
    full count (costs.train_flops_per_token) less half of its 3 x 2 L T H (d_qk + d_v) term."""
    cls, knobs = as_resolved(model, attention)[1:]
    d_qk, d_v = cls.score_dims(model, knobs)
    scores = 3 * model.n_layer * 2 * model.seq_len * model.n_head * (d_qk + d_v)
    return costs.train_flops_per_token(model, attention, tokens_per_forward) - scores / 2


class ThroughputMonitor(L.Callback):
    """Logs train/tokens_per_s (all ranks), train/mfu and train/mfu_causal_half, each over the window of
    steps since the last measurement, every `every_n_steps` optimizer steps (None: log_every_n_steps)."""

    def __init__(self, every_n_steps: int | None = None) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ConfigError(f"ThroughputMonitor every_n_steps={every_n_steps}: must be >= 1 (or null)")
        self.every_n_steps = every_n_steps
        self._last: float | None = None
        self._excluded = 0.0  # seconds of validation inside the current window
        self._validation_start: float | None = None
        self._tokens_at_last = 0
        self._flops_at_last = 0.0
        self._peak: float | None = None
        self._causal_share: dict[int, float] = {}
        self._global_step = -1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._peak = device_peak_flops(pl_module.device)
        self._last, self._global_step = None, trainer.global_step

    def _sync(self, pl_module: L.LightningModule) -> float:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._last is not None:  # validation syncs anyway: time it, to leave it out of the window
            self._validation_start = self._sync(pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._validation_start is not None:
            self._excluded += self._sync(pl_module) - self._validation_start
            self._validation_start = None

    def causal_share(self, pl_module: Any, tokens_per_forward: int) -> float:
        """Causal-half FLOPs / counted FLOPs for this micro-batch size (a constant of the run)."""
        if tokens_per_forward not in self._causal_share:
            half = causal_half_flops_per_token(pl_module.arch, pl_module.resolved, tokens_per_forward)
            self._causal_share[tokens_per_forward] = half / pl_module.flops_per_token(tokens_per_forward)
        return self._causal_share[tokens_per_forward]

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stepped = trainer.global_step != self._global_step  # the optimizer stepped: not mid-accumulation
        self._global_step = trainer.global_step
        if not stepped or not host_sync.due(trainer, self.every_n_steps):
            return
        now = self._sync(pl_module)
        elapsed = now - self._last - self._excluded if self._last is not None else 0.0
        if elapsed > 0:
            tokens_per_s = (pl_module.tokens_seen - self._tokens_at_last) / elapsed
            pl_module.log("train/tokens_per_s", tokens_per_s)
            if self._peak is not None:
                flops_per_s = (pl_module.flops_seen - self._flops_at_last) / elapsed
                mfu = flops_per_s / (self._peak * trainer.world_size)
                pl_module.log("train/mfu", mfu)
                share = self.causal_share(pl_module, batch[:, 1:].numel())
                pl_module.log("train/mfu_causal_half", mfu * share)
        self._last, self._excluded = now, 0.0
        self._tokens_at_last = pl_module.tokens_seen
        self._flops_at_last = pl_module.flops_seen
