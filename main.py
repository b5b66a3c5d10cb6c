"""Entry point: python main.py fit|validate|test --config conf/base.yaml --config conf/model/nano.yaml ...

See README.md for the configs and lightning_modules/training/cli.py for what the CLI adds to LightningCLI.
"""

from __future__ import annotations

import sys

from lightning_modules.core.errors import run_entry
from lightning_modules.training.cli import LanguageModelCLI
from lightning_modules.training.cli import main as _main
from lightning_modules.training.signals import run_stoppable


def main(args: list[str] | None = None) -> LanguageModelCLI:
    return _main(args)


def run(args: list[str] | None = None) -> int:
    """What `python main.py ARGS` does, exit code included. SIGTERM, Ctrl-C, SIGUSR1: a checkpoint at the
    step's end, then 128 + the signal's number (lightning_modules/training/signals.py)."""
    return run_stoppable(lambda: run_entry(lambda: main(args) and 0, "main.py"), "main.py")


if __name__ == "__main__":
    sys.exit(run())
