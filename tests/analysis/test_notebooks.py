"""The notebooks: stripped in git, defining nothing, and executing headless into PNG figures."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from lightning_modules.analysis import notebooks as runner
from lightning_modules.analysis.targets import tokens_to_target
from lightning_modules.analysis.tidy import load_runs
from lightning_modules.commands import run_notebooks as command

pytestmark = pytest.mark.slow  # each test executes notebooks against a store that fits build

NOTEBOOKS = sorted(runner.NOTEBOOK_DIR.glob("*.ipynb"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
Executed = tuple[Path, list[runner.Outcome]]  # the figures folder and each notebook's outcome


def code_cells(path: Path) -> list[nbformat.NotebookNode]:
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_the_runner_knows_every_notebook() -> None:
    assert sorted(p.stem for p in NOTEBOOKS) == sorted(name for name, _ in runner.NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_stripped(path: Path) -> None:
    for cell in code_cells(path):
        assert cell.outputs == [] and cell.execution_count is None, (
            f"{path.name}: strip outputs before committing"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_define_nothing(path: Path) -> None:
    for cell in code_cells(path):
        for node in ast.walk(ast.parse(cell.source)):
            assert not isinstance(node, ast.FunctionDef | ast.ClassDef | ast.Lambda), (
                f"{path.name}: define it in lightning_modules/analysis/ and import it"
            )


# Fixtures returning a tracking URI that every notebook must run against; a store written by a real tiny
# training run belongs here beside the synthetic one.
STORES = ["synthetic_store", "tiny_run_store"]  # the second is written by real training runs


@pytest.fixture(scope="module", params=STORES)
def store(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def executed(store: str, tmp_path_factory: pytest.TempPathFactory) -> Executed:
    out = tmp_path_factory.mktemp("figures")
    before = {p: p.read_bytes() for p in NOTEBOOKS}
    outcomes = runner.run_notebooks(store, out, log=lambda _: None)
    assert {p: p.read_bytes() for p in NOTEBOOKS} == before, "the runner must not write notebooks back"
    return out, outcomes


@pytest.mark.slow
def test_every_notebook_runs_against_the_store(executed: Executed) -> None:
    _, outcomes = executed
    assert [(o.name, o.status, o.message) for o in outcomes] == [(n, "ok", "") for n, _ in runner.NOTEBOOKS]


def test_figures_are_pngs_named_by_their_axis(executed: Executed) -> None:
    out, _ = executed
    names = {p.name for p in out.glob("*.png")}
    assert {"loss_vs_tokens.png", "loss_vs_flops.png", "cache_frontier.png", "costs_per_size.png"} <= names
    assert "cache_frontier_paper_128m.png" in names
    for name in names:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 20_000, name
    assert sorted(p.name for p in (out / "executed").glob("*.ipynb")) == sorted(p.name for p in NOTEBOOKS)


def test_notebook_tables_come_from_the_store_they_were_given(executed: Executed, store: str) -> None:
    out, _ = executed
    written = pd.read_csv(out / "tokens_to_target.csv")
    expected = tokens_to_target(load_runs(store))
    assert len(written) == len(expected)
    pd.testing.assert_series_equal(written["saved_mean"], expected["saved_mean"], check_names=False)
    flops = pd.read_csv(out / "flops_to_target.csv")
    if written["saved_mean"].notna().any():  # compute-to-target is a different table
        assert not flops["saved_mean"].equals(written["saved_mean"])


def test_without_runs_the_run_notebooks_are_skipped_and_say_why(tmp_path: Path) -> None:
    messages: list[str] = []
    missing = tmp_path / "mlruns" / "mlflow.db"
    outcomes = runner.run_notebooks(
        f"sqlite:///{missing}",
        tmp_path / "figs",
        names=["loss_vs_tokens", "cache_frontier"],
        log=messages.append,
    )
    assert [o.status for o in outcomes] == ["skipped", "skipped"]
    assert "make demo" in outcomes[0].message and str(missing) in outcomes[0].message
    assert any(m.startswith("loss_vs_tokens.ipynb: skipped") for m in messages)
    assert not missing.exists()


def test_cli_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    assert (
        command.main(["--tracking-uri", missing, "--out", str(tmp_path), "--notebook", "cache_frontier"]) == 1
    )
    assert "skipped" in capsys.readouterr().out
    assert command.main(["--tracking-uri", str(tmp_path / "mlruns"), "--out", str(tmp_path)]) == 2
    assert "file store" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_notebook_opened_on_an_empty_store_fails_clearly(
    new_store: Callable[[str], str], tmp_path: Path
) -> None:
    # What a user sees running the notebook by hand (the runner would have skipped it).
    env = {command.TRACKING_URI_ENV: new_store("empty_for_notebook"), command.FIGURES_ENV: str(tmp_path)}
    outcome = runner.execute_notebook("cache_frontier", tmp_path, env, timeout=120)
    assert outcome.status == "failed"
    assert outcome.message.startswith("NoRunsError: no experiment 'lrkv-lab'")
