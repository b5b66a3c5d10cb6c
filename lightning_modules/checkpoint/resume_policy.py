"""What a run started from a checkpoint (`--ckpt_path`) does with settings that differ from the checkpoint's.

The checkpoint records the model's hyperparameters: model.arch, model.attention, model.optimizer,
model.budget, model.parallel. For each field, the value given (command line or --config fragments) is
compared with the checkpoint's; a value left at the parser's default is "not given" and takes the
checkpoint's.

- refused: model.arch and model.attention (the weights are that model), and for fit model.optimizer (the
  optimizer state and LR schedule are restored from the checkpoint, so a new value would be dropped). The
  message names every differing field with both values.
- applied: model.budget (the run's length: the schedule follows the new max_steps) and model.parallel
  (sharding and activation checkpointing do not change the maths). Each is printed and tagged on the MLflow
  run as `resume.applied`.
- Trainer settings are not in the checkpoint: those given always apply. Data settings that change the data
  order (seed, batch size, world size, workers, shards) are refused by the DataModule when it restores.
"""

from __future__ import annotations

from typing import Any

from lightning_modules.core.errors import UserError

REFUSED = ("arch", "attention")
REFUSED_FOR_FIT = ("optimizer",)
APPLIED = ("budget", "parallel")


def _plain(value: Any) -> Any:
    """Comparable form: Namespaces and dicts to dicts, tuples to lists."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if k != "_instantiator"}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def reconcile(
    given: dict[str, Any], defaults: dict[str, Any], checkpoint: dict[str, Any], subcommand: str, where: str
) -> tuple[dict[str, Any], list[str]]:
    """The model section to run with and the applied differences ("model.budget.tokens: 1e6 -> 2e6"), or a
    UserError listing every refused difference. All three arguments map section -> {field: value} (a
    section may be None)."""
    given, defaults, checkpoint = _plain(given), _plain(defaults), _plain(checkpoint)
    refused_sections = REFUSED + (REFUSED_FOR_FIT if subcommand == "fit" else ())
    merged: dict[str, Any] = {}
    refused: list[str] = []
    applied: list[str] = []
    for section in sorted(set(given) | set(checkpoint)):
        mine, default, saved = given.get(section), defaults.get(section), checkpoint.get(section)
        if not isinstance(mine, dict) or not isinstance(saved, dict):
            # a whole section given on one side only: not given -> the checkpoint's; else the given one
            merged[section] = saved if mine is None or mine == default else mine
            if merged[section] != saved and section in refused_sections:
                refused.append(f"model.{section}: checkpoint {saved!r}, given {mine!r}")
            elif merged[section] != saved:
                applied.append(f"model.{section}: {saved!r} -> {mine!r}")
            continue
        default = default if isinstance(default, dict) else {}
        out = dict(saved)
        for key in sorted(set(mine) | set(saved)):
            value, old = mine.get(key), saved.get(key)
            if value == old or (key in default and value == default[key]) or key not in mine:
                continue  # same, or not given: the checkpoint's value stands
            name = f"model.{section}.{key}"
            if section in refused_sections:
                refused.append(f"{name}: checkpoint {old!r}, given {value!r}")
            else:
                out[key] = value
                applied.append(f"{name}: {old!r} -> {value!r}")
        merged[section] = out
    if refused:
        what = "the model" if subcommand != "fit" else "the model, or the optimizer whose state it restores"
        raise UserError(
            f"--ckpt_path {where}: the settings given differ from the checkpoint's, which fixes {what}: "
            + "; ".join(refused)
            + ". Drop those settings (or give the checkpoint's values) to resume; to train another model, "
            "start a new run without --ckpt_path"
        )
    return merged, applied
