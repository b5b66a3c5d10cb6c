"""The CLI: every YAML in conf/ parses, --print_config works, bad values fail at parse time naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lightning_modules.core.fragments import NOT_FRAGMENTS
from lightning_modules.model.attention import names
from lightning_modules.training.cli import main as cli_main
from main import main
from tests.conftest import TINY_SEQ_LEN

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
CapSys = pytest.CaptureFixture[str]
FRAGMENTS = sorted(
    p.relative_to(CONF)
    for p in CONF.rglob("*.yaml")
    if p.name != "base.yaml" and p.parent.name not in NOT_FRAGMENTS
)


@pytest.mark.parametrize("fragment", [Path("base.yaml"), *FRAGMENTS], ids=str)
def test_every_conf_yaml_parses(fragment: Path, capsys: pytest.CaptureFixture[str]) -> None:
    configs = ["--config", str(CONF / "base.yaml"), "--config", str(CONF / "model/nano.yaml")]
    configs += ["--config", str(CONF / fragment)]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *configs, "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    own = yaml.safe_load((CONF / fragment).read_text())
    # every key the fragment sets reaches the merged config
    for section, values in own.items():
        if section == "trainer" and "callbacks" in values:
            values = {k: v for k, v in values.items() if k != "callbacks"}
        if isinstance(values, dict):
            for key, value in values.items():
                if not isinstance(value, dict):
                    assert printed[section][key] == value, (section, key)


def bad(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONF / "base.yaml"), "--config", str(CONF / "model/nano.yaml"), *args])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_unknown_attention_fails_at_parse_time(capsys: pytest.CaptureFixture[str]) -> None:
    err = bad(["--model.attention.kind", "flash"], capsys)
    assert f"attention.kind: unknown attention 'flash'; allowed: {', '.join(sorted(names()))}\n" in err


def test_rank_given_to_gqa_fails_at_parse_time(capsys: pytest.CaptureFixture[str]) -> None:
    err = bad(["--config", str(CONF / "attention/gqa.yaml"), "--model.attention.rank", "4"], capsys)
    assert "attention.rank is not used by attention kind 'gqa'" in err


def test_bad_optimizer_and_budget_fail_at_parse_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert "optimizer.name='sgd'" in bad(
        ["--config", str(CONF / "attention/mha.yaml"), "--model.optimizer.name", "sgd"], capsys
    )
    err = bad(
        [
            "--config",
            str(CONF / "attention/mha.yaml"),
            "--model.budget.flops",
            "1e12",
            "--model.budget.tokens",
            "5",
        ],
        capsys,
    )
    assert "model.budget: give tokens or flops, not both" in err


def test_seq_len_differing_from_manifest_fails(tiny_shards: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = bad(["--config", str(CONF / "attention/mha.yaml"), "--data.data_dir", str(tiny_shards)], capsys)
    assert f"model.arch.seq_len=256 differs from seq_len={TINY_SEQ_LEN}" in err


def test_missing_shards_say_how_to_build_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = bad(
        ["--config", str(CONF / "attention/mha.yaml"), "--data.data_dir", str(tmp_path / "none")], capsys
    )
    assert "no manifest.json there; build shards with `make data`" in err


@pytest.mark.parametrize(("given", "parsed"), [("1", 1), ("1.0", 1.0), ("8", 8), ("0.5", 0.5)])
def test_batch_limit_keeps_int_or_float(given: str, parsed: float, capsys: CapSys) -> None:
    # Lightning counts batches for an int and takes a fraction for a float: "1" must stay one batch, not 1.0,
    # the whole split (lightning_modules/training/batch_limits.py)
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(CONF / "base.yaml"), "--trainer.limit_val_batches", given, "--print_config"])  # fmt: skip
    value = yaml.safe_load(capsys.readouterr().out)["trainer"]["limit_val_batches"]
    assert value == parsed and type(value) is type(parsed)


def test_one_val_batch_reaches_the_trainer(tiny_shards: Path) -> None:
    args = ["--config", str(CONF / "base.yaml"), "--config", str(CONF / "model/nano.yaml"),
            "--config", str(CONF / "attention/mha.yaml"), "--data.data_dir", str(tiny_shards),
            "--model.arch.seq_len", str(TINY_SEQ_LEN), "--trainer.limit_val_batches", "1",
            "--trainer.limit_test_batches", "1.0", "--trainer.logger", "false"]  # fmt: skip
    trainer = cli_main(args, run=False).trainer
    assert trainer.limit_val_batches == 1 and isinstance(trainer.limit_val_batches, int)
    assert trainer.limit_test_batches == 1.0 and isinstance(trainer.limit_test_batches, float)
