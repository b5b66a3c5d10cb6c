"""The dependency rule of docs/architecture.md, read from the imports (tests/imports.py): which folder may
import which, what the plain-torch model may not touch, no import circles at any depth, no library module
importing a command, and an import inside a function only with a comment saying why."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tests.imports import Import, cycles, graph, imports_of, project_files

# Each folder of lightning_modules/ (a "room") and what it may import of the project. The commands (main.py,
# lightning_modules/__main__.py and lightning_modules/commands/) may import anything; nothing imports them.
MAY_IMPORT: dict[str, set[str]] = {
    "core": set(),
    "data": {"core"},
    "kernels": set(),
    "model": {"core", "kernels"},
    "optim": {"core", "model"},
    "costs": {"core", "model", "optim"},
    "distributed": {"core", "model"},
    "checkpoint": {"core"},
    "tracking": {"core", "model"},
    "generation": {"core", "model", "checkpoint"},
    "analysis": {"core", "model", "costs", "tracking"},
    "training": {"core", "model", "optim", "costs", "distributed", "checkpoint", "tracking", "data"},
    "study": {"core", "model", "costs", "checkpoint", "tracking", "training", "data"},
    "scoring": {"core", "model", "data", "generation", "analysis"},
    "reporting": {"core", "model", "costs", "tracking", "analysis", "study"},
}
# Third-party packages a room may not import: the model is plain torch; the cost model and the optimiser
# know nothing of Lightning or MLflow; Lightning's internals are reached only through core/lightning_api.py.
MAY_NOT_IMPORT: dict[str, set[str]] = {
    "model": {"lightning", "pytorch_lightning", "mlflow", "webdataset", "jsonargparse", "pandas", "triton"},
    "kernels": {"lightning", "pytorch_lightning", "mlflow", "webdataset", "jsonargparse", "pandas"},
    "optim": {"lightning", "pytorch_lightning", "mlflow"},
    "costs": {"lightning", "pytorch_lightning", "mlflow"},
    "analysis": {"lightning", "pytorch_lightning"},
}
LIGHTNING_INTERNALS = re.compile(r"^lightning\.(fabric|pytorch)\..*\._|^lightning\.fabric\.utilities\.load$")

FILES = project_files()
MODULES = set(FILES)
EDGES = graph()


@functools.cache
def is_command(module: str) -> bool:
    """main.py, the dispatcher (lightning_modules/__main__.py) or a module of lightning_modules/commands/."""
    return module in ("main", "lightning_modules.__main__") or module.startswith("lightning_modules.commands")


def has_main_guard(module: str) -> bool:
    return any(
        isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
        for node in ast.parse(FILES[module].read_text()).body
    )


def room(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "data":
        return "data"
    if is_command(module):
        return "commands"
    return parts[1] if len(parts) > 1 else "lightning_modules"


def project_edges(edges: list[Import]) -> list[Import]:
    return [e for e in edges if e.target in MODULES and e.target != e.importer]


def violations(edges: list[Import]) -> list[str]:
    out = []
    for e in project_edges(edges):
        source, target = room(e.importer), room(e.target)
        if source in ("commands", "lightning_modules") or target == source:
            continue
        if target not in MAY_IMPORT.get(source, set()):
            out.append(f"{e.importer}:{e.line} imports {e.target} ({source}/ may not import {target}/)")
    for e in edges:
        if e.target in MODULES or e.target.split(".")[0] in ("lightning_modules", "data"):
            continue
        top = e.target.split(".")[0]
        if top in MAY_NOT_IMPORT.get(room(e.importer), set()):
            out.append(f"{e.importer}:{e.line} imports {e.target} ({room(e.importer)}/ may not import it)")
        private = "._" in e.target or LIGHTNING_INTERNALS.search(e.target)
        if top == "lightning" and e.importer != "lightning_modules.core.lightning_api" and private:
            out.append(f"{e.importer}:{e.line} reaches Lightning's internals outside core/lightning_api.py")
    return out


def test_every_folder_imports_only_what_the_rule_allows() -> None:
    assert not violations(EDGES), "\n".join(violations(EDGES))


def test_the_rule_fails_when_the_model_imports_lightning(tmp_path: Path) -> None:
    """The check can fail: a model/ module that imports Lightning, or the tracking store, is reported."""
    bad = tmp_path / "transformer.py"
    bad.write_text("import lightning as L\nfrom lightning_modules.tracking import store\n")
    edges = imports_of("lightning_modules.model.transformer", bad, MODULES)
    found = violations(edges)
    assert any("may not import it" in v and "lightning" in v for v in found), found
    assert any("model/ may not import tracking/" in v for v in found), found


def test_no_module_imports_a_module_that_imports_it_back() -> None:
    assert cycles(EDGES) == []


def test_cycles_are_found_at_any_depth() -> None:
    a, b, c = "lightning_modules.a", "lightning_modules.b", "lightning_modules.c"
    edges = [Import(a, b, 1, False), Import(b, c, 1, True), Import(c, a, 3, True)]
    assert cycles(edges) == [[a, b, c]]


def test_no_library_module_imports_a_command() -> None:
    commands = {m for m in MODULES if is_command(m)}
    assert (
        "lightning_modules.commands.generate" in commands
        and "lightning_modules.commands.cost_report" in commands
    )
    wrong = [f"{e.importer}:{e.line} imports the command {e.target}" for e in project_edges(EDGES)
             if e.target in commands and not is_command(e.importer)]  # fmt: skip
    assert not wrong, "\n".join(wrong)


def test_only_entry_points_have_a_main_guard() -> None:
    """A command is a module of lightning_modules/commands/, reached through the dispatcher; a `__main__` guard
    anywhere else would be a second, untested way in."""
    guarded = sorted(m for m in MODULES if has_main_guard(m))
    assert guarded == ["lightning_modules.__main__", "main"], guarded
    assert not [m for m in MODULES if FILES[m].name == "__main__.py" and m != "lightning_modules.__main__"]


def test_no_two_modules_share_a_name() -> None:
    """One name, one module: `store.py` in three folders makes every citation and import ambiguous."""
    by_name: dict[str, list[str]] = {}
    for module, path in FILES.items():
        if path.name not in ("__init__.py", "__main__.py") and module != "main":
            by_name.setdefault(path.name, []).append(module)
    clashes = {name: mods for name, mods in by_name.items() if len(mods) > 1}
    assert not clashes, clashes


def test_every_package_docstring_lists_its_modules() -> None:
    """Each package's docstring is its table of contents: a module it does not name is one nobody finds."""
    missing = []
    for module, path in FILES.items():
        if path.name != "__init__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        for child in sorted(path.parent.glob("*.py")):
            if child.name not in ("__init__.py", "__main__.py") and child.name not in doc:
                missing.append(f"{module}: {child.name}")
    assert not missing, "\n".join(missing)


