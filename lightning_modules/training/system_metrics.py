"""System metrics in a fit's MLflow run: MLflow's own monitor, and the peak CUDA memory of the fullest rank.

MLflow samples CPU, memory, disk and network (and GPU utilisation and memory where nvidia-ml-py is installed,
as on the GPU image) in a thread every `interval` seconds and logs them as `system/...` metrics, which its UI
charts on the run's "System metrics" tab. Lightning's MLFlowLogger never starts that monitor (it logs through
a client, not an active fluent run), so this callback does, on global rank 0, for the run the logger writes
(a resumed fit continues the monitor's step count). The monitor's writes go straight to the store, not through
the outage buffer (lightning_modules/tracking/buffer.py): when the store is away its thread stops with a
warning, and training goes on.

At the end of fit, on CUDA, every rank's `torch.cuda.max_memory_allocated` is reduced to the maximum and logged
as `system/peak_cuda_memory_gib`: the rank that would run out of memory first.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from lightning_modules.tracking.logger import BufferedMLFlowLogger

PEAK_CUDA_MEMORY = "system/peak_cuda_memory_gib"


class SystemMetrics(L.Callback):
    """interval: seconds between samples (MLflow's MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL overrides it);
    enabled: false turns the monitor off (the peak CUDA memory is still logged)."""

    def __init__(self, interval: float = 10.0, enabled: bool = True) -> None:
        if not interval > 0:
            raise ValueError(f"SystemMetrics interval={interval}: must be > 0 seconds")
        self.interval = interval
        self.enabled = enabled
        self._monitor: Any = None

    @staticmethod
    def _mlflow_logger(trainer: L.Trainer) -> BufferedMLFlowLogger | None:
        return next((lg for lg in trainer.loggers if isinstance(lg, BufferedMLFlowLogger)), None)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logger = self._mlflow_logger(trainer)
        if not self.enabled or logger is None or not trainer.is_global_zero:
            return
        # Public module of MLflow's system-metrics feature; imported here because mlflow is slow to import.
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self._monitor = SystemMetricsMonitor(
            logger.run_id,
            sampling_interval=self.interval,
            resume_logging=trainer.ckpt_path is not None,
            tracking_uri=logger.tracking_uri,
        )
        self._monitor.start()

    def _stop(self) -> None:
        if self._monitor is not None:
            self._monitor.finish()
            self._monitor = None

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._stop()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if pl_module.device.type != "cuda":
            return
        peak = torch.tensor(float(torch.cuda.max_memory_allocated(pl_module.device)), device=pl_module.device)
        fullest = trainer.strategy.reduce(peak, reduce_op="max")
        logger = self._mlflow_logger(trainer)
        if logger is not None and trainer.is_global_zero:
            logger.log_metrics({PEAK_CUDA_MEMORY: float(fullest) / 2**30}, step=trainer.global_step)
