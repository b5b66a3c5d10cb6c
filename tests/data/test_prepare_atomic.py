"""lightning_modules.commands.prepare replaces a dataset atomically: a failed rerun leaves the previous one byte-identical, only
files a manifest lists are ever deleted, a foreign folder needs --force, and an unwritable --out is found
before any work (through the CLI entry point, lightning_modules.commands.prepare.main)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest

import data.corpus_tokenizer
from lightning_modules.commands.prepare import main
from tests.data.helpers import SEQ_LEN, VOCAB, corpus_inputs


def _args(corpus_root: Path, out: Path, *extra: str) -> list[str]:
    return [
        *corpus_inputs(corpus_root), "--out", str(out), "--vocab-size", str(VOCAB), "--seq-len", str(SEQ_LEN),
        "--val-frac", "0.15", "--test-frac", "0.15", "--shard-samples", "23", "--no-progress", *extra,
    ]  # fmt: skip


def _snapshot(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture
def dataset(corpus: tuple[Path, list[str]], tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    assert main(_args(corpus[0], out)) == 0
    return out


def _latin1(tmp_path: Path) -> list[str]:
    bad = tmp_path / "bad.txt"
    bad.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    return [str(bad)]


@pytest.mark.parametrize("failure", ["latin-1 input", "seq-len too long"])
def test_failed_rerun_leaves_the_previous_dataset_byte_identical(
    failure: str, dataset: Path, corpus: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    before = _snapshot(dataset)
    args = _args(corpus[0], dataset)
    if failure == "latin-1 input":
        args = [*_latin1(tmp_path), *args]
    else:
        args += ["--seq-len", "100000"]
    assert main(args) == 1
    assert "error:" in capsys.readouterr().err
    assert _snapshot(dataset) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "ds"][failure != "latin-1 input" :]


def test_rerun_replaces_only_its_own_files(
    dataset: Path, corpus: tuple[Path, list[str]], capsys: pytest.CaptureFixture
) -> None:
    notes = dataset / "train-notes.tar.txt"  # matches the old cleanup glob train-*.tar*
    notes.write_text("my notes")
    assert main(_args(corpus[0], dataset)) == 1
    err = capsys.readouterr().err
    assert "train-notes.tar.txt" in err and "--force" in err and notes.read_text() == "my notes"
    old_shards = {p.name for p in dataset.glob("*.tar")}
    assert main(_args(corpus[0], dataset, "--force", "--shard-samples", "1000")) == 0
    assert notes.read_text() == "my notes"  # kept, never deleted
    new_shards = {p.name for p in dataset.glob("*.tar")}
    assert new_shards == {"train-00000.tar", "val-00000.tar", "test-00000.tar"} and new_shards < old_shards
    assert not [p for p in dataset.parent.iterdir() if p.name.startswith(".")]  # no build/old folder left


def test_rerun_into_its_own_dataset_needs_no_force(dataset: Path, corpus: tuple[Path, list[str]]) -> None:
    before = _snapshot(dataset)
    assert main(_args(corpus[0], dataset)) == 0
    assert _snapshot(dataset) == before  # same inputs, same bytes, swapped in


def test_folder_of_other_files_is_refused(corpus: tuple[Path, list[str]], tmp_path: Path) -> None:
    out = tmp_path / "home"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    assert main(_args(corpus[0], out)) == 1
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]


def _unwritable(tmp_path: Path) -> Path:
    """A folder this process cannot write into: chmod for a normal user; root ignores modes, so a
    read-only mount (/sys in containers) stands in."""
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    for candidate in (Path("/sys"), Path("/proc/sys")):
        try:
            os.rmdir(tempfile.mkdtemp(dir=candidate))
        except OSError:
            return candidate
    pytest.skip("no unwritable folder to test with (root and no read-only mount)")


def test_unwritable_out_is_named_before_the_tokenizer_is_trained(
    corpus: tuple[Path, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("tokenizer trained before the permission check")

    monkeypatch.setattr(data.corpus_tokenizer, "train_bpe", no_training)
    folder = _unwritable(tmp_path)
    assert main(_args(corpus[0], folder / "out")) == 1
    err = capsys.readouterr().err
    assert str(folder) in err and "not writable" in err and "Traceback" not in err


def test_out_through_a_symlink_keeps_the_link(
    dataset: Path, corpus: tuple[Path, list[str]], tmp_path: Path
) -> None:
    link = tmp_path / "link"
    link.symlink_to(dataset)
    assert main(_args(corpus[0], link, "--shard-samples", "1000")) == 0
    assert link.is_symlink() and link.resolve() == dataset.resolve()
    assert {p.name for p in dataset.glob("*.tar")} == {"train-00000.tar", "val-00000.tar", "test-00000.tar"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "link"]
