"""A protocol edited after its runs (lightning_modules/study/settings.py): the settings a run was trained with
are recorded beside its identity, and a done run whose record differs from the protocol now is refused in one
line naming the run and the change, from the store and from the committed ledger alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_modules.core.errors import ConfigError
from lightning_modules.study import ledger, settings
from lightning_modules.study import protocol as protocols
from tests.study.helpers import ledger_row, micro_protocol, write_ledger


def test_settings_hold_the_named_knobs_and_fit_and_stay_out_of_the_identity(
    tiny_shards: Path, tmp_path: Path
) -> None:
    p = protocols.load(micro_protocol(tmp_path, tiny_shards))
    mha, lrkv = p.runs[0], p.runs[1]
    assert json.loads(lrkv.settings)["knobs"] == {"rank": "4"} and json.loads(mha.settings)["knobs"] == {}
    assert json.loads(mha.settings)["fit"]["trainer.limit_val_batches"] == "2"
    assert mha.tags()["study.settings"] == mha.settings
    edited = tmp_path / "edited"
    edited.mkdir()
    q = protocols.load(micro_protocol(edited, tiny_shards, extra="  model.optimizer.lr: 0.001\n"))
    q_mha = q.runs[0]
    assert q_mha.identity == mha.identity  # the same experiment by identity ...
    assert q_mha.settings != mha.settings  # ... trained another way: what the check catches
    assert settings.changes(mha.settings, q_mha.settings) == "fit model.optimizer.lr (unset) -> 0.001"


def test_check_refuses_an_edited_protocol_and_passes_an_unrecorded_run(
    tiny_shards: Path, tmp_path: Path
) -> None:
    p = protocols.load(micro_protocol(tmp_path, tiny_shards))
    old = p.runs[0].settings.replace('"trainer.limit_val_batches":"2"', '"trainer.limit_val_batches":"8"')
    settings.check(p, [(p.runs[0], p.runs[0].settings), (p.runs[1], "")])  # same record, or none: fine
    with pytest.raises(ConfigError) as e:
        settings.check(p, [(p.runs[0], old), (p.runs[1], p.runs[1].settings)])
    line = str(e.value)
    assert "\n" not in line and line.startswith("study micro: 1 done run(s)")
    assert "nano-mha-seed1: fit trainer.limit_val_batches 8 -> 2" in line and "new protocol name" in line


def test_the_ledger_gives_each_done_run_its_record(tmp_path: Path) -> None:
    aaa, bbb, ccc = ("a" * 16, "b" * 16, "c" * 16)
    write_ledger(
        tmp_path, [ledger_row(aaa, settings='{"fit":{}}'), ledger_row(bbb, test_loss=""), ledger_row(ccc)]
    )
    assert ledger.done_settings(tmp_path) == {aaa: '{"fit":{}}', ccc: ""}
    write_ledger(tmp_path, [ledger_row("d" * 16, settings=None)])  # a ledger from before the record
    assert ledger.done_settings(tmp_path) == {"d" * 16: ""}
