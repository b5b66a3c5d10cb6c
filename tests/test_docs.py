"""Every file a comment, docstring, notebook, config or document cites exists in the repository: the design
lives in docs/, and a reference to a file that is not here (a design note kept elsewhere, a renamed module)
is a dead end for the next reader."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".ipynb", ".yaml", ".yml", ".md", ".sh", ".sbatch", ".toml", ""}
# A path with a folder of this repository, or a bare file name of a kind the project cites.
WITH_FOLDER = re.compile(
    r"(?<![\w/.])((?:docs|lightning_modules|tests|benchmarks|conf|data|scripts|notebooks)/[\w./-]*[\w-]\.(?:md|py|yaml|ipynb|sh|sbatch))\b"
)
BARE = re.compile(r"(?<![\w/.-])([A-Za-z][\w-]*\.(?:md|py))\b")


def tracked_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    others = subprocess.run(
        ["git", "ls-files", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    paths = [ROOT / n for n in (names + others).split()]
    return [p for p in paths if p.is_file() and (p.suffix in SUFFIXES or p.name == "Makefile")]


def test_every_cited_path_exists() -> None:
    files = tracked_files()
    known_names = {p.name for p in files}
    missing = []
    for path in files:
        text = path.read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if "tmp_path" in line:  # a file a test writes, not a citation
                continue
            for cited in WITH_FOLDER.findall(line):
                if not (ROOT / cited).exists():
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {cited}")
            for cited in BARE.findall(line):
                if cited not in known_names and not (path.parent / cited).exists():
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {cited}")
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


def test_docs_cover_the_design() -> None:
    expected = {"architecture.md", "attentions.md", "costs.md", "data.md", "tracking.md", "paper-errata.md"}
    assert expected <= {p.name for p in (ROOT / "docs").glob("*.md")}
    attentions = (ROOT / "docs" / "attentions.md").read_text()
    from lightning_modules.model.attention import names

    for kind in names():  # every registered attention has its math and decode written down
        assert f"## {kind}" in attentions or f"| {kind} |" in attentions, kind
