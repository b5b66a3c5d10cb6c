"""Typed configuration of the decoder and its attention, validated once.

Two dataclasses, one per config axis, so that YAML fragments compose (DESIGN.md, Configuration):
`ModelConfig` is the size (conf/model/*.yaml), `AttentionConfig` the attention (conf/attention/*.yaml).
An attention knob left unset is filled from the size's `attention_defaults` (the paper's per-size
settings, PAPER.md "Per-size attention settings"), so `--config conf/model/128m.yaml --config
conf/attention/lrkv.yaml` gives the paper's rank 46 without a file per size x variant.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

VOCAB_MULTIPLE = 64  # the paper pads GPT-2's 50,257 to 50,304; we pad every vocabulary the same way

# Every attention knob; which kinds use which is declared by the classes in attention/ (their `knobs`).
KNOBS = ("n_kv_heads", "rank", "kv_latent_dim", "rope_head_dim", "q_latent_dim", "lrkv_path", "residual_init")


class ConfigError(ValueError):
    """A configuration that cannot be built; the message names the field and what is allowed."""


@dataclass
class AttentionConfig:
    """Which attention a model uses and that attention's knobs.

    kind: registry name (mha, mqa, gqa, mla, lrkv). Knobs left as None take the size's defaults.
    n_kv_heads: gqa's number of key/value heads G (must divide n_head).
    rank: lrkv's per-head residual rank r (1 <= r <= head_dim).
    kv_latent_dim: mla's compressed KV width d_c.
    rope_head_dim: mla's decoupled RoPE key width d_R (even).
    q_latent_dim: mla's optional query compression width (None or 0: no query compression).
    lrkv_path: lrkv's training path, "factorized" (x W_s + (x U_h) B_h^T) or "materialized"
        (W_h = W_s + U_h B_h^T built once per forward, then one MHA-sized product).
    residual_init: lrkv's ||U_h B_h^T|| / ||W_s|| at initialisation (DESIGN.md: about 0.1).
    """

    kind: str = "mha"
    n_kv_heads: int | None = None
    rank: int | None = None
    kv_latent_dim: int | None = None
    rope_head_dim: int | None = None
    q_latent_dim: int | None = None
    lrkv_path: str | None = None
    residual_init: float | None = None

    def __post_init__(self) -> None:
        from lightning_modules.attention import REGISTRY  # late: attention modules import this file

        if self.kind not in REGISTRY:
            raise ConfigError(
                f"attention.kind: unknown attention {self.kind!r}; allowed: {', '.join(sorted(REGISTRY))}"
            )
        allowed = REGISTRY[self.kind].knobs
        for name in KNOBS:
            if getattr(self, name) is not None and name not in allowed:
                uses = ", ".join(sorted(allowed)) or "no knobs"
                raise ConfigError(
                    f"attention.{name} is not used by attention kind {self.kind!r} (it uses: {uses}); "
                    f"remove it or choose a kind that uses it"
                )
        for name in ("n_kv_heads", "kv_latent_dim", "rope_head_dim"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"attention.{name}={value}: must be >= 1")
        if self.rank is not None and self.rank < 1:
            raise ConfigError(f"attention.rank={self.rank}: below 1; allowed 1..head_dim")
        if self.q_latent_dim is not None and self.q_latent_dim < 0:
            raise ConfigError(f"attention.q_latent_dim={self.q_latent_dim}: must be >= 0 (0 disables)")
        if self.lrkv_path is not None and self.lrkv_path not in ("factorized", "materialized"):
            raise ConfigError(
                f"attention.lrkv_path={self.lrkv_path!r}: allowed values are 'factorized', 'materialized'"
            )
        if self.residual_init is not None and not self.residual_init >= 0:
            raise ConfigError(f"attention.residual_init={self.residual_init}: must be >= 0")

    def label(self) -> str:
        """Short name with the knobs that distinguish runs, e.g. lrkv-r8, gqa-g2, mla-c64."""
        parts = [self.kind]
        if self.kind == "gqa":
            parts.append(f"g{self.n_kv_heads}")
        if self.kind == "lrkv":
            parts.append(f"r{self.rank}")
        if self.kind == "mla":
            parts.append(f"c{self.kv_latent_dim}")
        return "-".join(parts)


@dataclass
class ModelConfig:
    """The shape of the decoder (a size). Paper sizes use head_dim 128 (PAPER.md, Model sizes)."""

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
        from lightning_modules.attention import REGISTRY

        for kind, knobs in self.attention_defaults.items():
            if kind not in REGISTRY:
                raise ConfigError(
                    f"model.attention_defaults: unknown attention {kind!r}; allowed: {', '.join(sorted(REGISTRY))}"
                )
            unused = set(knobs) - REGISTRY[kind].knobs
            if unused:
                raise ConfigError(
                    f"model.attention_defaults.{kind}: {sorted(unused)} not used by {kind!r}; "
                    f"allowed: {sorted(REGISTRY[kind].knobs)}"
                )

    @property
    def padded_vocab_size(self) -> int:
        return -(-self.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def resolve_attention(model: ModelConfig, attention: AttentionConfig) -> AttentionConfig:
    """Fill unset knobs from the size's defaults and check them against the size. Validation lives here
    and in the dataclasses' __post_init__, nowhere else; builders call this once."""
    from lightning_modules.attention import REGISTRY

    cls = REGISTRY[attention.kind]
    defaults = dict(cls.default_knobs(model))
    defaults.update(model.attention_defaults.get(attention.kind, {}))
    explicit = {k: getattr(attention, k) for k in KNOBS if getattr(attention, k) is not None}
    resolved = dataclasses.replace(attention, **{**defaults, **explicit})
    cls.validate(model, resolved)
    return resolved
