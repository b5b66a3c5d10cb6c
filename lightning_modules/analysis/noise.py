"""How the seed-to-seed noise of a paired difference changes with the length of a run, and how many seeds a
target precision needs: what sizes a study (the pilot, conf/study/pilot.yaml; docs/statistics.md, "Sizing a
study from the pilot").

At every validation of the baseline, each seed's difference arm - baseline is read at the baseline's token
count (the arm's curve interpolated linearly in tokens, never extrapolated: lightning_modules/analysis/
equal_tokens.py), so the two runs of a pair are compared at equal tokens even where their steps differ. Over the
seeds: the mean difference, its sd, the 95 % t half-width with the seeds at hand, and the seeds a target
half-width needs at that sd, t(0.975, n - 1) sd / sqrt(n) <= target. Each arm's own seed sd sits beside it, so
what pairing buys is visible.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from scipy.special import stdtrit  # the t quantile; scipy.stats would cost a second to import

from lightning_modules.analysis.equal_tokens import loss_at
from lightning_modules.analysis.tidy import require_columns

MAX_SEEDS = 10_000  # beyond this a target is out of reach: reported as NaN, not as a number to plan with
COLUMNS = ("label", "seed", "split", "tokens", "loss")


def half_width(sd: float, n: int, confidence: float = 0.95) -> float:
    """The two-sided t half-width of a mean of n paired differences of sample sd `sd`; NaN for n < 2."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    return float(stdtrit(n - 1, (1 + confidence) / 2)) * sd / math.sqrt(n)


def seeds_needed(sd: float, target: float, confidence: float = 0.95) -> float:
    """The fewest seeds n >= 2 whose half-width at sd `sd` is at most `target` (NaN past MAX_SEEDS or for an
    unknown sd)."""
    if not target > 0:
        raise ValueError(f"target half-width {target}: must be > 0")
    if not math.isfinite(sd):
        return math.nan
    n = 2
    while half_width(sd, n, confidence) > target:
        n += 1
        if n > MAX_SEEDS:
            return math.nan
    return float(n)


def noise_vs_tokens(
    evaluations: pd.DataFrame, arm: str, baseline: str, target: float, split: str = "val"
) -> pd.DataFrame:
    """One row per validation token count of the baseline (the table the module docstring describes)."""
    require_columns(evaluations, COLUMNS, "evaluations")
    rows = evaluations[evaluations["split"] == split]
    for label in (arm, baseline):
        if not (rows["label"] == label).any():
            found = ", ".join(sorted(rows["label"].unique())) or "none"
            raise ValueError(f"no {split} evaluations of arm {label!r} (arms: {found})")
    curves = {(label, seed): curve for (label, seed), curve in rows.groupby(["label", "seed"])}
    seeds = sorted(s for (label, s) in curves if label == baseline and (arm, s) in curves)
    out = []
    for tokens in sorted(rows.loc[rows["label"] == baseline, "tokens"].unique()):
        diffs, arm_losses, base_losses = [], [], []
        for seed in seeds:
            a, b = loss_at(curves[arm, seed], tokens), loss_at(curves[baseline, seed], tokens)
            if math.isfinite(a) and math.isfinite(b):
                diffs.append(a - b)
                arm_losses.append(a)
                base_losses.append(b)
        n = len(diffs)
        sd = float(np.std(diffs, ddof=1)) if n >= 2 else math.nan
        out.append(
            {
                "tokens": float(tokens),
                "pairs": n,
                "mean_diff": float(np.mean(diffs)) if n else math.nan,
                "sd_diff": sd,
                "half_width": half_width(sd, n),
                f"seeds_for_{target:g}": seeds_needed(sd, target),
                f"sd_{arm}": float(np.std(arm_losses, ddof=1)) if n >= 2 else math.nan,
                f"sd_{baseline}": float(np.std(base_losses, ddof=1)) if n >= 2 else math.nan,
            }
        )
    return pd.DataFrame(out)


def plot_noise(table: pd.DataFrame, arm: str, baseline: str, target: float) -> Figure:
    """The paired sd against training tokens beside each arm's own seed sd: where the curve crosses the sd
    a target needs is how long the main study's runs should be."""
    fig = Figure(figsize=(7.0, 4.2))
    ax = fig.add_subplot()
    if not (table["sd_diff"] > 0).any():  # fewer than 2 seeds paired so far: no sd to draw
        ax.text(
            0.5,
            0.5,
            "no sd yet: it needs 2 seeds of each arm",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        ax.set_axis_off()
        return fig
    ax.plot(table["tokens"], table["sd_diff"], "o-", color="tab:red", label=f"{arm} - {baseline}, paired")
    ax.plot(table["tokens"], table[f"sd_{arm}"], ".--", color="tab:blue", label=f"{arm} alone")
    ax.plot(table["tokens"], table[f"sd_{baseline}"], ".--", color="tab:grey", label=f"{baseline} alone")
    for n in (5, 10):  # the sd at which n seeds reach the target half-width
        level = target * math.sqrt(n) / float(stdtrit(n - 1, 0.975))
        ax.axhline(level, color="black", linewidth=0.7, linestyle=":")
        ax.annotate(f"{n} seeds reach +/-{target:g}", (table["tokens"].min(), level), fontsize=7, va="bottom")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("sd over seeds of validation CE (nats/token)")
    ax.set_title(f"noise against run length ({int(table['pairs'].max())} seeds)")
    ax.legend(fontsize=8)
    return fig
