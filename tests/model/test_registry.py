"""The registry is the single source of the attention list: a sixth attention registered here, and nowhere
else, passes the generic suites and shows up in the cost table, the CLIs' choices and the analysis."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest

from lightning_modules.commands.cost_report import main as costs_main
from lightning_modules.core.errors import ConfigError
from lightning_modules.costs import counts as costs
from lightning_modules.model.attention import AttentionConfig, names, register, resolve, unregister
from tests.toy_attention import NAME, NarrowValueAttention

ROOT = Path(__file__).resolve().parents[2]
# The suites parametrised over the registry: shapes, causality, gradients; costs against the built model and
# the FLOP counter; cached decode against the full forward, cache bytes, greedy generation.
GENERIC_SUITES = ("tests/model/test_attention.py", "tests/costs/test_costs.py", "tests/model/test_decode.py")


@pytest.fixture
def toy() -> Iterator[str]:
    register(NAME, NarrowValueAttention)
    try:
        yield NAME
    finally:
        unregister(NAME)


@pytest.mark.slow
def test_toy_attention_passes_the_generic_suites() -> None:
    """Run in a child pytest with the toy registered before collection (the plugin in tests/toy_attention.py),
    selecting the toy's cases only: every test parametrised over the registry must pass for it."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.toy_attention", "-k", NAME, *GENERIC_SUITES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", result.stdout).group(1))  # type: ignore[union-attr]
    assert passed >= 10, result.stdout[-2000:]  # shapes, causality, gradients, 3 cost, 4+ decode cases


@pytest.mark.slow
def test_toy_attention_in_the_cost_table(toy: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert names()[-1] == toy
    assert costs_main(["--json"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out) if r["attention"] == toy]
    assert [r["size"] for r in rows] == list(costs.TABLE_SIZES)
    nano = rows[0]
    assert nano["label"] == "toy-v16"  # nano: head_dim 32, the toy's default value width half of it
    # Keys as MHA's, values half as wide: three quarters of MHA's cache.
    assert nano["kv_cache_vs_mha"] == pytest.approx(0.75)


def test_toy_knob_is_a_config_field_with_its_checks(toy: str) -> None:
    assert AttentionConfig(kind=toy, value_dim=8).label() == "toy-v8"
    with pytest.raises(ConfigError, match=r"attention\.value_dim=0: below 1"):
        AttentionConfig(kind=toy, value_dim=0)
    with pytest.raises(ConfigError, match=r"attention\.value_dim is not used by attention kind 'mha'"):
        AttentionConfig(kind="mha", value_dim=8)
    from tests.helpers import tiny_model

    with pytest.raises(ConfigError, match=r"attention\.value_dim=32: above head_dim 16"):
        resolve(tiny_model(), AttentionConfig(kind=toy, value_dim=32))


def test_toy_attention_in_the_clis_choices(toy: str, capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_modules.commands import compare
    from lightning_modules.training.cli import main

    fragments = ["--config", str(ROOT / "conf/base.yaml"), "--config", str(ROOT / "conf/model/nano.yaml")]
    with pytest.raises(SystemExit):
        main(["fit", *fragments, "--model.attention.kind", "nope"])
    assert re.search(r"unknown attention 'nope'; allowed: .*\btoy\b", capsys.readouterr().err)
    with pytest.raises(SystemExit):  # main.py parses the toy's own knob: AttentionConfig has the field
        main(
            [
                "fit",
                *fragments,
                "--model.attention.kind",
                toy,
                "--model.attention.value_dim",
                "8",
                "--print_config",
            ]
        )
    printed = capsys.readouterr().out
    assert "kind: toy" in printed and "value_dim: 8" in printed
    with pytest.raises(SystemExit):
        compare.main(["--attentions", "nope"])
    assert "'toy'" in capsys.readouterr().err


def test_toy_attention_in_the_analysis(
    toy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_at: Callable[[Path], str]
) -> None:
    from mlflow import MlflowClient

    from lightning_modules.analysis.styles import label_sort_key
    from lightning_modules.analysis.tidy import columns, load_runs
    from lightning_modules.core.fragments import fragment
    from lightning_modules.model.config import load_model_config
    from lightning_modules.tracking import runs

    monkeypatch.setattr(runs, "git_commit", lambda: "test")
    uri = store_at(tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("toy")
    model = load_model_config([fragment("model", "nano")])[0]
    for kind in ("mha", toy):
        attention = resolve(model, AttentionConfig(kind=kind)).config
        run = client.create_run(experiment, run_name=runs.run_name(model, attention, 7))
        for key, value in runs.run_tags(model, attention, 7, "steps").items():
            client.set_tag(run.info.run_id, key, value)
        for metric, value in (("loss", 3.0), ("tokens", 1e3), ("flops", 1e9)):
            client.log_metric(run.info.run_id, f"val/{metric}", value, step=1)
        client.set_terminated(run.info.run_id)
    runs = load_runs(uri, "toy")
    assert "knob_value_dim" in columns() and tuple(runs.columns) == columns()
    assert list(runs["attention"]) == ["mha", toy]  # registry order
    assert runs["knob_value_dim"].dtype == "Int64" and runs["knob_value_dim"].iloc[1] == 16
    assert pd.isna(runs["knob_value_dim"].iloc[0])
    assert label_sort_key("lrkv", "lrkv-r8") < label_sort_key(toy, "toy-v16") < label_sort_key("zzz", "zzz")


def test_registering_twice_or_a_conflicting_knob_is_refused(toy: str) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register(toy, NarrowValueAttention)

    class Conflicting(NarrowValueAttention):
        from dataclasses import dataclass as _dc

        @_dc(frozen=True)
        class Knobs:
            rank: str = "x"  # lrkv's rank is an int

    with pytest.raises(TypeError, match="knob 'rank'"):
        register("conflicting", Conflicting)


def test_no_second_list_of_the_attentions() -> None:
    """Outside the registry, YAML, docs and tests, no source names three or more attentions in one line (a
    list of them); the analysis' paper numbers are data keyed by the paper's attentions, not a list."""
    builtin = [n for n in names() if n != NAME]
    offenders = []
    allowed = {"lightning_modules/model/attention/__init__.py", "lightning_modules/analysis/paper.py"}
    for path in [
        *ROOT.glob("lightning_modules/**/*.py"),
        *ROOT.glob("benchmarks/*.py"),
        *ROOT.glob("data/*.py"),
    ]:
        rel = str(path.relative_to(ROOT))
        if rel in allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            quoted = {n for n in builtin if f'"{n}"' in line or f"'{n}'" in line}
            if len(quoted) >= 3:
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
