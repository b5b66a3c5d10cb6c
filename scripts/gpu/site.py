"""The bundle's packages that the steps themselves need (scripts/gpu/steps.py NEEDED_BY_STEPS), installed once
before the first step into a temporary folder (not OUT) put on every step's PYTHONPATH: the image's own
site-packages stay untouched (`pip install --no-index --no-deps --target`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpu.steps import NEEDED_BY_STEPS


def wheels_for(bundle: Path, names: tuple[str, ...] = NEEDED_BY_STEPS) -> list[Path]:
    """The bundle's wheels of these distributions (a wheel's name starts with its distribution's, `-` as `_`)."""
    prefixes = tuple(n.replace("-", "_").lower() + "-" for n in names)
    return sorted(p for p in bundle.glob("*.whl") if p.name.lower().startswith(prefixes))


def install(bundle: Path, site: Path) -> str:
    """Install NEEDED_BY_STEPS from the bundle into `site`; one line saying what happened."""
    wheels = wheels_for(bundle) if bundle.is_dir() else []
    if not wheels:
        return f"no {', '.join(NEEDED_BY_STEPS)} wheel in {bundle}: the steps that read conf/ fail without it"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site)]
    done = subprocess.run([*cmd, *map(str, wheels)], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [""])[-1]
        return f"pip install of {', '.join(w.name for w in wheels)} failed: {last}"
    return f"installed {', '.join(w.name for w in wheels)} into {site} for the steps"
