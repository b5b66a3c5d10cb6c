"""python -m lightning_modules study PROTOCOL.yaml [--workers N] [--report]; see lightning_modules/study/."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from lightning_modules.analysis.analysis_errors import AnalysisError
from lightning_modules.core import errors
from lightning_modules.tracking import store as tracking

PROG = "python -m lightning_modules study"


def _number(text: str) -> float:
    """A finite number, else NaN (which every bound below refuses)."""
    try:
        value = float(text)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan


def _seconds(text: str) -> float:
    """A wait in seconds: a finite number >= 0 (argparse names the option when this raises)."""
    value = _number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be a number of seconds >= 0")
    return value


def _hours(text: str) -> float:
    """A window in hours: a finite number > 0."""
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be a number of hours > 0")
    return value


def _count(text: str) -> int:
    """A number of runs at once: an integer >= 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be a whole number >= 1")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run a study protocol's runs that are not done yet (resumable), or report it from the store.",
    )
    parser.add_argument("protocol", type=Path, help="conf/study/<name>.yaml")
    parser.add_argument("--workers", type=_count, default=1, help="runs trained at once on this machine")
    parser.add_argument(
        "--report", action="store_true", help="write results/<protocol>/ from the store; train nothing"
    )
    parser.add_argument(
        "--plan", action="store_true", help="print what is done and what would run; train nothing"
    )
    parser.add_argument("--out", type=Path, default=None, help="report folder (default: results/<protocol>)")
    parser.add_argument(
        "--ledger", type=Path, default=None,
        help="the committed results ledger whose done runs count as done (default: results/<protocol>)",
    )  # fmt: skip
    parser.add_argument(
        "--max-runs", type=_count, default=None,
        help="start at most N of the runs not done, in protocol order (what fits before this machine goes: "
        "only finished runs reach the committed ledger)",
    )  # fmt: skip
    parser.add_argument(
        "--hours", type=_hours, default=None,
        help="start a run only if the runs done on machines like this one say it ends within H hours of now "
        "(an untimed run starts, with a warning); the rest are left for a later run",
    )  # fmt: skip
    parser.add_argument("--checkpoints", type=Path, default=Path("checkpoints"), help="checkpoint root")
    parser.add_argument("--settle-s", type=_seconds, default=2.0, help="wait after claiming (store.py)")
    parser.add_argument(
        "--stale-after-s", type=_seconds, default=600.0, help="heartbeat age of a stale claim (>= 60)"
    )
    args = parser.parse_args(argv)
    # After parsing: --help and a bad option answer without importing the training stack (Lightning, torch).
    from lightning_modules.study import protocol as protocols
    from lightning_modules.study.claims import Store

    try:
        protocol = protocols.load(args.protocol)
        uri = tracking.tracking_uri()
        if args.report:
            from lightning_modules.reporting import report  # pandas and matplotlib: only a report needs them

            report.write(protocol, uri, args.out, args.ledger)
            return 0
        tracking.check_reachable(uri)
        # A stale age the claim rule cannot work with is refused here, before anything is claimed.
        store = Store(uri, protocol.experiment, args.settle_s, args.stale_after_s)
        from lightning_modules.study.runner import Runner  # only once the store answered

        command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
        runner = Runner(
            protocol, store, args.workers, args.checkpoints, command, args.ledger, args.max_runs, args.hours
        )
        if args.plan:
            plan = runner.survey()
            print(runner.describe(plan))
            for spec, found in plan:
                print(f"  {found.state:<8} {spec.name} ({spec.identity})")
            return 0
        return runner.run()
    except (errors.UserError, AnalysisError, ValueError, OSError) as e:
        sys.stdout.flush()
        errors.report(e, PROG)
        return 2
