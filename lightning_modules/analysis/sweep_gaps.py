"""Whether a gap between two arms moves from the reference column to another (lightning_modules/commands/sweep.py).

The sweep's differences compare each arm with itself across columns (what the setting does to mha, to lrkv-r16,
...). The question a setting such as the context length (conf/study/long-1k.yaml against main.yaml) raises is
another: does lrkv-r16 - mha change? Per seed that ran all four cells, the change is (a - b in the column) -
(a - b in the reference), a difference of differences; the paired t-test over seeds gives its interval and p,
and Holm adjusts over every (pair, column) in the table. The pairs are every two arms the columns share, the
later in the reference's order minus the earlier, or those given with --pairs (a declared family: the
protocols' primary comparisons, say), read as written.
"""

from __future__ import annotations

from itertools import combinations

import pandas as pd

from lightning_modules.analysis.formatting import md_table, p_value, signed
from lightning_modules.analysis.multiplicity import holm, paired_t
from lightning_modules.analysis.sweep_table import Column, finals
from lightning_modules.core.errors import ConfigError


def parse_pairs(text: str) -> list[tuple[str, str]]:
    """`a:b,c:d` -> [(a, b), (c, d)]: each read as a - b."""
    pairs = []
    for item in text.split(","):
        a, sep, b = item.partition(":")
        if not sep or not a or not b or a == b:
            raise ConfigError(
                f"--pairs {text}: give A:B[,C:D...] of two different arm labels, e.g. lrkv-r16:mha"
            )
        pairs.append((a, b))
    return pairs


def gap_changes(
    columns: list[Column], reference: str, pairs: list[tuple[str, str]] | None = None
) -> pd.DataFrame:
    """One row per (pair, column other than the reference) with a seed that ran all four runs: the gap a - b in
    both, seed-averaged over those seeds, and its change paired by seed with Holm over the rows."""
    losses = {c.name: finals(c) for c in columns}
    if reference not in losses:
        raise ConfigError(f"--reference {reference}: not one of the columns ({', '.join(losses)})")
    ref = losses[reference]
    labels = list(dict.fromkeys(ref.index.get_level_values(0)))
    if pairs is None:
        pairs = [(b, a) for a, b in combinations(labels, 2)]
    unknown = sorted({x for pair in pairs for x in pair} - set(labels))
    if unknown:
        raise ConfigError(f"--pairs names arms the reference {reference} did not run: {', '.join(unknown)}")
    rows = []
    for name, table in losses.items():
        for a, b in pairs if name != reference else []:
            seeds = _common_seeds([(s, label) for s in (table, ref) for label in (a, b)])
            if not seeds:  # the column ran this pair on no seed the reference ran: nothing to compare
                continue
            gap_col = [float(table[a][x] - table[b][x]) for x in seeds]
            gap_ref = [float(ref[a][x] - ref[b][x]) for x in seeds]
            t = paired_t([c - r for c, r in zip(gap_col, gap_ref, strict=True)])
            rows.append({"a": a, "b": b, "column": name, "reference": reference, "n_pairs": len(seeds),
                         "seeds": ", ".join(map(str, seeds)),
                         "gap_reference": sum(gap_ref) / len(seeds), "gap_column": sum(gap_col) / len(seeds),
                         "change": t.estimate, "ci_low": t.low, "ci_high": t.high, "p": t.p})  # fmt: skip
    out = pd.DataFrame(rows)
    if not out.empty:
        out["p_holm"] = holm(list(out["p"]))  # rows of one seed have no p and are not counted
        out["resolved"] = out["p_holm"] < 0.05
    return out


def _common_seeds(cells: list[tuple[pd.Series, str]]) -> list[int]:
    """The seeds on which every (column's losses, arm) cell has a run; none if a cell's arm never ran."""
    have = [
        set(losses[label].index) if label in losses.index.get_level_values(0) else set()
        for losses, label in cells
    ]
    return sorted(set.intersection(*have))


def gaps_section(gaps: pd.DataFrame, reference: str) -> list[str]:
    """The page's section: each gap in the reference and in the column, and its change with Holm's p."""
    if gaps.empty:
        return []
    tested = int(gaps["p"].notna().sum())
    lines = ["", f"## Gaps between arms: each column against {reference}", "",
             f"a - b in {reference} and in each column over the seeds that ran all four runs, and its change "
             "(column minus reference, paired by seed: a difference of differences); Holm over the rows "
             f"with two seeds or more ({tested}; lightning_modules/analysis/sweep_gaps.py).", ""]  # fmt: skip
    rows = [
        {"pair": f"{g['a']} - {g['b']}", "column": g["column"], "seeds": g["n_pairs"],
         f"gap in {reference}": f"{g['gap_reference']:+.4f}", "gap in column": f"{g['gap_column']:+.4f}",
         "change": signed(g["change"], g["ci_low"], g["ci_high"]), "p": p_value(g["p"]),
         "Holm p": p_value(g["p_holm"]), "resolved": "yes" if g["resolved"] else "no"}
        for _, g in gaps.iterrows()
    ]  # fmt: skip
    return lines + md_table(pd.DataFrame(rows)).splitlines()
