"""MLflow's system metrics in a fit's run (lightning_modules/training/system_metrics.py): CPU and memory samples
land as `system/...` metrics of the run the logger writes, and a bad interval is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_modules.training.system_metrics import SystemMetrics
from main import main
from tests.training.helpers import args, only_run


@pytest.mark.slow
def test_a_fit_logs_system_metrics_into_its_run(
    tiny_shards: Path, mlflow_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")  # MLflow's own override of interval
    main(args("fit", tiny_shards, "mha", "--trainer.max_steps", "12"))
    client, run = only_run(mlflow_uri)
    names = set(run.data.metrics)
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= names, names
    samples = client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
    assert samples and all(0 <= s.value <= 100 * 64 for s in samples)
    assert "system/peak_cuda_memory_gib" not in names  # on the CPU


def test_a_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval=0: must be > 0 seconds"):
        SystemMetrics(interval=0)
