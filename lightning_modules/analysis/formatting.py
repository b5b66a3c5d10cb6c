"""How the study's numbers are written in its markdown: a mean with its 95 % interval, signed for differences."""

from __future__ import annotations

import math

import pandas as pd


def md_table(table: pd.DataFrame) -> str:
    header = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def plain(mean: float, low: float, high: float) -> str:
    if math.isnan(mean):
        return ""
    return f"{mean:.4f}" if math.isnan(low) else f"{mean:.4f} [{low:.4f}, {high:.4f}]"


def signed(mean: float, low: float, high: float) -> str:
    if math.isnan(mean):
        return ""
    return f"{mean:+.4f}" if math.isnan(low) else f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]"


def percent(fraction: float) -> str:
    return f"{100 * fraction:.1f} %"


def p_value(p: float) -> str:
    """A p-value as the tables write it: three decimals, "<0.001" below, blank without a test."""
    if p is None or math.isnan(p):
        return ""
    return "<0.001" if p < 0.001 else f"{p:.3f}"
