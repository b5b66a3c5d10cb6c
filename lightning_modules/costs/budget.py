"""A run's length as a budget of tokens or of training FLOPs (docs/costs.md): the training module turns it into
steps per variant, and a study protocol names one for all its arms."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_modules.core.errors import ConfigError


@dataclass
class Budget:
    """Training length in tokens or in FLOPs (at most one). Sets trainer.max_steps per variant, so that
    variants given one FLOPs budget train on equal compute (within one step's worth)."""

    tokens: float | None = None
    flops: float | None = None

    def __post_init__(self) -> None:
        if self.tokens is not None and self.flops is not None:
            raise ConfigError("model.budget: give tokens or flops, not both")
        for name in ("tokens", "flops"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"model.budget.{name}={value}: must be > 0")

    def describe(self) -> str:
        if self.flops is not None:
            return f"flops={self.flops:.3g}"
        if self.tokens is not None:
            return f"tokens={self.tokens:.3g}"
        return "steps"
