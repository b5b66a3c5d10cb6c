"""A real `mlflow server` process for tests: SQLite backend, 127.0.0.1, a free port; killed and restarted on
the same port and database to play an outage."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.helpers import free_port

START_TIMEOUT_S = 300  # a loaded 2-core machine needs tens of seconds for a cold start


class MlflowServer:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.db = folder / "server.db"
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = (self.folder / "server.log").open("ab")
        # No job runner: it forks a pool of consumers the tests never use and doubles the start time.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.db}",
             "--artifacts-destination", str(self.folder / "artifacts"),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"mlflow server exited; see {self.folder / 'server.log'}")
            if self.answers():
                return
            time.sleep(0.5)
        self.kill()
        raise RuntimeError(
            f"mlflow server did not answer in {START_TIMEOUT_S} s; see {self.folder / 'server.log'}"
        )

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server and its workers, as a crash would."""
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait()
        self._process = None

    def ensure_running(self) -> None:
        if self._process is None or self._process.poll() is not None or not self.answers():
            self.kill()
            self.start()
