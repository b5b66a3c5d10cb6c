"""The one error path of the entry points (main.py, python -m data.prepare, python -m lightning_modules.generate).

An anticipated failure (bad input, a missing or damaged file, an unreachable store) ends with ONE line on
stderr, `<prog>: error: <message>`, where the message names the thing and what to do, and a non-zero exit
code; anything else is a bug and keeps its traceback. `LRKV_DEBUG=1` shows the traceback of anticipated
failures too.

Anticipated failures are UserError (this module), DataError (data/errors.py), ConfigError
(lightning_modules/config.py) and the tracking store's TrackingUnreachableError, subclasses included.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

DEBUG_ENV = "LRKV_DEBUG"


class UserError(Exception):
    """An anticipated failure; the message names the file, option or service and what to do about it."""


def known_errors() -> tuple[type[BaseException], ...]:
    # Imported here: data.prepare uses this module and must not pay for importing the training stack.
    from data.errors import DataError
    from lightning_modules.config import ConfigError
    from lightning_modules.tracking import TrackingUnreachableError

    return (UserError, DataError, ConfigError, TrackingUnreachableError)


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
    except known_errors() as exc:
        sys.stdout.flush()
        report(exc, prog)
        return code
    return int(result or 0)
