"""A committed ledger is checked before it is trusted (lightning_modules/study/ledger.py): a row that does not
prove a finished run is refused in one line naming the file and line, never counted as done, and never a
traceback in the runner or the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_modules.core.errors import ConfigError
from lightning_modules.study import ledger
from lightning_modules.study import protocol as protocols
from tests.study.helpers import ledger_row, micro_protocol, write_ledger

GOOD = "a" * 16

BAD_ROWS = {
    "hand-edited, minimal": (
        {"identity": GOOD, "test_loss": 4.0},
        "no run_id, size, label, seed, budget, data",
    ),
    "negative loss": (ledger_row(GOOD, test_loss=-1.0), "test loss -1.0 is negative"),
    "identity not a protocol's": (ledger_row("not-an-identity"), "identity 'not-an-identity' is not one"),
    "seed not a number": (ledger_row(GOOD, seed="x"), "seed 'x' is not a whole number"),
    "settings a list": (ledger_row(GOOD, settings="[1, 2]"), "settings are not the JSON object"),
    "settings group not an object": (
        ledger_row(GOOD, settings='{"fit": 3}'),
        "settings are not the JSON object",
    ),
    "settings nested too deep": (
        ledger_row(GOOD, settings="[" * 10_000 + "]" * 10_000),
        "settings are not",
    ),
}


@pytest.mark.parametrize("name", list(BAD_ROWS))
def test_a_bad_row_is_refused_naming_its_file_and_line(name: str, tmp_path: Path) -> None:
    row, words = BAD_ROWS[name]
    path = write_ledger(tmp_path, [ledger_row("b" * 16), row])
    with pytest.raises(ConfigError) as e:
        ledger.done_identities(tmp_path)
    line = str(e.value)
    assert "\n" not in line and f"ledger {path}, line 3" in line and words in line


def test_a_row_whose_identity_is_the_protocols_but_not_its_run_is_refused(
    tiny_shards: Path, tmp_path: Path
) -> None:
    spec = protocols.load(micro_protocol(tmp_path, tiny_shards)).runs[0]
    fields = spec.identity_fields()
    right = ledger_row(spec.identity, size=fields["size"], label=fields["arm"], seed=fields["seed"],
                       budget=fields["budget"], data=fields["data"])  # fmt: skip
    path = write_ledger(tmp_path, [right])
    rows = ledger.done_rows(tmp_path)
    ledger.check_identities(path, rows, {spec.identity: fields})  # the true row passes
    write_ledger(tmp_path, [{**right, "seed": int(fields["seed"]) + 1}])  # copied from another seed's run
    with pytest.raises(
        ConfigError, match=f"identity {spec.identity} records seed '{int(fields['seed']) + 1}'"
    ):
        ledger.check_identities(path, ledger.done_rows(tmp_path), {spec.identity: fields})


def test_the_runner_and_the_report_refuse_a_bad_ledger_in_one_line(
    tiny_shards: Path, tmp_path: Path, mlflow_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_modules.commands.run_study import main as study_main

    protocol = micro_protocol(tmp_path, tiny_shards)
    folder = tmp_path / "ledger"
    folder.mkdir()
    write_ledger(folder, [{"identity": GOOD, "test_loss": 4.0}])
    for extra in (["--plan"], ["--report", "--out", str(tmp_path / "out")]):
        assert study_main([str(protocol), "--ledger", str(folder), *extra]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count(": error: ") == 1 and "line 2: no run_id" in err
