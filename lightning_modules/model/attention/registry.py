"""The attention registry: name -> variant class, and everything derived from it.

This is the one place that knows which attentions exist. The attention config the CLI parses
(`AttentionConfig`), the knob checks, the label of a run, the resolution of knobs against a size, and the
lists the costs table, the benchmarks, the comparison and the analysis iterate over are all read from the
registered classes (their `Knobs`, `label_suffix`, `default_knobs`, `validate`). Registering a variant
(`register`, called from attention/__init__.py) adds its knobs to `AttentionConfig` in place, so a parser
built afterwards accepts them.

Dependency rule (docs/architecture.md): lightning_modules/model/config.py knows nothing of attention; this module and the variants
import lightning_modules/model/config.py, never the other way round.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from lightning_modules.core.errors import ConfigError
from lightning_modules.model.attention.base import REGISTERED_AS, Attention
from lightning_modules.model.attention.knobs import KnobSpec, specs
from lightning_modules.model.config import ModelConfig, load_model_config

REGISTRY: dict[str, type[Attention]] = {}
# The registered kinds that are arms of the reference paper (arXiv 2601.11471): the demo trains these by default
# and the later variants only when asked (lightning_modules/commands/compare.py).
PAPER_ARMS: set[str] = set()


@dataclass
class AttentionConfig:
    """Which attention a model uses and that attention's knobs (conf/attention/*.yaml).

    Fields: `kind`, a registered name, then one optional field per knob of every registered variant
    (added by `register`). A knob left as None takes the size's default (model.attention_defaults), then
    the variant's own default.
    """

    kind: str = "mha"

    def __post_init__(self) -> None:
        _check_config(self)

    def label(self) -> str:
        """Short name with the knobs that distinguish runs, e.g. lrkv-r8, gqa-g2, mla-c64 (from the variant's
        label_suffix)."""
        cls = REGISTRY[self.kind]
        if not cls.label_suffix:
            return self.kind
        return f"{self.kind}-{cls.label_suffix.format(**knob_values(self))}"


class Resolved(NamedTuple):
    """An attention resolved against a size: the filled config (what is logged and checkpointed), the variant
    class and its typed knobs (what the variant is built from)."""

    config: AttentionConfig
    variant: type[Attention]
    knobs: Any


def names() -> tuple[str, ...]:
    """The registered attentions in registration order (the order of every table and figure)."""
    return tuple(REGISTRY)


def paper_names() -> tuple[str, ...]:
    """The registered attentions that the reference paper compares, in registration order."""
    return tuple(n for n in REGISTRY if n in PAPER_ARMS)


def knob_specs() -> dict[str, KnobSpec]:
    """Every knob of every registered variant, by name, in registration order."""
    out: dict[str, KnobSpec] = {}
    for cls in REGISTRY.values():
        for spec in specs(cls.Knobs):
            out.setdefault(spec.name, spec)
    return out


def knob_values(config: AttentionConfig) -> dict[str, Any]:
    """The knobs of config's variant with their values (None where unresolved)."""
    return {s.name: getattr(config, s.name, None) for s in specs(REGISTRY[config.kind].Knobs)}


def register(name: str, cls: type[Attention], *, paper: bool = False) -> None:
    """Add a variant; its knobs become fields of AttentionConfig. A knob name two variants share must have
    one type and one meaning. `paper`: one of the reference paper's arms (`paper_names`)."""
    if name in REGISTRY:
        raise ValueError(f"attention {name!r} is already registered ({REGISTRY[name].__name__})")
    known = knob_specs()
    for spec in specs(cls.Knobs):
        if spec.name in known and (known[spec.name].type, known[spec.name].choices) != (
            spec.type,
            spec.choices,
        ):
            raise TypeError(f"knob {spec.name!r} of {cls.__name__} conflicts with {known[spec.name]}")
    REGISTRY[name] = cls
    if paper:
        PAPER_ARMS.add(name)
    if REGISTERED_AS not in cls.__dict__:  # a class registered twice keeps its first name
        setattr(cls, REGISTERED_AS, name)
    _rebuild_config()


def unregister(name: str) -> None:
    cls = REGISTRY.pop(name)
    PAPER_ARMS.discard(name)
    if cls.__dict__.get(REGISTERED_AS) == name:
        delattr(cls, REGISTERED_AS)
    _rebuild_config()


