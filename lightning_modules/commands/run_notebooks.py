"""Execute the analysis notebooks headless and collect their figures: `make notebooks` runs this.

    python -m lightning_modules notebooks [--tracking-uri URI] [--experiment NAME] [--out figures/]

The notebooks read where to look and where to write from the environment, which this sets for their kernel:
$MLFLOW_TRACKING_URI, $MLFLOW_EXPERIMENT_NAME (MLflow's own names) and $LRKV_FIGURES_DIR. They run one after
another in a fresh kernel each, from notebooks/, and are never written back (notebooks stay stripped in
git); the executed copies go to <out>/executed/ for reading the tables.

Without runs in the store, costs.ipynb (which needs none) still runs, the notebooks that need runs are
skipped with the reason, and the exit status is 1, so that `make demo && make notebooks` in CI fails loudly
when the demo logged nothing. Exit status 0 only when every selected notebook ran.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightning_modules.analysis.analysis_errors import AnalysisError
from lightning_modules.analysis.locations import (
    EXPERIMENT_ENV,
    FIGURES_ENV,
    TRACKING_URI_ENV,
    resolve_figures_dir,
)
from lightning_modules.analysis.notebooks import NOTEBOOKS, run_notebooks
from lightning_modules.tracking.store import EXPERIMENT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_modules notebooks",
        description="Execute notebooks/*.ipynb headless against an MLflow store and write their PNG figures "
        "(and CSV tables) to a folder. Exit status 1 if a notebook failed or was skipped for lack of runs.",
    )
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help=f"MLflow tracking URI (default: ${TRACKING_URI_ENV}, else sqlite:///mlruns/mlflow.db in the repo)",
    )
    parser.add_argument(
        "--experiment", default=None, help=f"experiment name (default: ${EXPERIMENT_ENV}, else {EXPERIMENT})"
    )
    parser.add_argument(
        "--out", default=None, help=f"output folder (default: ${FIGURES_ENV}, else figures/ in the repo)"
    )
    parser.add_argument(
        "--notebook",
        action="append",
        choices=[n for n, _ in NOTEBOOKS],
        help="run only this notebook (repeatable; default: all)",
    )
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    args = parser.parse_args(argv)
    try:
        outcomes = run_notebooks(args.tracking_uri, args.out, args.experiment, args.notebook, args.timeout)
    except (AnalysisError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out_dir = Path(args.out).resolve() if args.out else resolve_figures_dir()
    figures = sorted(p.name for p in out_dir.glob("*.png"))
    print(f"figures in {out_dir}: {', '.join(figures) or 'none'}")
    return 0 if all(o.status == "ok" for o in outcomes) else 1
