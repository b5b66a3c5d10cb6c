"""`python -m lightning_modules.mlflow_ui`: the link to the project's experiment in the MLflow UI's model-training
view (make mlflow-ui prints it, then serves the UI; why the link: lightning_modules/tracking/ui.py)."""

from __future__ import annotations

import warnings

from lightning_modules.tracking.store import EXPERIMENT, tracking_uri
from lightning_modules.tracking.ui import ui_url


def main() -> int:
    """Print the link to the project's experiment in the model-training view."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from mlflow import MlflowClient  # late and quiet: mlflow warns while it imports

    experiment = MlflowClient(tracking_uri()).get_experiment_by_name(EXPERIMENT)
    print(f"MLflow UI: {ui_url(experiment.experiment_id if experiment else None)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
