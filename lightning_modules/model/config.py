"""Typed configuration of the decoder's size, validated once, and its loader from conf/ fragments.

`ModelConfig` is the size (conf/model/*.yaml). The attention's config (`AttentionConfig`, conf/attention/*.yaml)
is derived from the attention registry and lives in lightning_modules/model/attention/registry.py: this module
imports nothing from attention/, the registry imports this one (docs/architecture.md). An attention knob
left unset is filled from the size's `attention_defaults` (the paper's per-size settings,
docs/paper-errata.md), so `--config conf/model/128m.yaml --config conf/attention/lrkv.yaml` gives the
paper's rank 46 without a file per size x variant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_modules.core.errors import ConfigError
from lightning_modules.core.fragments import compose

VOCAB_MULTIPLE = 64  # the paper pads GPT-2's 50,257 to 50,304; we pad every vocabulary the same way


@dataclass
class ModelConfig:
    """The shape of the decoder (a size). Paper sizes use head_dim 128 (docs/paper-errata.md)."""

    name: str = "nano"
    vocab_size: int = 4096
    seq_len: int = 256
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    head_dim: int = 32
    mlp_ratio: int = 4
    rope_base: float = 10000.0
    qk_norm: bool = True
    norm_eps: float = 1e-6
    init_std: float = 0.02
    attention_defaults: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model", "head_dim", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name}={getattr(self, name)}: must be >= 1")
        if self.d_model != self.n_head * self.head_dim:
            raise ConfigError(
                f"model.d_model={self.d_model} is inconsistent with model.n_head x model.head_dim = "
                f"{self.n_head} x {self.head_dim} = {self.n_head * self.head_dim}; they must be equal"
            )
        if self.head_dim % 2:
            raise ConfigError(f"model.head_dim={self.head_dim}: RoPE needs an even dimension")

    @property
    def padded_vocab_size(self) -> int:
        return -(-self.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def load_model_config(paths: list[str | Path]) -> tuple[ModelConfig, dict[str, Any]]:
    """model.arch of the composed fragments as a ModelConfig, and model.attention as given (a mapping; the
    attention registry turns it into an AttentionConfig: lightning_modules.model.attention.load_configs)."""
    section = compose(paths).get("model", {})
    try:
        return ModelConfig(**section.get("arch", {})), dict(section.get("attention", {}))
    except TypeError as e:  # an unknown key: name it as the config path
        raise ConfigError(f"model.arch: {e}") from e
