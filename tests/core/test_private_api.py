"""Every private torch / Lightning API the project uses is listed in lightning_modules/core/private_api.py and
exists in the installed releases; pyproject.toml's ranges hold the installed torch and Lightning, the oldest
torch a GPU machine may have (2.11) and Makefile's CPU pin."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import lightning
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import ModelParallelStrategy
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from lightning_modules.core import private_api
from tests.core.private_uses import Use, private_uses

ROOT = Path(__file__).resolve().parents[2]
OLDEST_GPU_TORCH = "2.11.0"  # the torch of the GPU machines the project runs on (docs/architecture.md)
OLDEST_GPU_LIGHTNING = "2.6.0"


def versions() -> str:
    return f"torch {torch.__version__}, lightning {lightning.__version__}"


def test_every_listed_api_exists() -> None:
    missing = private_api.missing()
    assert not missing, f"missing in {versions()}:\n" + "\n".join(missing)


def test_a_moved_api_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """missing() names an entry whose module, attribute or instance attribute is gone, and only those."""
    gone = {
        "torch.optim._no_such_module.f": private_api.Api("site-a"),
        "torch.optim._muon._no_such_function": private_api.Api("site-b"),
        "lightning.pytorch.callbacks.ModelCheckpoint._no_such_attribute": private_api.Api(
            "site-c", "instance"
        ),
        "torch.ops.mkldnn._no_such_op": private_api.Api("site-d"),
    }
    kept = {"torch.optim._muon._adjust_lr": private_api.Api("site-e")}
    monkeypatch.setattr(private_api, "APIS", {**gone, **kept})
    missing = private_api.missing()
    assert [line.split(" ")[0] for line in missing] == list(gone)
    assert missing[1].startswith("torch.optim._muon._no_such_function (used in site-b): AttributeError")
    assert missing[2].endswith("ModelCheckpoint no longer sets self._no_such_attribute")


def test_instance_attributes_are_read_from_the_source() -> None:
    """An attribute set only in __init__ is absent from the class, found in its source (or a base's)."""
    assert not hasattr(ModelCheckpoint, "_last_global_step_saved")
    assert private_api.sets_attribute(ModelCheckpoint, "_last_global_step_saved")
    # Set by the base class Strategy's __init__, not by ModelParallelStrategy's own source.
    assert private_api.sets_attribute(ModelParallelStrategy, "_forward_redirection")
    assert not private_api.sets_attribute(ModelCheckpoint, "_last_global_step")  # a prefix is not a match
    assert not private_api.sets_attribute(int, "_anything")  # no Python source: nothing found


def _listed(use: Use) -> bool:
    if use.name.startswith("*."):  # only the attribute's name is known (`storage._cdata`)
        return any(key.endswith(use.name[1:]) for key in private_api.APIS)
    return any(key == use.name or key.startswith(use.name + ".") for key in private_api.APIS)


@pytest.mark.slow
def test_every_private_use_is_listed() -> None:
    uses = private_uses()
    assert any(use.name == "torch.optim._muon._adjust_lr" for use in uses)  # the scan sees the known ones
    unlisted = sorted({f"{use.name} ({use.where})" for use in uses if not _listed(use)})
    assert not unlisted, (
        "private torch / Lightning APIs used but not listed in lightning_modules/core/private_api.py "
        "(add each, with the file that uses it):\n" + "\n".join(unlisted)
    )


def requirement(name: str) -> SpecifierSet:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == name]
    assert len(found) == 1, f"pyproject.toml lists {name} {len(found)} times"
    return found[0].specifier


def makefile_torch_pin() -> str:
    pins = re.findall(r'"torch==([\w.]+)"', (ROOT / "Makefile").read_text())
    assert len(pins) == 1, f"Makefile pins torch {len(pins)} times, expected once (the setup recipe)"
    return pins[0]


def test_torch_range() -> None:
    """A range, not a pin: the installed torch, 2.11 and the CPU pin are in it; it has an upper bound."""
    spec = requirement("torch")
    installed = Version(torch.__version__).base_version  # 2.13.0+cpu: the local label is the build
    assert spec.contains(installed), f"torch {torch.__version__} is outside pyproject.toml's torch{spec}"
    assert spec.contains(OLDEST_GPU_TORCH), f"pyproject.toml's torch{spec} excludes {OLDEST_GPU_TORCH}"
    assert spec.contains(makefile_torch_pin()), f"Makefile's torch=={makefile_torch_pin()} not in {spec}"
    assert not spec.contains("3.0"), f"torch{spec} has no upper bound: an untested major release would pass"
    assert not spec.contains("2.10.0"), f"torch{spec} admits 2.10, older than what the list is checked on"


def test_lightning_range() -> None:
    spec = requirement("lightning")
    assert spec.contains(lightning.__version__), f"lightning {lightning.__version__} outside lightning{spec}"
    assert spec.contains(OLDEST_GPU_LIGHTNING), f"lightning{spec} excludes {OLDEST_GPU_LIGHTNING}"
    # 2.5.4's LightningCLI has no _parse_ckpt_path: lightning_modules/training/cli.py's would never run.
    assert not spec.contains("2.5.4"), f"lightning{spec} admits 2.5.4"
