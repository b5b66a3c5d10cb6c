"""The replay command against pending files it must not trust (they are handed around on shared clusters):
a path out of the file's own artifacts folder is refused with nothing sent or deleted, the overrides of one
replay never reach the file, and a last line cut by a dying append loses that line only."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from lightning_modules.commands import replay_pending as tracking_replay
from lightning_modules.tracking import buffer
from lightning_modules.tracking.buffer import FORMAT, BufferedClient, read_pending, write_pending
from tests.one_line import Case, assert_each_ends_in_one_line

DEAD = "http://127.0.0.1:9"  # the discard port: nothing answers
REPLAY = ["-m", "lightning_modules", "replay"]


def new_run(store: str) -> tuple[MlflowClient, str]:
    client = MlflowClient(store)
    return client, client.create_run(client.create_experiment("e")).info.run_id


def held_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_id: str = "old") -> Path:
    """A pending file as a run leaves it when its store is away to the end: metrics, an artifact between
    them (so they go as several requests), the run's end."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    pending = tmp_path / "ck" / f"mlflow-pending-{run_id}.jsonl"
    held = BufferedClient(MlflowClient(DEAD), DEAD, pending)
    note = tmp_path / "note.txt"
    note.write_text("kept")
    for step in range(3):
        held.log_metric(run_id, "loss", float(step), timestamp=1000 + step, step=step)
    held.log_artifact(run_id, str(note))
    for step in range(3, 5):
        held.log_metric(run_id, "loss", float(step), timestamp=1000 + step, step=step)
    held.set_terminated(run_id, "FAILED")
    assert held.save() == pending
    return pending


def steps(client: MlflowClient, run_id: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "loss"))


def crafted(folder: Path, run_id: str, store: str, *ops: dict[str, Any], raw: str = "") -> Path:
    """A pending file written by hand: a metric first (so "nothing sent" can be checked), then `ops`."""
    path = folder / f"mlflow-pending-{run_id}.jsonl"
    path.parent.mkdir(parents=True)
    first = buffer.batch_op(run_id)
    first["metrics"] = [["loss", 1.0, 1000, 0]]
    lines = [{"format": FORMAT, "tracking_uri": store}, first, *ops]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + raw)
    return path


def artifact(run_id: str, path: str, artifact_path: str | None = None) -> dict[str, Any]:
    return {"op": "artifact", "run_id": run_id, "path": path, "artifact_path": artifact_path}


