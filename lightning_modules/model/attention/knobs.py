"""How a variant declares its knobs: one frozen dataclass per variant, whose fields are the knobs.

The field's annotation is the knob's type (int, float, str, or a Literal of allowed strings); `knob()` adds
a one-line description and, for numbers, the smallest allowed value. Everything else that lists knobs (the
attention config the CLI parses, the MLflow tags, the analysis columns, the error messages) reads these
declarations through `specs()`, so a variant's knobs are written in exactly one place.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_modules.core.errors import ConfigError


def knob(doc: str, *, minimum: float | None = None) -> Any:
    """A knob field of a variant's Knobs dataclass (no default: resolution always supplies a value)."""
    return field(metadata={"doc": doc, "minimum": minimum})


@dataclass(frozen=True)
class KnobSpec:
    """One knob as the rest of the code sees it."""

    name: str
    type: type  # int, float or str
    doc: str
    minimum: float | None = None
    choices: tuple[str, ...] | None = None

    def check(self, value: Any) -> Any:
        """The value, converted to the knob's type (an int where a float is declared); ConfigError naming
        the field otherwise."""
        where = f"attention.{self.name}={value!r}"
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, self.type) or isinstance(value, bool):
            raise ConfigError(f"{where}: must be of type {self.type.__name__}")
        if self.choices is not None and value not in self.choices:
            allowed = ", ".join(repr(c) for c in self.choices)
            raise ConfigError(f"{where}: allowed values are {allowed}")
        if self.minimum is not None and not value >= self.minimum:
            raise ConfigError(f"{where}: below {self.minimum:g}; must be >= {self.minimum:g}")
        return value


@dataclass(frozen=True)
class NoKnobs:
    """The Knobs of a variant without any."""


def specs(knobs_class: type) -> tuple[KnobSpec, ...]:
    """The KnobSpec of every field of a variant's Knobs dataclass, in declaration order."""
    hints = typing.get_type_hints(knobs_class)
    out = []
    for f in dataclasses.fields(knobs_class):
        hint = hints[f.name]
        choices = None
        if typing.get_origin(hint) is Literal:
            choices = typing.get_args(hint)
            hint = type(choices[0])
        if hint not in (int, float, str):
            raise TypeError(
                f"{knobs_class.__name__}.{f.name}: knob type {hint!r} not int, float, str or Literal"
            )
        out.append(KnobSpec(f.name, hint, f.metadata.get("doc", ""), f.metadata.get("minimum"), choices))
    return tuple(out)
