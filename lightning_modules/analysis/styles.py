"""Fixed looks and orders, so that every figure and table reads the same way.

Colours and line styles per attention are fixed project-wide (issue 7): baselines with a per-head cache
(mha, lrkv) solid, the sharing baselines (mqa, gqa) dashed, mla dotted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

SIZE_ORDER = ("nano", "20m", "128m", "1b", "2.5b", "6.3b", "long-8k")
# The cost table's order (lightning_modules.costs.ATTENTIONS; a test keeps them equal). Not imported from
# there because costs imports torch, seconds of start-up in every notebook kernel that only draws.
ATTENTION_ORDER = ("mha", "mqa", "gqa", "mla", "lrkv")

ATTENTION_STYLES: dict[str, dict[str, Any]] = {
    "mha": {"color": "tab:blue", "linestyle": "-"},
    "lrkv": {"color": "tab:red", "linestyle": "-"},
    "mqa": {"color": "tab:green", "linestyle": "--"},
    "gqa": {"color": "tab:orange", "linestyle": "--"},
    "mla": {"color": "tab:purple", "linestyle": ":"},
}
# A kind added to the registry later still gets drawn, visibly apart from the five.
UNKNOWN_STYLE: dict[str, Any] = {"color": "0.3", "linestyle": "-."}
# Several labels of one attention in a panel (a rank or latent sweep) share its colour and differ by marker.
SWEEP_MARKERS = (None, "o", "s", "^", "v", "D", "P", "X")


def attention_style(attention: str) -> dict[str, Any]:
    return dict(ATTENTION_STYLES.get(attention, UNKNOWN_STYLE))


def _rank(value: str, order: tuple[str, ...]) -> tuple[int, str]:
    return (order.index(value), "") if value in order else (len(order), value)


def size_sort_key(size: str) -> tuple[int, str]:
    """Known sizes smallest first, unknown ones after them alphabetically."""
    return _rank(size, SIZE_ORDER)


def order_sizes(sizes: Iterable[str]) -> list[str]:
    return sorted(set(sizes), key=size_sort_key)


def label_sort_key(attention: str, label: str) -> tuple[int, str, int, str]:
    """Attentions in the fixed order; within one, labels by their number (lrkv-r8 before lrkv-r16)."""
    position, name = _rank(attention, ATTENTION_ORDER)
    digits = "".join(ch for ch in label if ch.isdigit())
    return (position, name, int(digits) if digits else -1, label)
