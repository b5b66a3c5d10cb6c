"""One `lightning_modules.commands.prepare --tasks N` per --out at a time: an exclusive flock on `<out>.partial.lock`, held by the
driver from before it touches the work folder (data/task_plan.py) until the merge has swapped the dataset in.

Two identical commands would otherwise share `<out>.partial/`: each task's attempt clears what the other's
wrote, and a task's completion marker can end up beside a shard the other attempt damaged. The second
command is refused in one line naming the process that holds the lock.

The lock file holds the holder's pid and host (for that message) and is removed by its holder on the way
out, success or failure; only a killed driver leaves it behind, and the kernel has released its lock then, so
the next command takes it over. On SLURM the driver holds it while it submits; the jobs run without it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from data.data_errors import PrepareError

LOCK_SUFFIX = ".partial.lock"
_HELD: set[int] = set()  # descriptors of the locks this process holds


def _release_in_child() -> None:
    """A forked child (datatrove's manager and pool, multiprocess's default fork) shares the lock's open file,
    and flock is released only when every copy is closed: an orphan left by a killed driver would hold it for
    good. The child's copy is pointed at /dev/null instead (closing it would leave its file object a number
    that may be reused), so only the driver holds the lock and its death releases it."""
    for fd in _HELD:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, fd)
        os.close(null)
    _HELD.clear()


os.register_at_fork(after_in_child=_release_in_child)


def lock_path(out: Path) -> Path:
    return out.with_name(out.name + LOCK_SUFFIX)


@contextmanager
def preparation_lock(out: Path) -> Iterator[Path]:
    """Hold the lock of `out` for the body, or raise PrepareError naming who holds it."""
    path = lock_path(Path(out))
    handle = _acquire(Path(out), path)
    _HELD.add(handle.fileno())
    try:
        yield path
    finally:
        _HELD.discard(handle.fileno())
        # Removed while still held: a command that opened it meanwhile finds, once it gets the lock, that
        # the name no longer leads to its file and starts over (_acquire), so two never hold it at once.
        with contextlib.suppress(OSError):
            path.unlink()
        handle.close()


def _acquire(out: Path, path: Path) -> TextIO:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PrepareError(
            f"{path.parent}: cannot create the parent folder of --out ({exc.strerror or exc}); choose another --out"
        ) from exc
    while True:
        try:
            handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held past this function: the lock)
        except OSError as exc:
            raise PrepareError(
                f"{path}: cannot create the lock file of --out ({exc.strerror or exc}); fix the permissions of "
                f"{path.parent} or choose another --out"
            ) from exc
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(handle)
            handle.close()
            raise PrepareError(
                f"{out} is being prepared by {holder}; wait for it to finish, or stop it and rerun the same "
                f"command to resume its work (lock: {path})"
            ) from None
        except OSError as exc:
            handle.close()
            raise PrepareError(
                f"{path}: cannot lock ({exc.strerror or exc}); this filesystem does not support flock: choose "
                "an --out on a local disk or one that does"
            ) from exc
        if _still_named(handle, path):
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            handle.flush()
            return handle
        handle.close()  # the previous holder removed the file between our open and our lock: again


def _holder(handle: TextIO) -> str:
    handle.seek(0)
    text = handle.read().strip()
    return text or "another process (it is starting)"


def _still_named(handle: TextIO, path: Path) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(handle.fileno())
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)
