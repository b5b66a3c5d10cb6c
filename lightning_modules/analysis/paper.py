"""The reference paper's printed numbers (docs/paper-errata.md; arXiv 2601.11471 v3), keyed by our size names.

The numbers are data in conf/paper/results.yaml, read here; the paper's per-size knobs (GQA kv heads, MLA d_c,
LRKV r) are each size's attention_defaults in conf/model/<size>.yaml, so a main run of the paper is the
attention resolved against its size (tests/model/test_paper_settings.py checks those against the paper's
table). Only what the paper prints is here; anything derived (cache fractions of GQA and MQA from head
counts, FLOPs per token from figure totals) is computed where it is shown and labelled as derived.
docs/paper-errata.md lists the paper's known errors; none of them is copied (the 2.5B model has 36 layers in
conf/model/2.5b.yaml).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, NamedTuple

import yaml

from lightning_modules.core.fragments import CONF_DIR, fragment

if TYPE_CHECKING:
    from lightning_modules.model.attention import AttentionConfig

RESULTS = CONF_DIR / "paper" / "results.yaml"


class Sweep(NamedTuple):
    """One attention's sweep of one knob: points (knob value, cache fraction of MHA's as printed, test loss)."""

    knob: str
    points: tuple[tuple[int, float, float], ...]


_DATA: dict[str, Any] = yaml.safe_load(RESULTS.read_text())

# Our size name -> the paper's name for it. The 1.2B shape is the paper's uncertain one (docs/paper-errata.md).
SIZE_NAMES: dict[str, str] = _DATA["size_names"]
TOKENS_TRAINED: dict[str, float] = _DATA["tokens_trained"]
# Test cross-entropy, nats/token, at the end of training, per size and attention (long context: 8K, 50 B tokens).
TEST_LOSS: dict[str, dict[str, float]] = _DATA["test_loss"]
# A main run's KV cache as a fraction of MHA's as printed, per size and attention (the paper gives LRKV's).
CACHE_VS_MHA: dict[str, dict[str, float]] = _DATA["cache_vs_mha"]
# Per size and attention, the knob swept and its points. MLA's fractions count the latent only.
SWEEPS: dict[str, dict[str, Sweep]] = {
    size: {kind: Sweep(s["knob"], tuple(tuple(p) for p in s["points"])) for kind, s in kinds.items()}
    for size, kinds in _DATA["sweeps"].items()
}
# "Faster to baseline" at 2.5B: fraction of the budget LRKV saves in reaching each baseline's final loss.
LRKV_SAVED_2_5B: dict[str, float] = _DATA["lrkv_saved_2_5b"]
# Cumulative training ExaFLOPs at the end of the per-size figures ("to about"; read off the figures).
TOTAL_EXAFLOPS: dict[str, float] = _DATA["total_exaflops"]

# Views of the above under the names tests/analysis/ uses.
LRKV_CACHE_VS_MHA: dict[str, float] = {size: by_kind["lrkv"] for size, by_kind in CACHE_VS_MHA.items()}
LRKV_RANK_SWEEP_128M = SWEEPS["128m"]["lrkv"].points
MLA_LATENT_SWEEP_128M = SWEEPS["128m"]["mla"].points


def settings_sizes() -> tuple[str, ...]:
    """The sizes of the paper's per-size settings table: the cost model's paper sizes."""
    from lightning_modules.costs.counts import PAPER_SIZES  # late: the cost model imports torch

    return PAPER_SIZES


@functools.cache
def main_config(size: str, attention: str) -> AttentionConfig | None:
    """The paper's main run of `attention` at `size`: the attention resolved against conf/model/<size>.yaml
    (its attention_defaults are the paper's knobs). None outside the settings table or for an unknown kind."""
    # late: the registry imports torch, which reading the printed numbers does not need
    from lightning_modules.model.attention import AttentionConfig, load_configs, names, resolve_attention

    if size not in settings_sizes() or attention not in names():
        return None
    model = load_configs([fragment("model", size)])[0]
    return resolve_attention(model, AttentionConfig(kind=attention))


def main_label(size: str, attention: str) -> str | None:
    """The label of the paper's main run of `attention` at `size` (e.g. lrkv-r46 at 128m), None if unknown."""
    config = main_config(size, attention)
    return None if config is None else config.label()


@functools.cache
def sweep_points(size: str) -> tuple[tuple[AttentionConfig, float, float], ...]:
    """The sweep points at `size` as (attention config, printed cache fraction, test loss), in SWEEPS order."""
    from lightning_modules.model.attention import AttentionConfig  # late: the registry imports torch

    return tuple(
        (AttentionConfig(kind=kind, **{sweep.knob: value}), printed, loss)
        for kind, sweep in SWEEPS.get(size, {}).items()
        for value, printed, loss in sweep.points
    )


@functools.cache
def runs(size: str) -> tuple[tuple[AttentionConfig, float], ...]:
    """The paper's runs at `size` whose knobs are known, with their test loss: each attention's main run (in
    registry order), then each sweep point whose label is not a main run's."""
    from lightning_modules.model.attention import names  # late: the registry imports torch

    main = [(main_config(size, kind), TEST_LOSS.get(size, {}).get(kind)) for kind in names()]
    out = [(config, loss) for config, loss in main if config is not None and loss is not None]
    seen = {config.label() for config, _ in out}
    for config, _, loss in sweep_points(size):
        if config.label() not in seen:
            out.append((config, loss))
            seen.add(config.label())
    return tuple(out)


def loss_for(size: str, attention: str, label: str) -> float | None:
    """The paper's test loss for a run of ours, if the paper has the same configuration: a main run (label
    equal to main_label), a sweep point, or a run of a size outside the settings table (the long-context
    run), whose knobs the paper does not state (matched by attention kind alone; our long-8k follows the
    1.2B settings)."""
    if size in TEST_LOSS and size not in settings_sizes():
        return TEST_LOSS[size].get(attention)
    return next((loss for c, loss in runs(size) if c.kind == attention and c.label() == label), None)


def printed_cache_vs_mha(size: str, attention: str, label: str) -> float | None:
    """The KV-cache fraction of MHA's the paper prints for that run (a main run's or a sweep point's), if any."""
    printed = CACHE_VS_MHA.get(size, {})
    if attention in printed and label == main_label(size, attention):
        return printed[attention]
    return next(
        (frac for c, frac, _ in sweep_points(size) if c.kind == attention and c.label() == label), None
    )
