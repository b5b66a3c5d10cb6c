"""conf/ fragments: where they are, and how repeated --config options compose them (as LightningCLI does).

tests/core/test_fragments.py checks `compose` against main.py's own --print_config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_modules.core.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# conf/ folders holding data other commands read, not main.py fragments: study protocols
# (lightning_modules/study/protocol.py), the paper's printed numbers (lightning_modules/analysis/paper.py), the
# rows a benchmark measures (benchmarks/memory_plan.py).
NOT_FRAGMENTS = ("study", "paper", "benchmarks")


def _merge(into: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Later fragments win key by key; nested mappings merge, anything else (lists included) is replaced."""
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def compose(paths: list[str | Path]) -> dict[str, Any]:
    """The YAML fragments merged in order, as repeated --config options are. Read with jsonargparse's own YAML
    loader, the one main.py's parser uses: plain YAML 1.1 reads `100.0e9` as a string, jsonargparse as a float."""
    from jsonargparse import (
        get_loader,  # late: lightning_modules.commands.prepare imports core/ and has no use for it
    )

    load = get_loader("yaml")
    merged: dict[str, Any] = {}
    for path in paths:
        _merge(merged, load(Path(path).read_text()) or {})
    return merged


def fragment(kind: str, name: str) -> Path:
    """conf/<kind>/<name>.yaml, or a ConfigError listing the fragments there."""
    path = CONF_DIR / kind / f"{name}.yaml"
    if not path.exists():
        allowed = sorted(p.stem for p in (CONF_DIR / kind).glob("*.yaml"))
        raise ConfigError(f"no conf/{kind}/{name}.yaml; allowed: {', '.join(allowed)}")
    return path
