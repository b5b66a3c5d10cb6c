"""config.compose merges conf/ fragments as main.py does: for every combination a user composes, each value
the fragments set is the value `main.py fit ... --print_config` prints (--print_config parses, never trains)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lightning_modules.core.fragments import CONF_DIR, NOT_FRAGMENTS, compose, fragment
from lightning_modules.model.attention import names
from lightning_modules.training.cli import main

SIZES = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
BASE = CONF_DIR / "base.yaml"


def combinations() -> list[list[Path]]:
    """size x attention; each size's paper recipe; every data, budget and strategy fragment on nano."""
    out = [[BASE, fragment("model", s), fragment("attention", k)] for s in SIZES for k in names()]
    for recipe in sorted((CONF_DIR / "recipe").glob("*.yaml")):
        if recipe.stem in SIZES:
            out.append(
                [
                    BASE,
                    fragment("recipe", "paper"),
                    fragment("model", recipe.stem),
                    recipe,
                    fragment("attention", "lrkv"),
                ]
            )
    for kind in ("data", "budget", "strategy"):
        for path in sorted((CONF_DIR / kind).glob("*.yaml")):
            out.append([BASE, fragment("model", "nano"), fragment("attention", "mla"), path])
    return out


def leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(tree, list):  # lists are replaced whole, compared item by item
        out = {}
        for i, value in enumerate(tree):
            out.update(leaves(value, f"{prefix}[{i}]"))
        return out
    return {prefix: tree}


def test_every_conf_fragment_is_in_a_combination() -> None:
    used = {p for combo in combinations() for p in combo}
    assert {p for p in CONF_DIR.glob("**/*.yaml") if p.parent.name not in NOT_FRAGMENTS} <= used


@pytest.mark.parametrize(
    "paths", combinations(), ids=lambda ps: "+".join(f"{p.parent.name}/{p.stem}" for p in ps[1:])
)
def test_compose_equals_print_config(paths: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    args = ["fit"]
    for path in paths:
        args += ["--config", str(path)]
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--print_config"])
    assert exit_.value.code in (0, None)
    printed = leaves(yaml.safe_load(capsys.readouterr().out))
    expected = leaves(compose(paths))
    # jsonargparse prints a callback or logger given by class_path with its init_args filled in, and a
    # shorthand value (a bare class name) resolved: compare the values the fragments set.
    wrong = {
        k: (v, printed.get(k, "<missing>")) for k, v in expected.items() if printed.get(k, "<missing>") != v
    }
    assert not wrong, wrong
