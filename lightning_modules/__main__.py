"""python -m lightning_modules <verb> [args]: the one dispatcher of the project's commands
(lightning_modules/commands/__init__.py lists them)."""

from __future__ import annotations

import sys

from lightning_modules.commands import main

if __name__ == "__main__":
    sys.exit(main())
