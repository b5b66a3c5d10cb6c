"""Every command of the project, one thin module a verb: each parses its arguments and calls the library.

    python -m lightning_modules <verb> [args]      # the dispatcher: lightning_modules/__main__.py
    python -m lightning_modules --help             # the verbs, one line each

`python main.py fit|validate|test --config ...` (LightningCLI) is the one entry point outside this folder.
A command module defines no class and no `__main__` guard, and nothing but the dispatcher imports it
(tests/test_dependencies.py). The verbs and their modules:

- compare.py          compare           train every attention under one budget, test each, print the table
- consolidate.py      consolidate       a sharded (FSDP) checkpoint folder into one file
- cost_report.py      costs             parameters, FLOPs, KV-cache bytes and memory per size and attention
- generate.py         generate          text from a checkpoint, with the KV cache
- mlflow_ui.py        mlflow-ui         the MLflow UI on the project's store
- noise_table.py      noise             noise against run length from a committed ledger
- prepare.py          prepare           tokenized WebDataset shards and their manifest from a corpus
- replay_pending.py   replay            send the MLflow calls a run saved while its store was away
- run_notebooks.py    notebooks         execute the analysis notebooks headless, collect their figures
- run_study.py        study             run a study protocol's runs not done yet, or report it
- score_documents.py  score-documents   every document's loss under a study's final checkpoints
- study_worker.py     study-worker      one study run in its own process (the runner starts it)
- sweep.py            sweep             one setting swept across protocols, from their ledgers
- verify.py           verify            check a dataset folder's shards against its manifest
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import cast

# verb -> (module of this folder, one line of help); the order is the order of `--help`
VERBS: dict[str, tuple[str, str]] = {
    "compare": ("compare", "train every attention under one budget, test each, print the table (make demo)"),
    "study": ("run_study", "run a study protocol's runs not done yet, or --report it into results/"),
    "prepare": ("prepare", "tokenized WebDataset shards and their manifest from a corpus"),
    "verify": ("verify", "check a dataset folder's shards against its manifest"),
    "costs": ("cost_report", "parameters, FLOPs, KV-cache bytes and the memory plan per size and attention"),
    "generate": ("generate", "text from a checkpoint, with the KV cache"),
    "consolidate": ("consolidate", "a sharded (FSDP) checkpoint folder into one file"),
    "mlflow-ui": ("mlflow_ui", "the MLflow UI on the project's store"),
    "replay": ("replay_pending", "send the MLflow calls a run saved while its store was away"),
    "notebooks": ("run_notebooks", "execute the analysis notebooks headless and collect their figures"),
    "sweep": ("sweep", "one setting swept across protocols, read from their committed ledgers"),
    "noise": ("noise_table", "noise against run length from a committed ledger: what sizes a study"),
    "score-documents": ("score_documents", "every document's loss under a study's final checkpoints"),
    "study-worker": ("study_worker", "one study run in its own process (started by the study runner)"),
}
PROG = "python -m lightning_modules"


def usage() -> str:
    width = max(map(len, VERBS))
    lines = [f"usage: {PROG} <command> [args]   ({PROG} <command> --help for its options)", "", "commands:"]
    lines += [f"  {verb:<{width}}  {help_}" for verb, (_, help_) in VERBS.items()]
    lines += [
        "",
        "training, validation and test: python main.py fit|validate|test --config ... (LightningCLI)",
    ]
    return "\n".join(lines)


def command(verb: str) -> Callable[[list[str]], int]:
    """The `main` of a verb's module, imported only when that verb runs (each pulls in its own stack)."""
    module = importlib.import_module(f"{__name__}.{VERBS[verb][0]}")
    return cast("Callable[[list[str]], int]", module.main)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    verb, rest = args[0], args[1:]
    if verb not in VERBS:
        print(f"{PROG}: error: no command {verb!r}; choose one of: {', '.join(VERBS)}", file=sys.stderr)
        return 2
    return command(verb)(rest)
