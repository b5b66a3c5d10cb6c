"""The private torch / Lightning names the project's source uses, read with ast (nothing of the project is
imported), for tests/core/test_private_api.py to require in lightning_modules/core/private_api.py.

Found: an import from a private module or of a private name (`from torch.optim._muon import _adjust_lr`);
a private attribute of an imported torch / Lightning name (`torch.ops.mkldnn._is_mkldnn_bf16_supported`),
or any attribute of a private module imported under a name (`dynamo_utils.get_compilation_metrics`);
in a class deriving from a torch / Lightning class, a `self._x` or a `def _x` that the base class already
has (an inherited private attribute, or an override of a private method); any other `obj._x` whose name
the project never defines itself (`storage._cdata`: the object's type is unknown to ast, so it is reported
by its last part).
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path

from lightning_modules.core.private_api import sets_attribute

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("lightning_modules", "data", "benchmarks")
LIBRARIES = ("torch", "lightning", "pytorch_lightning")


@dataclass(frozen=True)
class Use:
    name: str  # a dotted name (an APIS key), or "*._x" when only the attribute's name is known
    where: str  # file:line


def source_files() -> list[Path]:
    return sorted(p for folder in SOURCES for p in (ROOT / folder).rglob("*.py")) + [ROOT / "main.py"]


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _bindings(tree: ast.Module) -> dict[str, str]:
    """Each local name an import binds, and the dotted name it stands for."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                bound[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{'.' * node.level}{node.module}.{alias.name}"
    return bound


def _library(dotted: str) -> bool:
    return dotted.split(".")[0] in LIBRARIES


def _of_private_module(node: ast.Attribute, bound: dict[str, str]) -> bool:
    """`alias.name` where the import bound alias to a private module (`import torch._dynamo.utils as u`)."""
    parts = _dotted(node)
    return bool(parts) and any(_private(p) for p in bound.get(parts[0], "").split("."))


def _dotted(node: ast.expr) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None for anything but a chain of names."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _live(dotted: str) -> object | None:
    """The object a dotted name names in the installed libraries, None if it does not resolve."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for part in parts[cut:]:
                target = getattr(target, part)
        except AttributeError:
            return None
        return target
    return None


def _defined_by_project(trees: list[ast.Module]) -> set[str]:
    """Private names the project defines: functions, classes, attributes it assigns, module-level names."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {name for name in names if _private(name)}


def _inherited(cls: ast.ClassDef, bound: dict[str, str], where: str) -> list[Use]:
    """`self._x` and `def _x` of a class whose torch / Lightning base already has `_x`."""
    bases = []
    for base in cls.bases:
        parts = _dotted(base)
        if parts and parts[0] in bound and _library(bound[parts[0]]):
            dotted = ".".join([bound[parts[0]], *parts[1:]])
            live = _live(dotted)
            if isinstance(live, type):
                bases.append((dotted, live))
    if not bases:
        return []
    names = {
        (node.attr, node.lineno)
        for node in ast.walk(cls)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and _private(node.attr)
    }
    names |= {
        (node.name, node.lineno)
        for node in cls.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _private(node.name)
    }
    uses = []
    for name, line in sorted(names):
        for dotted, live in bases:
            if hasattr(live, name) or sets_attribute(live, name):
                uses.append(Use(f"{dotted}.{name}", f"{where}:{line}"))
    return uses


def private_uses() -> list[Use]:
    """Every private torch / Lightning name the source uses (module docstring), where it is used."""
    files = source_files()
    trees = {path: ast.parse(path.read_text(), str(path)) for path in files}
    own = _defined_by_project(list(trees.values()))
    uses: list[Use] = []
    for path, tree in trees.items():
        where = str(path.relative_to(ROOT))
        bound = _bindings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                module = node.module.split(".")
                if module[0] in LIBRARIES:
                    for alias in node.names:
                        if _private(alias.name) or any(_private(p) for p in module):
                            uses.append(Use(f"{node.module}.{alias.name}", f"{where}:{node.lineno}"))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] in LIBRARIES and any(_private(p) for p in parts):
                        uses.append(Use(alias.name, f"{where}:{node.lineno}"))
            elif isinstance(node, ast.ClassDef):
                uses += _inherited(node, bound, where)
            elif isinstance(node, ast.Attribute) and (_private(node.attr) or _of_private_module(node, bound)):
                parts = _dotted(node)
                if parts and parts[0] in bound:
                    dotted = ".".join([bound[parts[0]], *parts[1:]])
                    if _library(dotted):
                        uses.append(Use(dotted, f"{where}:{node.lineno}"))
                    continue  # another package's private name (os._exit): not torch's or Lightning's
                if parts and parts[0] in ("self", "cls"):
                    continue  # the class's own, or inherited: _inherited decides
                elif node.attr not in own:
                    uses.append(Use(f"*.{node.attr}", f"{where}:{node.lineno}"))
    return uses
