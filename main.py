"""Entry point: python main.py fit|validate|test --config conf/base.yaml --config conf/model/nano.yaml ...

See README.md for the configs and lightning_modules/training/cli.py for what the CLI adds to LightningCLI.
"""

from __future__ import annotations

import sys

from lightning_modules.core.errors import run_entry
from lightning_modules.training.cli import LanguageModelCLI
from lightning_modules.training.cli import main as _main


def main(args: list[str] | None = None) -> LanguageModelCLI:
    return _main(args)


if __name__ == "__main__":
    sys.exit(run_entry(lambda: main() and 0, "main.py"))
