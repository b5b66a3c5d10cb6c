"""The resume policy on its own (lightning_modules/checkpoint/resume_policy.py): which differences are refused, which
applied, and that a value left at its default takes the checkpoint's."""

from __future__ import annotations

import pytest

from lightning_modules.checkpoint.resume_policy import reconcile
from lightning_modules.core.errors import UserError

DEFAULTS = {
    "arch": {"n_layer": 4, "d_model": 128},
    "attention": {"kind": "mha", "rank": None},
    "optimizer": {"lr": 0.003, "betas": [0.9, 0.95]},
    "budget": {"tokens": None, "flops": None},
}
SAVED = {
    "arch": {"n_layer": 6, "d_model": 128},
    "attention": {"kind": "lrkv", "rank": 8},
    "optimizer": {"lr": 0.01, "betas": (0.9, 0.95)},
    "budget": None,
    "_instantiator": "lightning.pytorch.cli.instantiate_module",
}


def test_values_left_at_default_take_the_checkpoints() -> None:
    merged, applied = reconcile(DEFAULTS, DEFAULTS, SAVED, "fit", "x.ckpt")
    assert merged["arch"] == SAVED["arch"] and merged["attention"] == SAVED["attention"]
    assert merged["optimizer"]["lr"] == 0.01 and merged["budget"] is None and applied == []


def test_every_refused_difference_is_named_with_both_values() -> None:
    given = {
        **DEFAULTS,
        "arch": {"n_layer": 12, "d_model": 256},
        "attention": {"kind": "gqa", "rank": None},
        "optimizer": {"lr": 0.02, "betas": [0.9, 0.95]},
    }
    with pytest.raises(UserError) as info:
        reconcile(given, DEFAULTS, SAVED, "fit", "x.ckpt")
    message = str(info.value)
    for part in (
        "model.arch.n_layer: checkpoint 6, given 12",
        "model.arch.d_model: checkpoint 128, given 256",
        "model.attention.kind: checkpoint 'lrkv', given 'gqa'",
        "model.optimizer.lr: checkpoint 0.01, given 0.02",
    ):
        assert part in message


def test_optimizer_differences_matter_only_when_training() -> None:
    given = {**DEFAULTS, "optimizer": {"lr": 0.02, "betas": [0.9, 0.95]}}
    with pytest.raises(UserError):
        reconcile(given, DEFAULTS, SAVED, "fit", "x.ckpt")
    merged, applied = reconcile(given, DEFAULTS, SAVED, "test", "x.ckpt")
    assert applied == ["model.optimizer.lr: 0.01 -> 0.02"]


def test_budget_is_applied_and_reported() -> None:
    given = {**DEFAULTS, "budget": {"tokens": 1e6, "flops": None}}
    merged, applied = reconcile(given, DEFAULTS, SAVED, "fit", "x.ckpt")
    assert merged["budget"] == {"tokens": 1e6, "flops": None}
    assert applied == ["model.budget: None -> {'tokens': 1000000.0, 'flops': None}"]
