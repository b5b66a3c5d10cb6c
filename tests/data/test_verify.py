"""lightning_modules.commands.verify and the DataModule's "full" check before training: every kind of bad shard is
named. The default check at fit ("sizes") and the checks made while reading are tests/data/test_fit_checks.py."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from data.data_errors import ManifestError, ShardError
from data.datamodule import ShardDataModule
from data.manifest import Manifest
from data.shards import sha256_file, write_shard
from data.verification import verify
from lightning_modules.commands.verify import main
from tests.data.helpers import edit_manifest, read_split


def _train_shard(directory: Path, number: int = 1) -> Path:
    return directory / Manifest.load(directory).split("train").shards[number].path


def _resign(directory: Path, shard: Path) -> None:
    """Make the manifest's sha256 match a modified shard, so only the deeper checks can catch it."""
    digest = sha256_file(shard)

    def change(raw: dict) -> None:
        for entry in raw["splits"]["train"]["shards"]:
            if entry["path"] == shard.name:
                entry["sha256"] = digest

    edit_manifest(directory, change)


def _problems(directory: Path) -> dict[str, str]:
    return {p.path: p.message for p in verify(directory, Manifest.load(directory))}


def _cli(directory: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main([str(directory)])
    return code, capsys.readouterr().err.strip().splitlines()


def test_clean_shards_pass(prepared: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _problems(prepared) == {}
    assert main([str(prepared)]) == 0
    assert "OK" in capsys.readouterr().out


def _truncate(shard: Path, inside_member: bool) -> None:
    """Cut the shard inside the data of its 6th member, or cleanly before its header."""
    with tarfile.open(shard) as tar:
        member = tar.getmembers()[5]
    cut = member.offset_data + 50 if inside_member else member.offset
    shard.write_bytes(shard.read_bytes()[:cut])


@pytest.mark.parametrize("inside_member", [True, False])
def test_truncated_tar(prepared_copy: Path, capsys: pytest.CaptureFixture[str], inside_member: bool) -> None:
    shard = _train_shard(prepared_copy)
    _truncate(shard, inside_member)
    problems = _problems(prepared_copy)
    assert list(problems) == [shard.name] and problems[shard.name].startswith("sha256")
    expected = "unreadable tar after 5 samples" if inside_member else "holds 5 samples, the manifest says"
    assert expected in problems[shard.name]
    code, lines = _cli(prepared_copy, capsys)
    assert code == 1 and len(lines) == 1 and lines[0].startswith(str(shard))
    with pytest.raises(ShardError, match=shard.name):
        ShardDataModule(str(prepared_copy), batch_size=4, num_workers=0).setup("fit")


@pytest.mark.parametrize("inside_member", [True, False])
def test_truncated_tar_found_while_reading_without_verification(
    prepared_copy: Path, inside_member: bool
) -> None:
    shard = _train_shard(prepared_copy)
    _truncate(shard, inside_member)
    dm = ShardDataModule(str(prepared_copy), batch_size=4, num_workers=0, verify="off", shuffle_buffer=1)
    dm.setup("fit")
    with pytest.raises(ShardError, match=shard.name):
        for _ in dm.train_dataloader():
            pass


def test_corrupt_tar_header(prepared_copy: Path) -> None:
    shard = _train_shard(prepared_copy)
    with tarfile.open(shard) as tar:
        second = tar.getmembers()[1].offset  # header of the second member
    data = bytearray(shard.read_bytes())
    data[second : second + 100] = b"\xff" * 100
    shard.write_bytes(bytes(data))
    _resign(prepared_copy, shard)  # sha256 agrees: the tar reader itself must object
    problems = _problems(prepared_copy)
    assert list(problems) == [shard.name] and "corrupt tar: bad member header" in problems[shard.name]
    with pytest.raises(ShardError, match=f"{shard.name}: corrupt tar"):
        ShardDataModule(str(prepared_copy), batch_size=4, num_workers=0, verify="full").setup("fit")


def test_sha256_mismatch(prepared_copy: Path) -> None:
    shard = _train_shard(prepared_copy, 2)
    with tarfile.open(shard) as tar:
        token = tar.getmembers()[-1].offset_data + 128 + 2  # after the .npy header: the second token
    data = bytearray(shard.read_bytes())
    data[token] ^= 0x01  # one bit of one token: still a valid tar and .npy
    shard.write_bytes(bytes(data))
    problems = _problems(prepared_copy)
    assert list(problems) == [shard.name] and problems[shard.name].startswith("sha256")
    with pytest.raises(ShardError, match=f"{shard.name}: sha256"):
        ShardDataModule(str(prepared_copy), batch_size=4, num_workers=0, verify="quick").setup("fit")


def test_missing_shard(prepared_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shard = _train_shard(prepared_copy, 0)
    shard.unlink()
    assert _problems(prepared_copy) == {shard.name: "missing"}
    code, lines = _cli(prepared_copy, capsys)
    assert code == 1 and lines == [f"{shard}: missing"]


def test_manifest_disagreeing_with_shards(prepared_copy: Path) -> None:
    shard = _train_shard(prepared_copy)

    def change(raw: dict) -> None:  # one sample more, arithmetic kept consistent inside the manifest
        split = raw["splits"]["train"]
        for entry in split["shards"]:
            if entry["path"] == shard.name:
                entry["samples"] += 1
                entry["tokens"] += raw["seq_len"]
        split["samples"] += 1
        split["tokens"] += raw["seq_len"]

    edit_manifest(prepared_copy, change)
    problems = _problems(prepared_copy)
    assert list(problems) == [shard.name] and "the manifest says" in problems[shard.name]
    with pytest.raises(ShardError, match=shard.name):
        ShardDataModule(str(prepared_copy), batch_size=4, num_workers=0, verify="full").setup("fit")
    # The size is the same (tarfile pads to whole records): the default check names it when it is opened.
    dm = ShardDataModule(str(prepared_copy), batch_size=4, num_workers=0)
    dm.setup("fit")
    with pytest.raises(ShardError, match=f"{shard.name}: no member header where the manifest's last sample"):
        for _ in dm.train_dataloader():
            pass


def test_manifest_inconsistent_in_itself(prepared_copy: Path) -> None:
    edit_manifest(
        prepared_copy, lambda raw: raw["splits"]["val"].update(samples=raw["splits"]["val"]["samples"] + 5)
    )
    with pytest.raises(ManifestError, match="val: shard samples sum to"):
        Manifest.load(prepared_copy)
    with pytest.raises(ManifestError, match="manifest.json"):
        ShardDataModule(str(prepared_copy), batch_size=4)


def test_token_id_outside_the_vocabulary(prepared_copy: Path) -> None:
    manifest = Manifest.load(prepared_copy)
    info = manifest.split("train").shards[1]
    shard = prepared_copy / info.path
    samples = read_split(prepared_copy, "train")
    first = manifest.split("train").shards[0].samples
    mine = [s.copy() for s in samples[first : first + info.samples]]
    mine[3][5] = manifest.vocab_size
    write_shard(shard, first, mine)
    _resign(prepared_copy, shard)
    problems = _problems(prepared_copy)
    assert (
        list(problems) == [shard.name]
        and f"token id {manifest.vocab_size} >= vocab_size" in problems[shard.name]
    )
    assert (
        verify(prepared_copy, Manifest.load(prepared_copy), full=False) == []
    )  # quick: sha256 and counts only
    with pytest.raises(ShardError, match=f"{shard.name}.*token id"):
        ShardDataModule(str(prepared_copy), batch_size=4, num_workers=0, verify="full").setup("fit")
    # Without verification the reader still refuses it, naming the shard.
    dm = ShardDataModule(str(prepared_copy), batch_size=4, num_workers=0, verify="off", shuffle_buffer=1)
    with pytest.raises(ShardError, match=f"{shard.name}: sample 3 holds token id"):
        for _ in dm.train_dataloader():
            pass


def test_seq_len_mismatch(prepared: Path) -> None:
    with pytest.raises(ManifestError, match="seq_len 32 differs from the shards' 16"):
        ShardDataModule(str(prepared), batch_size=4, seq_len=32)
    assert ShardDataModule(str(prepared), batch_size=4, seq_len=16).seq_len == 16


def test_missing_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ManifestError, match="no manifest.*lightning_modules prepare"):
        ShardDataModule(str(tmp_path), batch_size=4)
    assert main([str(tmp_path)]) == 1
    assert "no manifest" in capsys.readouterr().err


def test_skip_bad_shards_is_opt_in_and_logged(prepared_copy: Path, caplog: pytest.LogCaptureFixture) -> None:
    shard = _train_shard(prepared_copy, 0)
    shard.unlink()
    dm = ShardDataModule(str(prepared_copy), batch_size=4, num_workers=0, skip_bad_shards=True)
    with caplog.at_level("WARNING"):
        dm.setup("fit")
    assert f"{shard.name}: missing" in caplog.text and "leaving out 1 of" in caplog.text
    manifest = Manifest.load(prepared_copy)
    remaining = manifest.split("train").samples - manifest.split("train").shards[0].samples
    batches = list(dm.train_dataloader())
    assert len(batches) == remaining // 4
    # the remaining samples are read, and none from the missing shard
    expected = {tuple(s.tolist()) for s in read_split(prepared_copy, "train", skip=(shard.name,))}
    assert {tuple(row.tolist()) for b in batches for row in b} <= expected


def test_npy_decoding_is_safe_from_many_threads() -> None:
    """numpy's .npy header parse (ast.literal_eval) is not thread-safe on CPython 3.11; verify decodes in a
    thread pool, so decode_npy must be."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from data.shards import decode_npy, encode_npy

    payloads = [encode_npy(np.arange(i, i + 17, dtype=np.uint16)) for i in range(64)]
    with ThreadPoolExecutor(8) as pool:
        decoded = list(pool.map(decode_npy, payloads * 50))
    for i, array in enumerate(decoded):
        assert array.tolist() == list(range(i % 64, i % 64 + 17))
