"""A protocol edited after its runs: refuse, rather than count runs trained another way as done.

A run's identity (protocol.py) is protocol, size, arm label, seed, budget and data, so that adding an option to
the code changes no earlier run. What else the protocol sets (the knobs it names, its `fit` settings: learning
rate, precision, validation) is recorded with each run as `settings` (an MLflow tag, and a column of the
ledger's runs.csv). Before anything trains, the runner compares each done run's record with what the protocol
gives now; a run recorded before settings were (an empty record) is not checked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from lightning_modules.core.errors import ConfigError
from lightning_modules.study.protocol import Protocol, RunSpec

MAX_NAMED = 3  # runs named in the error line


def changes(recorded: str, now: str) -> str:
    """What differs between two settings records, e.g. `fit model.optimizer.lr 0.003 -> 0.0015`."""
    try:
        before, after = json.loads(recorded), json.loads(now)
    except (json.JSONDecodeError, TypeError):
        return f"{recorded!r} -> {now!r}"
    out = []
    for group in sorted(set(before) | set(after)):
        a, b = before.get(group, {}), after.get(group, {})
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                out.append(f"{group} {key} {a.get(key, '(unset)')} -> {b.get(key, '(unset)')}")
    return ", ".join(out)


def check(protocol: Protocol, done: Iterable[tuple[RunSpec, str]]) -> None:
    """ConfigError naming the done runs whose recorded settings differ from the protocol's now."""
    edited = [(spec, recorded) for spec, recorded in done if recorded and recorded != spec.settings]
    if not edited:
        return
    named = "; ".join(
        f"{spec.name}: {changes(recorded, spec.settings)}" for spec, recorded in edited[:MAX_NAMED]
    )
    more = f" and {len(edited) - MAX_NAMED} more" if len(edited) > MAX_NAMED else ""
    raise ConfigError(
        f"study {protocol.name}: {len(edited)} done run(s) were trained with other settings than {protocol.path} "
        f"gives now ({named}{more}); put the protocol back, or save the new settings under a new protocol name "
        "(a new name is a new identity, so its runs train anew)"
    )
