"""The committed results ledger (lightning_modules/study/ledger.py): a run recorded in results/<protocol>/runs.csv
is done on a machine whose store lacks it, the report keeps it and counts it, and a malformed ledger is one
line naming the file."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest
import yaml

from lightning_modules.commands.run_study import main as study_main
from lightning_modules.core.errors import ConfigError
from lightning_modules.study import ledger
from lightning_modules.study import protocol as protocols
from tests.study.helpers import ledger_row, micro_protocol, started_runs, write_ledger

ONE_ARM = "[{kind: mha}]"
SHORT_FLOPS = 1.2e10  # 18 steps of nano mha at 4 x 32 tokens with the tiny shards' 512-token vocabulary


def test_done_identities_reads_finished_rows_only(tmp_path: Path) -> None:
    assert ledger.done_identities(tmp_path) == set()  # no ledger yet: nothing done
    aaa, bbb, ccc, ddd = (letter * 16 for letter in "abcd")
    rows = [ledger_row(aaa, test_loss=5.1), ledger_row(bbb, test_loss=""), ledger_row(ccc, test_loss="nan"),
            ledger_row(ddd, test_loss=4.9)]  # fmt: skip
    write_ledger(tmp_path, rows)
    assert ledger.done_identities(tmp_path) == {aaa, ddd}


def test_a_ledger_without_identities_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "runs.csv").write_text("run_id,test_loss\nr1,5.1\n")
    with pytest.raises(ConfigError, match=r"runs\.csv: no `identity` or `test_loss` column.*--report"):
        ledger.done_identities(tmp_path)


# The manifest hash of the shards each shipped data config builds (`make data`, and `make data SEQ_LEN=1024` for
# the 1,024-token cut): a ledger row records the hash of the shards it trained on.
SHIPPED_SHARDS = {
    "conf/data/shakespeare.yaml": "6bd091106c6eabed",
    "conf/data/shakespeare-1k.yaml": "4b31abe2299540de",
}


def test_the_committed_ledgers_name_their_runs() -> None:
    # results/<protocol>/runs.csv of every shipped protocol that has results: each row's identity is one of
    # the protocol's runs, so a fresh machine skips exactly those (the data hash is the protocol's shards')
    for folder in sorted((protocols.ROOT / "results").iterdir()):
        if (folder / "runs.csv").is_file():
            table = pd.read_csv(folder / "runs.csv")
            assert table["identity"].notna().all() and table["identity"].is_unique, folder
            data = yaml.safe_load((protocols.ROOT / "conf/study" / f"{folder.name}.yaml").read_text())["data"]
            assert set(table["data"]) == {SHIPPED_SHARDS[data]}, folder


@pytest.mark.slow
def test_a_fresh_store_trains_only_what_the_ledger_lacks_and_reports_it(
    tiny_shards: Path, tmp_path: Path, mlflow_uri: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    path = micro_protocol(tmp_path, tiny_shards, arms=ONE_ARM, budget=SHORT_FLOPS)
    book = tmp_path / "results"
    args = [str(path), "--settle-s", "0", "--ledger", str(book)]
    assert study_main(args) == 0
    assert sorted(started_runs(capsys.readouterr().out)) == ["nano mha seed 1", "nano mha seed 2"]
    assert study_main([*args, "--report", "--out", str(book)]) == 0
    capsys.readouterr()
    written = pd.read_csv(book / "runs.csv")
    specs = protocols.load(path).runs
    assert sorted(written["identity"]) == sorted(s.identity for s in specs)

    # Another machine: an empty store, the committed ledger. Nothing trains, and the plan says why.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}")
    assert study_main([*args, "--plan"]) == 0
    plan = capsys.readouterr().out
    assert "done 2 (2 of them on other machines" in plan and plan.count("  ledger ") == 2
    assert study_main(args) == 0
    assert started_runs(capsys.readouterr().out) == []

    # The protocol edited after its runs (another validation setting, same identities): refused in one line
    # naming the runs and the change, before anything trains; put back, it is accepted again.
    text = path.read_text()
    path.write_text(text.replace("trainer.limit_val_batches: 2", "trainer.limit_val_batches: 3"))
    assert study_main(args) == 2
    refused = capsys.readouterr().err.strip().splitlines()
    assert len(refused) == 1 and "2 done run(s) were trained with other settings" in refused[0]
    assert "fit trainer.limit_val_batches 2 -> 3" in refused[0]
    path.write_text(text)

    # A ledger that lost seed 2's row: only seed 2 trains, and the report holds both runs again. Seed 1's row
    # says it resumed from step 600, a text every later report must write back as it was (not 600.0).
    written["resumed_from_step"] = written["resumed_from_step"].astype(object)
    written.loc[written["seed"] == 1, "resumed_from_step"] = "600"
    written[written["seed"] == 1].to_csv(book / "runs.csv", index=False)
    assert study_main(args) == 0
    assert started_runs(capsys.readouterr().out) == ["nano mha seed 2"]
    assert study_main([*args, "--report", "--out", str(book)]) == 0
    assert "2/2 runs reported" in capsys.readouterr().out
    again = pd.read_csv(book / "runs.csv")
    assert sorted(again["identity"]) == sorted(s.identity for s in specs)
    seed1 = again[again["seed"] == 1].iloc[0]
    before = written[written["seed"] == 1].iloc[0]
    # seed 1 came from the ledger: the same run, its row kept as the machine that ran it recorded it
    assert seed1["run_id"] == before["run_id"] and seed1["test_loss"] == before["test_loss"]
    assert seed1["machine"] == before["machine"] and seed1["hardware"] == before["hardware"]
    evaluations = pd.read_csv(book / "evaluations.csv")
    assert set(evaluations["run_id"]) == set(again["run_id"])
    assert (evaluations["split"] == "test").sum() == 2

    # Reported again on the same machine: the ledger now holds seed 2, which this store holds too; it counts once.
    assert study_main([*args, "--report", "--out", str(book)]) == 0
    assert "2/2 runs reported" in capsys.readouterr().out
    assert sorted(pd.read_csv(book / "runs.csv")["run_id"]) == sorted(again["run_id"])

    # A report from the ledger alone (no store on this machine) opens none and rewrites the same tables.
    first = (book / "runs.csv").read_text()
    missing = tmp_path / "nowhere" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{missing}")
    assert study_main([*args, "--report", "--out", str(book)]) == 0
    assert "2/2 runs reported" in capsys.readouterr().out
    assert not missing.exists() and (book / "runs.csv").read_text() == first
    with (book / "runs.csv").open(newline="") as f:
        resumed = {row["seed"]: row["resumed_from_step"] for row in csv.DictReader(f)}
    # read back from a ledger in which a blank stands beside it, still as written
    assert resumed == {"1": "600", "2": ""}
