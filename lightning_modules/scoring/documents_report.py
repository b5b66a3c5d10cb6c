"""How far other evaluation documents would move a study's gaps: every document's loss under every run's final
checkpoint on this machine, and the document standard error of each pair beside the ledger's seed standard error
(lightning_modules/analysis/documents.py says what each figure is).

    python -m lightning_modules score-documents results/main --checkpoints checkpoints/study/main

(the command: lightning_modules/commands/score_documents.py)

Reads the ledger (results/<protocol>/runs.csv, pairs.csv from `--report`) and the runs' final checkpoints (the
runner's folders, <run name>-<run id[:8]>/last.ckpt). Only runs of the ledger whose checkpoint is at the run's
last step count, and each must reproduce its ledger test and last validation loss to 1e-4 nats, or the command
stops naming it.
Writes into the ledger folder (or --out) per_document.csv (one row per run, split and document: the record
that outlives the checkpoints; a later call on another machine adds the runs it has and scores no run twice),
documents.csv (one row per pair and split) and documents.md (the table), and prints the table.
"""

from __future__ import annotations

import datetime
import math
import sys
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from lightning_modules.analysis.documents import COLUMNS, PAGE, PER_DOCUMENT, TABLE, pair_row
from lightning_modules.analysis.pairwise import EQUAL_FLOPS, EQUAL_FLOPS_VAL
from lightning_modules.core.errors import ConfigError
from lightning_modules.core.files import write_text_atomic
from lightning_modules.generation.checkpoint import load_model
from lightning_modules.scoring.document_scores import data_dir_of, score_documents

PROG = "python -m lightning_modules score-documents"
TOLERANCE = 1e-4  # nats: a checkpoint scored again must give its run's logged loss (fp32 both times)
VIEWS = {"test": EQUAL_FLOPS, "val": EQUAL_FLOPS_VAL}  # pairs.csv's view of each split at the end of training
Z95 = 1.959964


def read_csv(path: Path, what: str) -> pd.DataFrame:
    if not path.is_file():
        raise ConfigError(f"no {path}: {what}")
    return pd.read_csv(path)


def checkpoint_of(folder: Path, run: pd.Series) -> Path | None:
    """The run's last.ckpt in the runner's folder naming (lightning_modules/study/runner.py), if there is one."""
    path = folder / f"{run['run_name']}-{str(run['run_id'])[:8]}" / "last.ckpt"
    return path if path.is_file() else None


def last_validation(evaluations: pd.DataFrame, run_id: str) -> float:
    val = evaluations[(evaluations["run_id"] == run_id) & (evaluations["split"] == "val")]
    return float(val.sort_values("step")["loss"].iloc[-1]) if len(val) else math.nan


def check(scored: pd.DataFrame, run: pd.Series, expected: dict[str, float], path: Path) -> None:
    for split, want in expected.items():
        part = scored[scored["split"] == split]
        got = part["loss_sum"].sum() / part["tokens"].sum()
        if math.isfinite(want) and abs(got - want) > TOLERANCE:
            raise ConfigError(
                f"{path}: scores {split} loss {got:.6f}, the ledger says {want:.6f} for {run['run_name']}; "
                "not the run's final checkpoint or not its data: move it aside and run again"
            )


def score_new(
    runs: pd.DataFrame, evaluations: pd.DataFrame, folder: Path, done: pd.DataFrame, batch_size: int
) -> pd.DataFrame:
    """Score the ledger's runs that have a final checkpoint here and no rows in `done` yet."""
    have = set(zip(done["label"], done["seed"], strict=True))
    todo = [(run, path) for _, run in runs.iterrows()
            if (run["label"], int(run["seed"])) not in have and (path := checkpoint_of(folder, run)) is not None]  # fmt: skip
    frames = [done]
    for run, path in todo:
        model, checkpoint = load_model(path)  # the decoder as generation loads it: the same safe reader
        step = int(checkpoint.get("global_step", -1))
        # Lightning's global_step in a checkpoint written at the end is the run's steps or one more
        if step < int(run["steps"]):
            print(f"skipped {run['run_name']}: {path} is at step {step} of {run['steps']}", file=sys.stderr)
            continue
        with tqdm(desc=f"{run['run_name']}", unit="sample", file=sys.stderr, leave=False) as bar:
            scored = score_documents(
                model, data_dir_of(checkpoint, path), batch_size=batch_size, progress=bar.update
            )
        check(scored, run, {"test": float(run["test_loss"]), "val": last_validation(evaluations, run["run_id"])},
              path)  # fmt: skip
        frames.append(scored.assign(label=run["label"], seed=int(run["seed"]))[list(COLUMNS)])
        print(f"scored {run['run_name']} ({path})", file=sys.stderr)
    return pd.concat(frames, ignore_index=True)


