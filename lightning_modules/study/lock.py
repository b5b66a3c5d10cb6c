"""One worker per run: a worker holds an exclusive lock on `worker.lock` in its run's checkpoint folder while
it lives, and the worker tied to its runner dies with it.

The claim in the tracking store (store.py) says which runner owns a run; the lock says which process trains
it. A claim can look stale while its worker still trains (a runner killed with SIGKILL leaves its worker
behind for a moment, or for good where the worker cannot follow its parent), so a second worker on the same
run is refused by the lock rather than by the claim: two workers would log every step twice and both write
last.ckpt. The kernel drops the lock with the last process holding it, however that process ends, so a lock
never outlives its worker and never needs cleaning up. It guards workers that share the folder: one machine,
or a filesystem whose flock is honoured across machines.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import stat
import sys
import threading
from pathlib import Path
from typing import IO

from lightning_modules.core.errors import UserError

LOCK_FILE = "worker.lock"
LOCKED_EXIT = 75  # EX_TEMPFAIL: the worker found its run held by another one and trained nothing
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class RunLockedError(UserError):
    """Another live process holds the run's lock."""


def holder(folder: Path) -> int | None:
    """The pid written by the process that holds the run's lock (0 when it wrote none yet), None when free."""
    path = folder / LOCK_FILE
    if not path.is_file():
        return None
    with path.open("a+") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            text = file.read().strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(file, fcntl.LOCK_UN)
    return None


def hold(folder: Path, run_id: str) -> IO[str]:
    """Take the run's lock for the rest of this process (keep the returned file open); RunLockedError if held."""
    folder.mkdir(parents=True, exist_ok=True)
    file = (folder / LOCK_FILE).open("a+")
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        pid = file.read().strip() or "?"
        file.close()
        raise RunLockedError(
            f"run {run_id}: another worker (pid {pid}) is training it (lock {folder / LOCK_FILE}); "
            "let it finish or stop it, then run the study again"
        ) from None
    file.seek(0)
    file.truncate()
    file.write(f"{os.getpid()}\n")
    file.flush()
    return file


def orphaned(pid: int) -> bool:
    """Whether the worker `pid` outlived the runner that started it (Linux: read from /proc), so it is about to
    end: the kernel has sent it SIGKILL (die_with_runner), or its stdin pipe has ended. Such a worker can take
    seconds to go, e.g. inside a checkpoint write on a loaded machine. False when unknown."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        parent = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return False
    if b"--runner-pid" not in argv:
        return False
    try:
        runner = int(argv[argv.index(b"--runner-pid") + 1])
    except (IndexError, ValueError):
        return False
    return parent != runner


def exiting(pid: int) -> bool:
    """Whether the process `pid` that wrote a held lock is gone or on its way out (Linux: /proc): no such
    process, a zombie, or no command line left (the kernel frees a dying process's memory before its files,
    so for a moment its lock outlives its command line). Its lock is about to be released."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()
    return not argv or (bool(fields) and fields[0] in ("Z", "X", "x"))


class RunnerGoneError(UserError):
    """The runner that started this worker is no longer its parent."""


def die_with_runner(runner_pid: int) -> None:
    """End this process when the runner that started it ends, however it ends (SIGKILL included).

    Linux: the kernel sends SIGKILL when the parent exits (prctl PR_SET_PDEATHSIG). It is armed here, in
    the worker, and only then is the parent checked: a runner that died before this line would never send
    it. Everywhere: the runner holds the write end of this process's stdin pipe and never writes, so the
    pipe ends when the runner does, which a watcher thread turns into an exit (the path for systems
    without prctl, and the one that catches a parent gone between the two steps above).
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            print(f"prctl(PR_SET_PDEATHSIG) failed: errno {ctypes.get_errno()}", file=sys.stderr, flush=True)
    if os.getppid() != runner_pid:
        raise RunnerGoneError(
            f"runner pid {runner_pid} is gone (parent is now {os.getppid()}); trained nothing: run the study again"
        )
    if _stdin_is_pipe():  # started by hand (a terminal, /dev/null): no runner's pipe to watch
        threading.Thread(target=_exit_at_end_of_stdin, name="runner-watch", daemon=True).start()


def _stdin_is_pipe() -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(0).st_mode)
    except OSError:  # stdin closed
        return False


def _exit_at_end_of_stdin() -> None:
    # The file descriptor, not sys.stdin: a daemon thread blocked inside sys.stdin's buffer holds its lock,
    # and the interpreter aborts at exit when it cannot take that lock (SIGABRT after a finished run).
    try:
        while os.read(0, 4096):
            pass
    except OSError:  # stdin closed under us: nothing left to watch
        return
    print("the runner is gone: stopping (the run resumes from its last checkpoint)", flush=True)
    os._exit(1)