def test_the_docstring_rule_can_fail(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    listed, unlisted = (f"{name}.py" for name in ("listed", "unlisted"))
    (package / "__init__.py").write_text(f'"""Lists {listed} only."""\n')
    for name in (listed, unlisted):
        (package / name).write_text("")
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    assert [
        p.name for p in sorted(package.glob("*.py")) if p.name != "__init__.py" and p.name not in doc
    ] == [unlisted]


def test_commands_only_parse_arguments_and_call_the_library() -> None:
    """A command module defines functions and constants of its own, never a class: the thing it runs lives
    in the library, where tests and other commands reach it without importing the command."""
    offenders = []
    for module in sorted(m for m in MODULES if is_command(m)):
        tree = ast.parse(FILES[module].read_text())
        offenders += [f"{module}: class {n.name}" for n in tree.body if isinstance(n, ast.ClassDef)]
    assert not offenders, "\n".join(offenders)


def _explained(lines: list[str], number: int) -> bool:
    """A comment on the import's lines, on an import of the same group above it, or on the line above the
    group (a parenthesised import's comment may sit on one of its continuation lines)."""
    if any("#" in line for line in lines[number - 1 : number + 3]):
        return True
    above = number - 2
    while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
        if "#" in lines[above]:
            return True
        above -= 1
    return above >= 0 and lines[above].strip().startswith("#")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_an_import_inside_a_function_says_why(module: str) -> None:
    lines = FILES[module].read_text().splitlines()
    unexplained = []
    for e in imports_of(module, FILES[module], MODULES):
        if e.in_function and not _explained(lines, e.line):
            unexplained.append(f"{module}:{e.line}: {lines[e.line - 1].strip()}")
    assert not unexplained, "an import inside a function needs a one-line reason:\n" + "\n".join(unexplained)
