"""Saving figures and tables where `make notebooks` collects them (figures/ by default, gitignored)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from lightning_modules.analysis.locations import resolve_figures_dir

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
DPI = 150


def _path(name: str, suffix: str, out: str | Path | None) -> Path:
    if not NAME.match(name) or name.endswith((".png", ".csv")):
        raise ValueError(f"figure or table name {name!r}: a plain file stem such as 'loss_vs_tokens'")
    folder = resolve_figures_dir(out)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}{suffix}"


def save_figure(fig: Figure, name: str, out: str | Path | None = None) -> Path:
    """Write `fig` as `<figures dir>/<name>.png` and return the path."""
    path = _path(name, ".png", out)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def save_table(table: pd.DataFrame, name: str, out: str | Path | None = None) -> Path:
    """Write `table` as `<figures dir>/<name>.csv` (full precision, for reuse outside the notebooks)."""
    path = _path(name, ".csv", out)
    table.to_csv(path, index=False)
    return path
