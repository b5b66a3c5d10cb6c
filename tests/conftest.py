"""Fixtures shared across test folders: a tiny prepared corpus and an isolated MLflow store."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

# Triton kernels run through Triton's interpreter on a machine without a GPU (tests/kernels/). Triton reads the
# variable when its own library is first imported, which importing lightning or torch.compile already does.
if not Path("/dev/nvidiactl").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

if TYPE_CHECKING:
    from tests.mlflow_server import MlflowServer

TINY_SEQ_LEN = 32


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six of Shakespeare's texts as shards: vocab 512, 32-token samples (seconds to build)."""
    from data.sources import shakespeare_files
    from lightning_modules.commands.prepare import main as prepare

    out = tmp_path_factory.mktemp("shards")
    files = [str(p) for p in shakespeare_files()[:6]]
    args = [*files, "--out", str(out), "--vocab-size", "512", "--seq-len", str(TINY_SEQ_LEN), "--no-progress"]
    assert prepare([*args, "--shard-samples", "256", "--val-frac", "0.1", "--test-frac", "0.1"]) == 0
    return out


@pytest.fixture(scope="session")
def empty_store_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated, empty SQLite store. Creating one runs MLflow's schema migrations (about 6 s on a 2-core
    machine, in whichever process opens it first), so it is done once per test process and copied for every
    store a test needs; a copy is what a user's store is after its first connection."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()  # the first connection migrates
    return path


@pytest.fixture(scope="session")
def store_at(empty_store_file: Path) -> Callable[[Path], str]:
    """store_at(path) -> the tracking URI of a new empty SQLite store at `path` (a copy of the template).

    MLflow writes the Default experiment's artifact folder into the tables when it creates them (./mlruns/0
    of the creating process); the copy points it beside the store instead, so that nothing a test logs
    there lands in the template's folder or the repository."""

    def make(path: Path) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(empty_store_file, path)
        db = sqlite3.connect(path)
        try:
            with db:  # commits
                db.execute(
                    "UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                    (str(path.parent / "0"),),
                )
        finally:
            db.close()
        return f"sqlite:///{path}"

    return make


@pytest.fixture
def mlflow_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_at: Callable[[Path], str]) -> str:
    """Runs in tmp_path (checkpoints/ land there) with their own SQLite store, ./mlruns/mlflow.db."""
    monkeypatch.chdir(tmp_path)
    uri = store_at(tmp_path / "mlruns" / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="session")
def _mlflow_server_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    from tests.mlflow_server import MlflowServer

    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    yield server
    server.kill()


@pytest.fixture
def mlflow_server(
    _mlflow_server_process: MlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> MlflowServer:
    """A real `mlflow server` (SQLite backend, 127.0.0.1, a free port) shared by the session, running when
    the test starts (a test may kill and restart it); runs in tmp_path with MLFLOW_TRACKING_URI set to it."""
    _mlflow_server_process.ensure_running()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _mlflow_server_process.uri)
    return _mlflow_server_process


# ----- the fast tier ---------------------------------------------------------------------------------------
# `make test-fast` sets LRKV_FAST_LIMIT_S: a test not marked slow whose setup and call together take longer
# fails there, with a note to mark it, so the fast tier stays fast as tests are added. `make test` (CI) sets
# nothing and never judges time.
def _fast_limit() -> float | None:
    text = os.environ.get("LRKV_FAST_LIMIT_S", "")
    try:
        return float(text) if text else None
    except ValueError:
        raise pytest.UsageError(f"LRKV_FAST_LIMIT_S={text!r}: give a number of seconds") from None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    limit = item.config.stash.get(_LIMIT, None)
    if limit is None or item.get_closest_marker("slow") is not None or report.when not in ("setup", "call"):
        return report
    spent = item.stash.get(_SPENT, 0.0) + report.duration
    item.stash[_SPENT] = spent
    if report.when == "call" and report.passed and spent > limit:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {spent:.1f} s (setup and call) in the fast tier, over LRKV_FAST_LIMIT_S={limit:g}: "
            "mark it @pytest.mark.slow (or make it faster)"
        )
    return report


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_LIMIT] = _fast_limit()  # read once: a test that sets the variable changes only its own runs
    if config.stash[_LIMIT] is not None:
        # The training stack (torch, Lightning, jsonargparse, MLflow) takes seconds to import once per process:
        # imported here, before any test, so the limit judges each test's own work, not who imported it first.
        import lightning_modules.training.cli  # noqa: F401


_SPENT = pytest.StashKey[float]()
_LIMIT = pytest.StashKey[float | None]()


# ----- balancing the two workers ---------------------------------------------------------------------------
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with the most slow tests first, each file's tests in their own order. `make test` gives whole
    files to two workers (-n 2 --dist loadfile): a long file handed out last keeps one worker busy while the
    other idles, handed out first the short files fill in around it."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow") is not None)
    first_seen = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-slow[item.path], first_seen[item.path]))
