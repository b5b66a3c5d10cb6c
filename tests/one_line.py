"""The one-line check shared by the entry-error tables (tests/core/test_entry_errors.py and the tables beside
each concern's tests): a bad input given to a real entry point ends in exactly one ': error: ' line that holds
the expected words, a non-zero exit, no traceback and no unsafe load.

A row that names main.py or the dispatcher (`-m lightning_modules <verb>`) runs in this process, through the
same function the entry point's `__main__` calls (main.run, lightning_modules.commands.main), with its
environment, working directory and output swapped in and restored: the rows then cost what their own work
costs, not an interpreter and its imports each. Any other row (a script of benchmarks/ or scripts/) runs as a
process. tests/test_entry_points.py starts every entry point once as a real process."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (name, argv after the interpreter, extra env, substrings the error line must hold)
Case = tuple[str, list[str], dict[str, str], list[str]]


# Settings a process reads once and keeps (multiprocessing's temporary folder, made under TMPDIR on first use):
# a row that sets one runs as a process, since this process has read it already.
READ_ONCE_ENV = {"TMPDIR"}


def in_process(argv: list[str], env: dict[str, str] | None = None) -> Callable[[], int] | None:
    """The function `python ARGV` would run, when it is one this process can call; else None."""
    if READ_ONCE_ENV & set(env or {}):
        return None
    if argv and argv[0].endswith("main.py") and Path(argv[0]).resolve() == ROOT / "main.py":
        import main  # the repository root is on sys.path (pyproject.toml's pytest pythonpath)

        return lambda: main.run(argv[1:])
    if argv[:2] == ["-m", "lightning_modules"]:
        from lightning_modules import commands  # late: only rows of the dispatcher need it

        return lambda: commands.main(argv[2:])
    return None


@contextmanager
def swapped(env: dict[str, str], cwd: Path) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """The process's environment, working directory and standard streams as a child process would have
    them, restored afterwards."""
    saved_env, saved_cwd, saved_tempdir = dict(os.environ), Path.cwd(), tempfile.tempdir
    out, err = io.StringIO(), io.StringIO()
    os.environ.update(env)
    os.chdir(cwd)
    tempfile.tempdir = None  # read TMPDIR again, as a new process would
    try:
        with redirect_stdout(out), redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("default")  # a warning shown by an earlier row is shown again
            yield out, err
    finally:
        os.chdir(saved_cwd)
        tempfile.tempdir = saved_tempdir
        os.environ.clear()
        os.environ.update(saved_env)


def run_in_process(call: Callable[[], int], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of an entry point called here; an exception that escapes it is what the
    process would have printed as a traceback."""
    with swapped(env, cwd) as (out, err):
        try:
            code = call()
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code if isinstance(exit_.code, int) else 1
        except Exception:
            traceback.print_exc(file=sys.stderr)
            code = 1
    return code, out.getvalue(), err.getvalue()


def problems(argv: list[str], env: dict[str, str], expected: list[str], cwd: Path) -> list[str]:
    """What is wrong with how this command failed (empty: it failed as promised)."""
    call = in_process(argv, env)
    if call is not None:
        code, stdout, stderr = run_in_process(call, env, cwd)
        return judge(code, stdout, stderr, expected)
    run = subprocess.run(
        [sys.executable, *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return judge(run.returncode, run.stdout, run.stderr, expected)


def judge(code: int, stdout: str, stderr: str, expected: list[str]) -> list[str]:
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    found = []
    if code == 0:
        found.append("exit 0")
    if "Traceback" in stderr or len(errors) != 1:
        found.append(f"not one error line: {stderr[-1500:]}")
    elif not all(part in errors[0] for part in expected):
        found.append(f"{errors[0]!r} lacks {expected}")
    if "weights_only=False" in stderr or "unsafe-code-ran" in stdout:
        found.append("unsafe load advised or done")
    return found


def assert_each_ends_in_one_line(cases: Sequence[Case], cwd: Path) -> None:
    # In-process rows one after another (they share this process's state); the process rows spend most of
    # their time importing (one thread each): three at a time on two cores take about half as long.
    local = [i for i, case in enumerate(cases) if in_process(case[1], case[2]) is not None]
    remote = [i for i in range(len(cases)) if i not in local]
    by_index: dict[int, list[str]] = {i: problems(*cases[i][1:], cwd) for i in local}
    with ThreadPoolExecutor(max_workers=3) as pool:
        by_index.update(zip(remote, pool.map(lambda i: problems(*cases[i][1:], cwd), remote), strict=True))
    results = [by_index[i] for i in range(len(cases))]
    failures = [f"{case[0]}: {'; '.join(found)}" for case, found in zip(cases, results, strict=True) if found]
    assert not failures, "\n".join(failures)
