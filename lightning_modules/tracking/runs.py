"""What a run is called and tagged (docs/tracking.md): the names and tags the analysis selects runs by."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from lightning_modules.model.attention import AttentionConfig, knob_values
from lightning_modules.model.config import ModelConfig


def git_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha.strip() + ("-dirty" if dirty.strip() else "")


def run_name(model: ModelConfig, attention: AttentionConfig, seed: Any) -> str:
    return f"{model.name}-{attention.label()}-seed{seed}"


def run_tags(model: ModelConfig, attention: AttentionConfig, seed: Any, budget: str) -> dict[str, str]:
    """Tags the analysis selects runs by (lightning_modules/analysis): the size, the attention and its
    resolved knobs, the seed, the budget and the code version."""
    tags = {
        "size": model.name,
        "attention": attention.kind,
        "attention_label": attention.label(),
        "seed": str(seed),
        "budget": budget,
        "git_commit": git_commit(),
    }
    for knob, value in knob_values(attention).items():
        if value is not None:
            tags[f"knob.{knob}"] = str(value)
    return tags


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts to {"a.b.c": value}; lists and other leaves kept whole."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat
