"""environment.yml mirrors pyproject.toml: conda users get the same pins as pip users."""

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _normalise(requirement: str) -> str:
    return requirement.replace(" ", "").lower()


def test_environment_yml_matches_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    expected = {_normalise(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {_normalise(r) for r in pip_section if not r.startswith("-e")}
    assert listed == expected, (
        f"only in environment.yml: {listed - expected}; only in pyproject: {expected - listed}"
    )
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert python == "python=" + project["requires-python"].removeprefix(">=")


def test_cpu_torch_and_triton_are_pinned_in_makefile() -> None:
    """pyproject.toml gives torch and triton ranges (tests/core/test_private_api.py); make setup pins the CPU
    torch build and the Triton whose interpreter and compiler the kernel tests use (tests/kernels/)."""
    assert '"torch==2.13.0" "triton==3.9.0" -e ".[dev,triton]"' in (ROOT / "Makefile").read_text()