@pytest.mark.slow
def test_untrusted_pending_files_and_bad_stores_end_in_one_line_with_nothing_sent_or_deleted(
    tmp_path: Path, store_at: Callable[[Path], str]
) -> None:
    store = store_at(tmp_path / "store" / "mlflow.db")
    client, run = new_run(store)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "file.txt").write_text("secret")
    (victim / "other.txt").write_text("mine")
    arts = f"mlflow-pending-{run}-artifacts"

    def case(name: str, *ops: dict[str, Any], raw: str = "") -> Path:
        return crafted(tmp_path / "ck" / name, run, store, *ops, raw=raw)

    dotdot = case("dotdot", artifact(run, f"{arts}/../../../victim/file.txt"))
    absolute = case("absolute", artifact(run, str(victim / "file.txt")))
    linked = case("linked", artifact(run, f"{arts}/link/file.txt"))
    (linked.parent / arts).mkdir()
    (linked.parent / arts / "link").symlink_to(victim)
    linked_root = case("linked-root", artifact(run, f"{arts}/k/file.txt"))
    (tmp_path / "elsewhere" / "k").mkdir(parents=True)
    (tmp_path / "elsewhere" / "k" / "file.txt").write_text("not a kept copy")
    (linked_root.parent / arts).symlink_to(tmp_path / "elsewhere")
    link_inside = case("link-inside", artifact(run, f"{arts}/k/folder"))
    (link_inside.parent / arts / "k" / "folder").mkdir(parents=True)
    (link_inside.parent / arts / "k" / "folder" / "leak.txt").symlink_to(victim / "file.txt")
    whole_folder = case("whole-folder", artifact(run, f"{arts}/file.txt"))  # would take every kept copy
    (whole_folder.parent / arts).mkdir()
    (whole_folder.parent / arts / "file.txt").write_text("x")
    escape = case("artifact-path", artifact(run, f"{arts}/k/ok.txt", "../../escape"))
    (escape.parent / arts / "k").mkdir(parents=True)
    (escape.parent / arts / "k" / "ok.txt").write_text("x")
    middle = case(
        "middle",
        raw='{"op": "batch", "run_id": "' + run + '", "metr\n' + json.dumps(buffer.batch_op(run)) + "\n",
    )
    unknown = case("unknown", {"op": "delete_run", "run_id": run})
    nested = case("nested", raw="[" * 100_000 + "]" * 100_000 + "\n")  # past the parser's recursion limit
    huge = case("huge", raw='{"op": "batch", "run_id": "' + run + '", "step": ' + "9" * 5000 + "}\n")
    plain = case("plain")
    files = [dotdot, absolute, linked, linked_root, link_inside, whole_folder, escape, middle, unknown, nested,
             huge, plain]  # fmt: skip
    before = {f: f.read_bytes() for f in files}
    file_store = tmp_path / "file-store"

    cases: list[Case] = [
        ("..", [*REPLAY, str(dotdot)], {}, ["line 3", "not a kept copy inside the file's own artifacts folder", "refused"]),
        ("absolute", [*REPLAY, str(absolute)], {}, ["line 3", "not a kept copy", str(victim / "file.txt")]),
        ("symlink", [*REPLAY, str(linked)], {}, ["line 3", "not a kept copy", str(victim / "file.txt")]),
        ("linked root", [*REPLAY, str(linked_root)], {}, ["is a symbolic link", "refused"]),
        ("link inside", [*REPLAY, str(link_inside)], {}, ["leak.txt", "outside", "remove that link"]),
        ("whole folder", [*REPLAY, str(whole_folder)], {}, ["line 3", "not a kept copy inside the file's own"]),
        ("artifact_path", [*REPLAY, str(escape)], {}, ["line 3", "'../../escape'", "leaves the run's"]),
        ("middle line", [*REPLAY, str(middle)], {}, ["line 3", "not JSON", "nothing was sent"]),
        ("unknown op", [*REPLAY, str(unknown)], {}, ["line 3", "unknown op 'delete_run'"]),
        ("deep nesting", [*REPLAY, str(nested)], {}, ["line 3", "not a line a run writes (RecursionError)"]),
        ("5,000 digits", [*REPLAY, str(huge)], {}, ["line 3", "not a line a run writes (ValueError)"]),
        ("file store", [*REPLAY, str(plain), "--tracking-uri", str(file_store)], {}, ["--tracking-uri", "sqlite:///"]),
        ("no such file", [*REPLAY, str(tmp_path / "nope.jsonl")], {}, ["nope.jsonl", "no such pending"]),
        ("ui file store", ["-m", "lightning_modules", "mlflow-ui", "--dry-run"],
         {"MLFLOW_TRACKING_URI": str(file_store)}, ["file store", "sqlite:///"]),
        ("ui dead server", ["-m", "lightning_modules", "mlflow-ui", "--dry-run"],
         {"MLFLOW_TRACKING_URI": DEAD, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}, [DEAD, "unreachable"]),
    ]  # fmt: skip
    assert_each_ends_in_one_line(cases, tmp_path)

    assert sorted(p.name for p in victim.iterdir()) == ["file.txt", "other.txt"]
    assert (victim / "file.txt").read_text() == "secret"
    assert (tmp_path / "elsewhere" / "k" / "file.txt").is_file()
    assert (whole_folder.parent / arts / "file.txt").is_file()
    assert {f: f.read_bytes() for f in files} == before  # no file rewritten, none removed
    assert steps(client, run) == []  # nothing sent: not even the good line before the bad one
    assert client.list_artifacts(run) == []
    assert not file_store.exists()


