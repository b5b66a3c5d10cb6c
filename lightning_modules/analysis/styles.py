"""Fixed looks and orders, so that every figure and table reads the same way.

Colours and line styles per attention are declared by each variant class (`plot_style`, in
lightning_modules/model/attention/) and the order is the registry's, so a registered variant appears in every
figure and table without an edit here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

SIZE_ORDER = ("nano", "20m", "128m", "1b", "2.5b", "6.3b", "long-8k")
# A kind that declares no style (or a run of a kind no longer registered) is still drawn, visibly apart.
UNKNOWN_STYLE: dict[str, Any] = {"color": "0.3", "linestyle": "-."}
# Several labels of one attention in a panel (a rank or latent sweep) share its colour and differ by marker.
SWEEP_MARKERS = (None, "o", "s", "^", "v", "D", "P", "X")


def attention_order() -> tuple[str, ...]:
    """The registered attentions in registry order (the cost table's order). Imported when called: the
    registry imports torch, seconds of start-up that a module import should not cost a drawing kernel."""
    from lightning_modules.model.attention import names  # late: the registry imports torch

    return names()


def attention_style(attention: str) -> dict[str, Any]:
    from lightning_modules.model.attention import REGISTRY  # late: the registry imports torch

    cls = REGISTRY.get(attention)
    return dict(cls.plot_style if cls is not None and cls.plot_style else UNKNOWN_STYLE)


def _rank(value: str, order: tuple[str, ...]) -> tuple[int, str]:
    return (order.index(value), "") if value in order else (len(order), value)


def size_sort_key(size: str) -> tuple[int, str]:
    """Known sizes smallest first, unknown ones after them alphabetically."""
    return _rank(size, SIZE_ORDER)


def order_sizes(sizes: Iterable[str]) -> list[str]:
    return sorted(set(sizes), key=size_sort_key)


def label_sort_key(attention: str, label: str) -> tuple[int, str, int, str]:
    """Attentions in the fixed order; within one, labels by their number (lrkv-r8 before lrkv-r16)."""
    position, name = _rank(attention, attention_order())
    digits = "".join(ch for ch in label if ch.isdigit())
    return (position, name, int(digits) if digits else -1, label)