def _rebuild_config() -> None:
    """Give AttentionConfig one field per registered knob. The class object stays the same (modules that
    imported it, pickles and jsonargparse keep working); its dataclass machinery is regenerated."""
    fields: list[tuple[str, Any, Any]] = [("kind", str, field(default="mha"))]
    docs = [f"    kind: the attention, one of {', '.join(REGISTRY)}"]
    for spec in knob_specs().values():
        base: Any = typing.Literal[spec.choices] if spec.choices else spec.type  # type: ignore[valid-type]
        fields.append((spec.name, base | None, field(default=None)))
        users = [n for n, c in REGISTRY.items() if spec.name in {s.name for s in specs(c.Knobs)}]
        docs.append(f"    {spec.name}: {'/'.join(users)}: {spec.doc}")
    # __post_init__ in the namespace: dataclass writes the call into __init__ only if the class has one.
    generated = dataclasses.make_dataclass(
        "AttentionConfig", fields, namespace={"__post_init__": _check_config}
    )
    for attr in (
        "__init__",
        "__repr__",
        "__eq__",
        "__dataclass_fields__",
        "__match_args__",
        "__annotations__",
    ):
        setattr(AttentionConfig, attr, getattr(generated, attr))
    summary = (AttentionConfig.__doc__ or "").split("\n\n")[0]
    AttentionConfig.__doc__ = summary + "\n\n    Args:\n" + "\n".join(docs) + "\n"


def _check_config(config: AttentionConfig) -> None:
    if config.kind not in REGISTRY:
        raise ConfigError(
            f"attention.kind: unknown attention {config.kind!r}; allowed: {', '.join(sorted(REGISTRY))}"
        )
    own = set(knob_values(config))
    for spec in knob_specs().values():
        value = getattr(config, spec.name, None)
        if value is None:
            continue
        if spec.name not in own:
            uses = ", ".join(sorted(own)) or "no knobs"
            raise ConfigError(
                f"attention.{spec.name} is not used by attention kind {config.kind!r} (it uses: {uses}); "
                f"remove it or choose a kind that uses it"
            )
        setattr(config, spec.name, spec.check(value))


def _check_size_defaults(model: ModelConfig) -> None:
    for kind, knobs in model.attention_defaults.items():
        if kind not in REGISTRY:
            raise ConfigError(
                f"model.attention_defaults: unknown attention {kind!r}; allowed: {', '.join(sorted(REGISTRY))}"
            )
        allowed = [s.name for s in specs(REGISTRY[kind].Knobs)]
        unused = set(knobs) - set(allowed)
        if unused:
            raise ConfigError(
                f"model.attention_defaults.{kind}: {sorted(unused)} not used by {kind!r}; allowed: {sorted(allowed)}"
            )


def resolve(model: ModelConfig, attention: AttentionConfig) -> Resolved:
    """Fill unset knobs (explicit value, else the size's default, else the variant's) and check them against
    the size. Validation lives here, in the knob declarations and in the variants' `validate`; builders call
    this once."""
    _check_size_defaults(model)
    cls = REGISTRY[attention.kind]
    values = dict(cls.default_knobs(model))
    values.update(model.attention_defaults.get(attention.kind, {}))
    values.update({k: v for k, v in knob_values(attention).items() if v is not None})
    missing = [s.name for s in specs(cls.Knobs) if values.get(s.name) is None]
    if missing:
        raise ConfigError(
            f"attention {attention.kind!r}: no value for {', '.join(missing)}; set it in conf/attention or the "
            f"size's attention_defaults"
        )
    config = AttentionConfig(kind=attention.kind, **values)
    knobs = cls.Knobs(**knob_values(config))
    cls.validate(model, knobs)
    return Resolved(config, cls, knobs)


def as_resolved(model: ModelConfig, attention: AttentionConfig | Resolved) -> Resolved:
    """`attention` resolved against `model`: as given when the caller resolved it already (the model is
    resolved once where it is built and the Resolved passed down to the decoder and the cost model), else
    resolved now."""
    return attention if isinstance(attention, Resolved) else resolve(model, attention)


def resolve_attention(model: ModelConfig, attention: AttentionConfig) -> AttentionConfig:
    """The filled, checked config of `resolve`."""
    return resolve(model, attention).config


def load_configs(paths: list[str | Path]) -> tuple[ModelConfig, AttentionConfig]:
    """Compose YAML fragments in order (later keys win) and build model.arch and model.attention from them
    (the merge itself: lightning_modules.core.fragments.compose)."""
    model, attention = load_model_config(paths)
    try:
        return model, AttentionConfig(**attention)
    except TypeError as e:  # an unknown key: name it as the config path
        raise ConfigError(f"model.attention: {e}") from e
