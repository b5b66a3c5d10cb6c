"""Run a step's script with some packages hidden: `python scripts/gpu/launch.py --hide a,b -- SCRIPT ARGS...`.

scripts/gpu/steps.py starts the steps that must work on the bare GPU image this way, with the packages the
image lacks hidden (sys.modules[name] = None makes any import of them fail, as if absent), so the CPU dry run
fails where the GPU machine would.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[0] != "--hide" or argv[2] != "--":
        raise SystemExit("usage: launch.py --hide NAME[,NAME...] -- SCRIPT [ARGS...]")
    for name in filter(None, argv[1].split(",")):
        sys.modules[name] = None  # type: ignore[assignment]
    script = argv[3]
    sys.argv = [script, *argv[4:]]
    sys.path[0] = str(Path(script).resolve().parent)  # as `python SCRIPT` sets it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
