"""Noise against run length from a committed ledger: the table that sizes a study (lightning_modules/analysis/noise.py).

    python -m lightning_modules noise results/pilot --arm lrkv-r16 --baseline mha --target 0.015

Reads results/<protocol>/evaluations.csv (every validation of every done run), writes noise.csv and noise.png into
the ledger folder (or --out) and prints the table (markdown): per validation token count, the paired
difference's mean and sd over seeds, its half-width with the seeds at hand, the seeds --target needs, and each
arm's own sd.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from lightning_modules.analysis.noise import noise_vs_tokens, plot_noise
from lightning_modules.core import errors
from lightning_modules.core.errors import ConfigError
from lightning_modules.study.ledger import EVALUATIONS

PROG = "python -m lightning_modules noise"


def markdown(table: pd.DataFrame, arm: str, baseline: str, target: float) -> str:
    need = f"seeds_for_{target:g}"
    lines = [
        f"Paired {arm} - {baseline}, validation CE (nats/token) at the baseline's validations; "
        f"seeds for a 95 % half-width of {target:g} at each sd.",
        "",
        f"| tokens | pairs | mean diff | sd of diff | half-width | seeds for +/-{target:g} | sd {arm} | sd {baseline} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table.to_dict("records"):
        seeds = "-" if pd.isna(r[need]) else f"{int(r[need])}"
        lines.append(
            f"| {r['tokens']:,.0f} | {r['pairs']} | {r['mean_diff']:+.4f} | {r['sd_diff']:.4f} | "
            f"{r['half_width']:.4f} | {seeds} | {r[f'sd_{arm}']:.4f} | {r[f'sd_{baseline}']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument(
        "ledger", type=Path, help="a results folder with evaluations.csv (results/<protocol>)"
    )
    parser.add_argument("--arm", required=True, help="arm label, e.g. lrkv-r16")
    parser.add_argument("--baseline", default="mha", help="arm label the arm is paired with (default mha)")
    parser.add_argument("--target", type=float, default=0.015, help="95 %% half-width to size for (nats)")
    parser.add_argument("--split", default="val", help="evaluation split (default val)")
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for noise.csv and noise.png (default: the ledger)"
    )
    args = parser.parse_args(argv)
    out = args.out or args.ledger
    try:
        path = args.ledger / EVALUATIONS
        if not path.is_file():
            raise ConfigError(
                f"no {path}: report the protocol first (python -m lightning_modules study ... --report)"
            )
        table = noise_vs_tokens(pd.read_csv(path), args.arm, args.baseline, args.target, args.split)
        text = markdown(table, args.arm, args.baseline, args.target)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "noise.csv", index=False)
        plot_noise(table, args.arm, args.baseline, args.target).savefig(out / "noise.png", dpi=120)
    except (errors.UserError, ValueError, OSError) as e:
        errors.report(e, PROG)
        return 2
    print(text, end="")
    print(f"written: {out / 'noise.csv'}, {out / 'noise.png'}")
    return 0
