"""Which pairs of arms a study compares, which way round, and the family each belongs to for Holm.

A protocol may declare its primary comparisons (conf/study/<p>.yaml `comparisons: {primary: [[a, b], ...]}`, read
by lightning_modules/study/protocol.py): the questions it was run to answer. Every other pair of arms is secondary
(exploratory). Holm's adjustment (analysis/multiplicity.py) runs within the primary family and, separately, within
the secondary one, per view (equal FLOPs, equal tokens, equal FLOPs on the validation split, pooled), so declaring
a few primary comparisons keeps their correction small while the many secondary pairs still cannot resolve by
chance.

Orientation: a declared pair is a - b as declared; otherwise the baseline attention (mha) is always b, and
between two other arms the later one in the protocol's order minus the earlier (cpu: lrkv-r16 - mla-c128).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from lightning_modules.analysis.multiplicity import holm
from lightning_modules.costs.counts import BASELINE

PRIMARY = "primary"
SECONDARY = "secondary"
Pair = tuple[str, str]


def ordered_pairs(
    labels: Sequence[str], kinds: Mapping[str, str], primary: Iterable[Pair] = ()
) -> list[Pair]:
    """Every unordered pair of `labels` once, as (a, b) for a - b: the declared primary pairs first (in their
    declared order and orientation, those with both arms present), then the rest in the labels' order."""
    present = set(labels)
    declared = [(a, b) for a, b in primary if a in present and b in present]
    seen = {frozenset(p) for p in declared}
    rest: list[Pair] = []
    for j, later in enumerate(labels):
        for earlier in labels[:j]:
            if frozenset((earlier, later)) in seen:
                continue
            if kinds.get(later) == BASELINE and kinds.get(earlier) != BASELINE:
                rest.append((earlier, later))
            else:
                rest.append((later, earlier))
    return declared + rest


def family(a: str, b: str, primary: Iterable[Pair]) -> str:
    return PRIMARY if frozenset((a, b)) in {frozenset(p) for p in primary} else SECONDARY


def with_holm(table: pd.DataFrame, by: Sequence[str] = ("view",)) -> pd.DataFrame:
    """`table` (one row per comparison, columns `family` and `p`) with `p_holm`: Holm within each family of
    each group of `by`, and `resolved` = p_holm < 0.05."""
    table = table.copy()
    table["p_holm"] = float("nan")
    if table.empty:
        table["resolved"] = pd.Series(dtype=bool)
        return table
    for _, group in table.groupby([*by, "family"], sort=False):
        table.loc[group.index, "p_holm"] = holm(list(group["p"]))
    table["resolved"] = table["p_holm"] < 0.05  # NaN (no test) compares False: not resolved
    return table