def table(per_doc: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Every pair of pairs.csv (its order and family) on each split: the documents' figures from `per_doc`, the
    seeds' from the ledger (all its seeds), and both together."""
    rows = []
    for split, view in VIEWS.items():
        for _, p in pairs[pairs["view"] == view].iterrows():
            row = pair_row(per_doc, p["a"], p["b"], split)
            seed_se = float(p["diff_sd"]) / math.sqrt(p["n_pairs"]) if p["n_pairs"] > 1 else math.nan
            # The cross-seed estimate rests on few seed pairs (often one) and is clipped at 0; the spread of the
            # seed-averaged differences holds the documents' part and more (analysis/documents.py), so the
            # combined figures take it: they err wide rather than narrow.
            both = math.sqrt(seed_se**2 + row["doc_se_with_noise"] ** 2)
            rows.append(row | {"family": p["family"], "ledger_pairs": int(p["n_pairs"]),
                               "ledger_diff": float(p["diff_mean"]), "ledger_seed_se": seed_se,
                               "combined_se": both, "combined_low": float(p["diff_mean"]) - Z95 * both,
                               "combined_high": float(p["diff_mean"]) + Z95 * both})  # fmt: skip
    return pd.DataFrame(rows)


def markdown(result: pd.DataFrame) -> str:
    def num(v: float, signed: bool = False) -> str:
        return "" if not math.isfinite(v) else (f"{v:+.4f}" if signed else f"{v:.4f}")

    lines = [
        "| split | a - b | family | ledger diff (seeds) | seed SE | checkpoint seeds | document SE, cross-seed | "
        "document SE, at most | documents | combined SE | diff +/- 1.96 combined SE |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.to_dict("records"):
        lines.append(
            f"| {r['split']} | {r['a']} - {r['b']} | {r['family']} | {num(r['ledger_diff'], True)} "
            f"({r['ledger_pairs']}) | {num(r['ledger_seed_se'])} | {r['seeds'] or '-'} | {num(r['doc_se'])} | "
            f"{num(r['doc_se_with_noise'])} | {r['n_documents']} | {num(r['combined_se'])} | "
            f"[{num(r['combined_low'], True)}, {num(r['combined_high'], True)}] |"
        )
    return "\n".join(lines) + "\n"


def page(result: pd.DataFrame, per_doc: pd.DataFrame, ledger: Path, argv: list[str]) -> str:
    """documents.md: what the table is, which checkpoints it rests on, the table."""
    runs = per_doc.groupby("label")["seed"].unique()  # labels in order, as per_document.csv has them
    scored = "; ".join(f"{label} seeds {', '.join(map(str, sorted(seeds)))}" for label, seeds in runs.items())
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            f"# Seeds and documents: `{ledger.name}`",
            "",
            "The seed standard error of each pair (the ledger's `pairs.csv`, every seed) beside the standard error the "
            "evaluation documents add (from the final checkpoints scored here, document by document), and the two "
            "together: how far other text like this corpus's could move each gap. docs/statistics.md, \"Seeds and "
            'documents", says how each figure is taken. The cross-seed estimate needs two scored seeds and rests on '
            'their few pairs; the combined figures take the larger "at most" one, so they err wide.',
            "",
            f"- Checkpoints scored ({PER_DOCUMENT}): {scored}. Each reproduced its run's ledger test and last "
            f"validation loss to {TOLERANCE:g} nats.",
            f"- Written {when} by `{PROG} {' '.join(argv)}`.",
            "",
            markdown(result),
        ]
    )


def score_ledger(ledger: Path, checkpoints: Path, out: Path | None, batch_size: int, argv: list[str]) -> str:
    """Score the ledger's runs not scored yet under their final checkpoints, write per_document.csv,
    documents.csv and documents.md into `out` (default: the ledger) and return the table as markdown."""
    out = out or ledger
    if batch_size < 1:
        raise ConfigError(f"--batch-size {batch_size}: give a positive number of samples")
    if not checkpoints.is_dir():
        raise ConfigError(f"--checkpoints {checkpoints}: no such folder; give the study's checkpoint folder")
    report = "report the protocol first (python -m lightning_modules study conf/study/<p>.yaml --report)"
    runs = read_csv(ledger / "runs.csv", report)
    pairs = read_csv(ledger / "pairs.csv", report)
    if EQUAL_FLOPS_VAL not in set(pairs["view"]):
        raise ConfigError(f"{ledger / 'pairs.csv'} predates the validation-split view: {report}")
    evaluations = read_csv(ledger / "evaluations.csv", report)
    previous = out / PER_DOCUMENT
    done = pd.read_csv(previous) if previous.is_file() else pd.DataFrame(columns=list(COLUMNS))
    per_doc = score_new(runs, evaluations, checkpoints, done, batch_size)
    if per_doc.empty:
        raise ConfigError(f"{checkpoints}: no final checkpoint of a run in {ledger / 'runs.csv'}")
    result = table(per_doc, pairs)
    out.mkdir(parents=True, exist_ok=True)
    # the record that outlives the checkpoints: replaced whole or not at all
    write_text_atomic(
        previous, per_doc.sort_values(["label", "seed", "split", "document"]).to_csv(index=False)
    )
    result.to_csv(out / TABLE, index=False)
    (out / PAGE).write_text(page(result, per_doc, ledger, argv))
    return markdown(result) + f"written: {previous}, {out / TABLE}, {out / PAGE}\n"
