"""Train the paper's attentions (or those named) under one budget, test each, print the comparison (the demo).

    python -m lightning_modules compare                                   # nano, seed 7, conf/budget/demo.yaml
    python -m lightning_modules compare --sizes nano 20m --seeds 1 2 3    # several seeds and sizes

Each run goes through main.py's CLI (`fit` with the same configs a user would pass), then `test` on the
trained model in the same process, so fit and test land in one MLflow run. Extra arguments after `--` go
to every fit, e.g. `-- --trainer.max_steps 50`.
"""

from __future__ import annotations

import argparse
import sys

from lightning_modules.core.errors import ConfigError
from lightning_modules.core.fragments import fragment
from lightning_modules.model.attention import names, paper_names
from lightning_modules.study.comparison import format_rows, run_one
from lightning_modules.tracking.store import tracking_uri
from lightning_modules.tracking.ui import ui_url


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="python -m lightning_modules compare", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", nargs="+", default=["nano"])
    # The reference paper's arms by default (the demo's set and time); name others, or all, with --attentions.
    parser.add_argument("--attentions", nargs="+", default=list(paper_names()), choices=names())
    parser.add_argument("--seeds", nargs="+", type=int, default=[7])
    parser.add_argument("--data", default=str(fragment("data", "shakespeare")), help="data fragment")
    parser.add_argument("--budget", default=str(fragment("budget", "demo")), help="budget fragment")
    args = parser.parse_args(argv)
    for size in args.sizes:  # before any training: a size with no conf/model fragment is a usage error
        try:
            fragment("model", size)
        except ConfigError as e:
            parser.error(f"--sizes: {e}")
    rows = []
    for size in args.sizes:
        for seed in args.seeds:
            for kind in args.attentions:
                print(f"\n=== {size} {kind} seed {seed} ===", flush=True)
                rows.append(run_one(size, kind, seed, args.data, args.budget, extra))
    print("\nEqual-compute comparison (test split of the data; CE in nats/token):")
    print(format_rows(rows))
    print(
        f"\nEvery run is in MLflow ({tracking_uri()}). Open the UI with `make mlflow-ui`, then "
        f"{ui_url(None)}; draw the curves with `make notebooks`."
    )
    return 0
