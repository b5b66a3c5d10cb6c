"""Executing the analysis notebooks headless against a store (the command: python -m
lightning_modules notebooks, whose docstring says what the notebooks read and when they are skipped).

The notebooks read where to look and where to write from the environment, which this sets for their kernel:
$MLFLOW_TRACKING_URI, $MLFLOW_EXPERIMENT_NAME and $LRKV_FIGURES_DIR. Each runs in a fresh kernel from
notebooks/ and is never written back; the executed copy goes to <out>/executed/.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from lightning_modules.analysis.analysis_errors import AnalysisError
from lightning_modules.analysis.locations import (
    EXPERIMENT_ENV,
    FIGURES_ENV,
    REPO_ROOT,
    TRACKING_URI_ENV,
    resolve_experiment,
    resolve_figures_dir,
    resolve_tracking_uri,
)

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
# (name, needs runs), in the order they run: the cost notebook first because it needs no store.
NOTEBOOKS: tuple[tuple[str, bool], ...] = (
    ("costs", False),
    ("loss_vs_tokens", True),
    ("loss_vs_compute", True),
    ("cache_frontier", True),
)
KERNEL = "python3"  # jupyter_client starts it with this interpreter (sys.executable), so the venv's packages


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str  # "ok", "skipped" or "failed"
    message: str = ""


def run_notebooks(
    tracking_uri: str | None = None,
    out: str | Path | None = None,
    experiment: str | None = None,
    names: Sequence[str] | None = None,
    timeout: int = 600,
    log: Callable[[str], None] = print,
) -> list[Outcome]:
    """Execute the notebooks `names` (default: all, in NOTEBOOKS order) against the store; figures and tables
    go to `out` (default $LRKV_FIGURES_DIR, else figures/). A relative SQLite URI or `out` is taken relative
    to the current directory, as a user typing it expects."""
    known = dict(NOTEBOOKS)
    selected = list(names) if names else [n for n, _ in NOTEBOOKS]
    unknown = [n for n in selected if n not in known]
    if unknown:
        raise ValueError(f"unknown notebooks {unknown}; allowed: {', '.join(known)}")
    uri = resolve_tracking_uri(tracking_uri, base=Path.cwd())
    name = resolve_experiment(experiment)
    out_dir = Path(out).resolve() if out else resolve_figures_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    no_runs = _why_no_runs(uri, name) if any(known[n] for n in selected) else None

    outcomes = []
    env = {TRACKING_URI_ENV: uri, EXPERIMENT_ENV: name, FIGURES_ENV: str(out_dir)}
    for notebook in selected:
        if known[notebook] and no_runs:
            outcomes.append(Outcome(notebook, "skipped", no_runs))
            log(f"{notebook}.ipynb: skipped: {no_runs}")
            continue
        log(f"{notebook}.ipynb: running against {uri} (experiment {name!r})")
        outcome = execute_notebook(notebook, out_dir, env, timeout)
        outcomes.append(outcome)
        log(f"{notebook}.ipynb: {outcome.status}" + (f": {outcome.message}" if outcome.message else ""))
    return outcomes


def _why_no_runs(uri: str, experiment: str) -> str | None:
    from lightning_modules.analysis.tidy import load_runs  # late: imports mlflow, a second or two

    try:
        load_runs(uri, experiment)
    except AnalysisError as e:
        return str(e)
    return None


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    # The kernel inherits this process's environment when it starts; restore ours afterwards.
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def execute_notebook(notebook: str, out_dir: Path, env: Mapping[str, str], timeout: int = 600) -> Outcome:
    """Run notebooks/<notebook>.ipynb in a fresh kernel whose environment adds `env`; save the executed copy
    to <out_dir>/executed/. A failing cell gives a "failed" outcome with the exception's name and message."""
    with _environment(env):
        return _execute(notebook, out_dir, timeout)


def _execute(notebook: str, out_dir: Path, timeout: int) -> Outcome:
    nb = nbformat.read(NOTEBOOK_DIR / f"{notebook}.ipynb", as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=KERNEL,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
        # Quiet the kernel's own start-up warnings (local TCP transport); cell errors still come back.
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
    )
    try:
        client.execute()
        outcome = Outcome(notebook, "ok")
    except CellExecutionError as e:
        # The last line of the traceback is the exception the notebook raised, e.g. NoRunsError: ...
        outcome = Outcome(notebook, "failed", f"{e.ename}: {e.evalue}")
    finally:
        executed = out_dir / "executed"
        executed.mkdir(exist_ok=True)
        nbformat.write(nb, executed / f"{notebook}.ipynb")
    return outcome
