"""The one error path of the entry points (main.py, python -m lightning_modules prepare, python -m lightning_modules generate),
and the root of every anticipated failure.

An anticipated failure (bad input, a missing or damaged file, an unreachable store) ends with ONE line on
stderr, `<prog>: error: <message>`, where the message names the thing and what to do, and a non-zero exit
code; anything else is a bug and keeps its traceback. `LRKV_DEBUG=1` shows the traceback of anticipated
failures too.

Anticipated failures are UserError and its subclasses: ConfigError (this module), DataError (data/data_errors.py),
the tracking store's TrackingUnreachableError (lightning_modules/tracking/store.py) and each command's own. Each
subclasses UserError where it is defined, so this module imports nothing of the project and the error path
needs no list of them.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

DEBUG_ENV = "LRKV_DEBUG"


class UserError(Exception):
    """An anticipated failure; the message names the file, option or service and what to do about it."""


class ConfigError(UserError, ValueError):
    """A configuration that cannot be built; the message names the field and what is allowed."""


def one_line(exc: BaseException) -> str:
    """The message of an anticipated failure on one line. A DataLoader worker's exception arrives re-raised
    with the worker's traceback inside its message; its last line holds the original message."""
    text = str(exc).strip()
    if "Original Traceback" in text:
        last = text.splitlines()[-1]
        name, sep, rest = last.partition(": ")
        text = rest if sep and name.rsplit(".", 1)[-1] == type(exc).__name__ else last
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def report(exc: BaseException, prog: str) -> None:
    if debugging():
        traceback.print_exception(exc, file=sys.stderr)
    else:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)


def run_entry(fn: Callable[[], int | None], prog: str, code: int = 2) -> int:
    """Run an entry point's body; an anticipated failure is reported on one line and returns `code`."""
    try:
        result = fn()
    except UserError as exc:
        sys.stdout.flush()
        report(exc, prog)
        return code
    return int(result or 0)
