"""Readable axis units. Paper-size runs reach tens to thousands of ExaFLOPs (docs/paper-errata.md) while a CPU run
reaches PetaFLOPs or less, so the unit is chosen per axis from the largest value, and always named in full."""

from __future__ import annotations

from dataclasses import dataclass

FLOP_UNITS = (
    (1e18, "ExaFLOPs"),
    (1e15, "PetaFLOPs"),
    (1e12, "TeraFLOPs"),
    (1e9, "GigaFLOPs"),
    (1.0, "FLOPs"),
)
TOKEN_UNITS = ((1e9, "billions"), (1e6, "millions"), (1e3, "thousands"), (1.0, ""))


@dataclass(frozen=True)
class Unit:
    scale: float  # divide raw values by this
    name: str


def _pick(max_value: float, units: tuple[tuple[float, str], ...]) -> Unit:
    for scale, name in units:
        if max_value >= scale:
            return Unit(scale, name)
    return Unit(*units[-1])


def flops_unit(max_flops: float) -> Unit:
    return _pick(max_flops, FLOP_UNITS)


def tokens_unit(max_tokens: float) -> Unit:
    return _pick(max_tokens, TOKEN_UNITS)


def axis_label(x: str, max_value: float) -> tuple[Unit, str]:
    """The unit for column `x` ("tokens" or "flops") and the axis label that names it."""
    if x == "flops":
        unit = flops_unit(max_value)
        return unit, f"cumulative training compute ({unit.name})"
    if x == "tokens":
        unit = tokens_unit(max_value)
        return unit, f"training tokens ({unit.name})" if unit.name else "training tokens"
    raise ValueError(f"x={x!r}: allowed values are 'tokens', 'flops'")


def human(n: float) -> str:
    """A count for a table cell: 1.84M, 5.45G, 2.05K."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{suffix}"
    return f"{n:.0f}"