def test_overrides_serve_one_replay_and_a_cut_short_replay_resumes_from_the_files_own_lines(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    store_at: Callable[[Path], str],
) -> None:
    pending = held_file(tmp_path, monkeypatch)
    original = pending.read_bytes()
    store = store_at(tmp_path / "other" / "mlflow.db")
    client, run = new_run(store)

    assert tracking_replay.main([str(pending), "--tracking-uri", "http://127.0.0.1:1", "--run-id", run]) == 1
    assert tracking_replay.main([str(pending), "--tracking-uri", store, "--run-id", "no-such-run"]) == 1
    err = capsys.readouterr().err
    assert err.count("tracking_replay: error: ") == 2 and "nothing was sent and the file is unchanged" in err
    assert pending.read_bytes() == original  # neither the wrong URI nor the wrong run id went into it

    real_send, calls = buffer.send, []

    def reply_lost(client_: MlflowClient, group: list[dict[str, Any]]) -> None:
        calls.append(group[0]["op"])
        real_send(client_, group)
        if len(calls) == 2:  # the artifact arrives but its reply is lost: the replay stops there
            raise ConnectionError("reply lost")

    monkeypatch.setattr(buffer, "send", reply_lost)
    assert tracking_replay.main([str(pending), "--tracking-uri", store, "--run-id", run]) == 1
    assert "3 were sent" in capsys.readouterr().err and calls == ["batch", "artifact"]
    lines = original.decode().splitlines(keepends=True)
    assert pending.read_text() == "".join([lines[0], *lines[4:]])  # header and the rest, byte for byte
    monkeypatch.setattr(buffer, "send", real_send)

    assert tracking_replay.main([str(pending), "--tracking-uri", store, "--run-id", run]) == 0
    assert steps(client, run) == [0, 1, 2, 3, 4]  # each once, the artifact sent twice stored once
    assert client.get_run(run).info.status == "FAILED"
    assert [a.path for a in client.list_artifacts(run)] == ["note.txt"]
    assert not pending.exists() and not (pending.parent / f"{pending.stem}-artifacts").exists()
    assert tracking_replay.main([str(pending)]) == 1  # replaying again: nothing left, nothing touched
    assert "no such pending MLflow file" in capsys.readouterr().err


def test_a_last_line_cut_by_a_dying_append_loses_that_line_only(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    store_at: Callable[[Path], str],
) -> None:
    pending = held_file(tmp_path, monkeypatch)
    text = pending.read_text()
    pending.write_text(text[:-12])  # the last line (the run's end) cut mid-line
    store = store_at(tmp_path / "other" / "mlflow.db")
    client, run = new_run(store)

    assert tracking_replay.main([str(pending), "--tracking-uri", store, "--run-id", run]) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and f"{pending} line 8 was cut short" in warnings[0], err
    assert "sent 6 MLflow calls" in out
    assert steps(client, run) == [0, 1, 2, 3, 4] and client.get_run(run).info.status == "RUNNING"
    assert not pending.exists()


def test_an_append_after_a_cut_line_keeps_the_file_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pending = held_file(tmp_path, monkeypatch)
    pending.write_text(pending.read_text()[:-20])
    assert read_pending(pending).cut_line == 8
    write_pending(pending, {}, [buffer.batch_op("old", tags=())], append=True)
    after = read_pending(pending)
    assert after.cut_line is None and len(after.ops) == 7 and "line 8 was cut short" in caplog.text


def read_only(db: Path) -> Callable[[], None] | None:
    """Make the store's database file unwritable (immutable for root, who ignores modes; mode 0444 otherwise)
    and return how to undo it, or None where neither holds on this filesystem."""
    import os
    import subprocess

    if os.geteuid() == 0:
        made = subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode == 0
        undo = lambda: subprocess.run(["chattr", "-i", str(db)], check=False)  # noqa: E731
    else:
        db.chmod(0o444)
        made, undo = True, lambda: db.chmod(0o644)  # noqa: E731
    try:
        with db.open("ab"):
            pass
    except OSError:
        return undo
    if made:
        undo()
    return None


def test_a_store_that_cannot_be_written_ends_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_at: Callable[[Path], str]
) -> None:
    """A database MLflow can open but not write: MLflow's store logs each failed write with its traceback
    before raising; the replay's error is the only line, naming the cause, and the file is kept."""
    db = tmp_path / "store" / "mlflow.db"
    store = store_at(db)
    _, run = new_run(store)
    pending = held_file(tmp_path, monkeypatch, run_id=run)
    before = pending.read_bytes()
    undo = read_only(db)
    if undo is None:
        pytest.skip("this filesystem lets the test's user write any file")
    try:
        cases: list[Case] = [
            ("read-only store", [*REPLAY, str(pending), "--tracking-uri", store], {},
             ["did not take the calls", "OperationalError", "nothing was sent"]),
        ]  # fmt: skip
        assert_each_ends_in_one_line(cases, tmp_path)
    finally:
        undo()
    assert pending.read_bytes() == before
