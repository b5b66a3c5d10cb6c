"""`python -m lightning_modules mlflow-ui [--port N] [--dry-run]` (make mlflow-ui): the MLflow UI on the store
the project uses (MLFLOW_TRACKING_URI if set, else ./mlruns' SQLite store; lightning_modules/tracking/store.py).

It prints the link that opens the project's experiment in the UI's model-training view (why the link:
lightning_modules/tracking/ui.py), then starts `mlflow ui` on an SQLite store; a tracking server already
serves its UI, so for one the link points at it and nothing is started. `--dry-run` prints the command it
would run instead of running it.
"""

from __future__ import annotations

import argparse
import shlex

from lightning_modules.core.errors import run_entry
from lightning_modules.tracking import ui

PROG = "mlflow_ui"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_modules mlflow-ui",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--port", type=int, default=ui.PORT, help=f"port of the UI it starts (default {ui.PORT})"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    args = parser.parse_args(argv)
    return run_entry(lambda: _ui(args), PROG)


def _ui(args: argparse.Namespace) -> int:
    plan = ui.ui_plan(port=args.port)
    print(f"MLflow UI: {plan.link}")
    if plan.command is None:
        print(f"the tracking server {plan.store} serves it already (MLFLOW_TRACKING_URI); nothing started")
        return 0
    if args.dry_run:
        print(f"would run: {shlex.join(plan.command)}")
        return 0
    print(f"serving {plan.store} (Ctrl-C stops it)")
    ui.serve(plan)
