"""One setting swept across protocols that differ only in it (e.g. the learning rate: conf/study/lr-x0.5.yaml,
lr-x1.yaml, lr-x2.yaml), read from their committed ledgers (results/<protocol>/runs.csv, ledger.py).

    python -m lightning_modules sweep --column 0.5x=results/lr-x0.5 --column 1x=results/lr-x1 \\
        --column 2x=results/lr-x2 --reference 1x --out results/lr-check

A column is a name and one or more ledger folders (comma-separated: their runs are pooled, e.g. the same
setting run under two protocols); arms are matched by label and seed. Per arm, over the seeds every column
ran: the mean final test CE and its 95 % t-interval in every column, the best column by mean, and each column minus the reference paired by seed,
with the paired t-test's p and Holm's adjustment over all (arm, column) comparisons (docs/statistics.md).
The question it answers: does any arm's best setting differ from the common one, beyond seed noise?
Along the run, each column minus the reference on the validation curves (lightning_modules/analysis/sweep_curves.py).
Between arms, whether a gap (lrkv-r16 - mha, say) moves from the reference to a column: a difference of
differences paired by seed (lightning_modules/analysis/sweep_gaps.py; --pairs names the family, default every pair).
Writes sweep.csv, differences.csv, curves.csv, gaps.csv and README.md into --out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning_modules.analysis.sweep_curves import curve_differences, curves_section
from lightning_modules.analysis.sweep_gaps import gap_changes, gaps_section, parse_pairs
from lightning_modules.analysis.sweep_table import Column, page, sweep
from lightning_modules.core import errors
from lightning_modules.study.ledger import EVALUATIONS, RUNS

PROG = "python -m lightning_modules sweep"


def parse_column(text: str) -> Column:
    name, sep, folders = text.partition("=")
    if not sep or not name or not folders:
        raise argparse.ArgumentTypeError(f"{text}: give NAME=FOLDER[,FOLDER...], e.g. 1x=results/lr-x1")
    return Column(name, tuple(Path(f) for f in folders.split(",") if f), RUNS, EVALUATIONS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--column", type=parse_column, action="append", required=True, help="NAME=FOLDER[,...]"
    )
    parser.add_argument("--reference", required=True, help="the column the others are compared with")
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder for sweep.csv, differences.csv, curves.csv, gaps.csv, README.md",
    )
    parser.add_argument(
        "--pairs",
        default=None,
        help="A:B[,C:D...]: the gaps a - b whose change is tested (default: every pair)",
    )
    args = parser.parse_args(argv)
    try:
        table, differences = sweep(args.column, args.reference)
        curves = curve_differences(args.column, args.reference)
        pairs = parse_pairs(args.pairs) if args.pairs is not None else None
        gaps = gap_changes(args.column, args.reference, pairs)
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "sweep.csv", index=False)
        differences.to_csv(args.out / "differences.csv", index=False)
        curves.to_csv(args.out / "curves.csv", index=False)
        gaps.to_csv(args.out / "gaps.csv", index=False)
        text = page(args.column, args.reference, table, differences)
        sections = [*curves_section(curves, args.reference), *gaps_section(gaps, args.reference)]
        (args.out / "README.md").write_text(text + "".join(f"{line}\n" for line in sections))
    except (errors.UserError, OSError) as e:
        errors.report(e, PROG)
        return 2
    print(f"sweep of {len(table)} arms over {len(args.column)} columns: {args.out}/README.md")
    return 0
