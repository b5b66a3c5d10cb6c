"""The way out for a test process that ran gloo collectives and has checked and torn down everything.

Interpreter finalization now and then aborts such a process ("terminate called without an active exception":
gloo's worker threads outlive the interpreter's teardown), after its work passed; seen in CI in
tests/optim/test_fsdp_muon.py, and in benchmarks/memory_plan.py, which leaves the same way. A failure raises
before `leave()` is reached and ends the process as usual."""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def leave() -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
