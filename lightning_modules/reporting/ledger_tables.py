"""The ledger's tables (ledger.py) as pandas frames, restricted to the runs a protocol asks for now.

`runs`: the ledger's runs.csv rows of done runs whose identity is one of the protocol's current identities;
`evaluations`: the evaluations.csv rows of those runs, typed as analysis/tidy.py's tidy table. A run the
ledger names but whose evaluations are missing is an error naming the run: reporting it without its curve
would drop it from some tables and not from others.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lightning_modules.analysis import tidy
from lightning_modules.core.errors import ConfigError
from lightning_modules.study.ledger import DONE_COLUMN, EVALUATIONS, IDENTITY, RUNS, done_identities
from lightning_modules.study.protocol import Protocol

# Read as written: pandas' type guessing turns a resume step "600" in a mostly blank column into 600.0, which the
# next report would write into the ledger, and would read a commit or data hash of digits and one "e" as a float.
TEXT_COLUMNS = (IDENTITY, "data", "run_id", "git_commit", "machine", "device", "hardware", "command",
                "resumed_from_step", "resumed_utc", "settings")  # fmt: skip


@dataclass(frozen=True)
class LedgerTables:
    runs: pd.DataFrame  # runs.csv rows, one per done run of the protocol
    evaluations: pd.DataFrame  # analysis/tidy.py's tidy table of those runs

    @property
    def empty(self) -> bool:
        return self.runs.empty


def read(folder: Path, protocol: Protocol) -> LedgerTables:
    wanted = {spec.identity for spec in protocol.runs} & done_identities(folder)
    if not wanted:
        return LedgerTables(
            pd.DataFrame(columns=[IDENTITY, "run_id"]), pd.DataFrame(columns=list(tidy.COLUMNS))
        )
    runs = pd.read_csv(folder / RUNS, dtype=dict.fromkeys(TEXT_COLUMNS, str))
    runs = runs[runs[IDENTITY].isin(wanted) & runs[DONE_COLUMN].notna()].reset_index(drop=True)
    path = folder / EVALUATIONS
    if not path.is_file():
        raise ConfigError(f"ledger {folder}: {RUNS} names {len(runs)} done runs but {EVALUATIONS} is missing; "
                          f"restore it from git (git checkout -- {path})")  # fmt: skip
    evaluations = pd.read_csv(path, dtype={"run_id": str})
    evaluations = evaluations[evaluations["run_id"].isin(set(runs["run_id"]))]
    tested = set(evaluations.loc[evaluations["split"] == "test", "run_id"])
    lacking = sorted(set(runs["run_id"]) - tested)
    if lacking:
        raise ConfigError(
            f"ledger {folder}: {EVALUATIONS} lacks the test evaluation of runs {', '.join(lacking)} that "
            f"{RUNS} records as done; restore both files from the same commit"
        )
    return LedgerTables(runs, tidy.typed(evaluations.reset_index(drop=True)))
