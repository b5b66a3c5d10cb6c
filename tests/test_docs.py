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


# ----- the front door's rules -------------------------------------------------------------------------------
README_MAX_LINES = 250
PARAGRAPH_MAX_WORDS = 120
# Pages a person reads as prose; generated study pages (results/<protocol>/README.md) are tables in the main.
PROSE = ["README.md", "BENCHMARKS.md", "docs/*.md"]


def paragraphs(text: str) -> list[str]:
    """Prose paragraphs of a markdown text: blocks between blank lines outside code fences, a list item or a
    heading each its own, tables left out."""
    found: list[str] = []
    current: list[str] = []
    fenced = False

    def close() -> None:
        if current:
            found.append(" ".join(current))
            current.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            close()
            continue
        if fenced or not stripped or stripped.startswith(("|", "#", "<!--")):
            close()
            continue
        if stripped.startswith(("- ", "* ")) or re.match(r"\d+\. ", stripped):
            close()
        current.append(stripped)
    close()
    return found


def test_the_paragraph_rule_can_fail() -> None:
    long = " ".join(["word"] * 121)
    text = f"# Title\n\n{long}\n\n- a short item\n- {long}\n\n```\n{long}\n```\n\n| {long} |\n"
    assert [len(p.split()) for p in paragraphs(text)] == [121, 4, 122]


def test_readme_is_one_screen_and_no_paragraph_is_a_wall() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_MAX_LINES
    walls = []
    for pattern in PROSE:
        for path in sorted(ROOT.glob(pattern)):
            for paragraph in paragraphs(path.read_text()):
                if len(paragraph.split()) > PARAGRAPH_MAX_WORDS:
                    walls.append(
                        f"{path.relative_to(ROOT)}: {len(paragraph.split())} words: {paragraph[:80]}..."
                    )
    assert not walls, "paragraphs over 120 words (split them, or make a table):\n" + "\n".join(walls)


def _number(cell: str) -> float:
    return 0.0 if cell.strip() == "< 0.001" else float(cell.replace("+", "").strip())


def test_readme_headline_is_what_the_committed_results_give() -> None:
    """Every row of README.md's headline table equals results/main/pairs.csv to the digits it prints."""
    import pandas as pd

    text = (ROOT / "README.md").read_text()
    begin, end = "<!-- headline: results/main/pairs.csv -->", "<!-- headline: end -->"
    assert text.count(begin) == 1 and text.count(end) == 1
    block = text[text.index(begin) : text.index(end)]
    rows = [
        line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| comparison")
    ]
    pairs = pd.read_csv(ROOT / "results/main/pairs.csv")
    assert rows
    for line in rows:
        comparison, view, diff, interval, holm, resolved = [c.strip() for c in line.strip("|").split("|")]
        a, b = comparison.split(" - ")
        view_name, split = view.rstrip(")").split(" (")
        match = pairs[
            (pairs["a"] == a) & (pairs["b"] == b) & (pairs["view"] == view_name) & (pairs["split"] == split)
        ]
        assert len(match) == 1, line
        row = match.iloc[0]
        low, high = (_number(x) for x in interval.strip("[]").split(","))
        assert (_number(diff), low, high) == (
            round(row["diff_mean"], 4),
            round(row["ci_low"], 4),
            round(row["ci_high"], 4),
        ), line
        assert holm == ("< 0.001" if row["p_holm"] < 0.001 else f"{row['p_holm']:.3f}"), line
        assert resolved == ("yes" if row["resolved"] else "no"), line
