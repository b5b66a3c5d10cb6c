"""The project's import graph, read from the source with ast (nothing is imported): which module imports
which, at any depth (inside functions too; not under `if TYPE_CHECKING:`, which never runs). Used by
tests/test_dependencies.py."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lightning_modules", "data")


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    target: str  # dotted name of what it imports (a project module, or a third-party top-level name)
    line: int
    in_function: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def project_files() -> dict[str, Path]:
    """Every library and command module: lightning_modules/, data/ and main.py (tests, benchmarks and
    scripts are users of the project, not parts of it)."""
    files = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    files["main"] = ROOT / "main.py"
    return files


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _function_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def imports_of(name: str, path: Path, modules: set[str]) -> list[Import]:
    tree = ast.parse(path.read_text(), str(path))
    skipped, in_function = _type_checking_lines(tree), _function_lines(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom) or node.lineno in skipped:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: from the importer's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` the module itself
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in dict.fromkeys(targets):
            found.append(Import(name, target, node.lineno, node.lineno in in_function))
    return found


def graph() -> list[Import]:
    files = project_files()
    modules = set(files)
    return [imp for name, path in sorted(files.items()) for imp in imports_of(name, path, modules)]


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    nodes = {e.importer for e in edges}
    succ: dict[str, set[str]] = {n: set() for n in nodes}
    for e in edges:
        if e.target in nodes and e.target != e.importer:
            succ[e.importer].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out
