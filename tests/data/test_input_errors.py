"""Bad data and command-line input ends in one line, early, and leaves nothing behind: data-loader options
and manifests for main.py and lightning_modules.commands.verify, --vocab-size and unsplittable corpora for lightning_modules.commands.prepare, counts
and unsafe YAML for lightning_modules.costs, a prompt longer than the context for lightning_modules.commands.generate
(the one-line check: tests/one_line.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

import data.corpus_tokenizer
from data.build import prepare
from data.data_errors import ManifestError, PrepareError
from data.datamodule import ShardDataModule
from data.distributed_prepare import prepare_distributed
from data.manifest import Manifest
from data.parallel_options import DistributedOptions
from data.prepare_config import MAX_VOCAB, MIN_VOCAB, check_options
from data.sources import shakespeare_files
from lightning_modules.core.errors import ConfigError
from lightning_modules.generation.loop import check_lengths
from tests.core.helpers import NANO
from tests.data.helpers import edit_manifest, tiny_config
from tests.model.helpers import make_checkpoint
from tests.one_line import Case, assert_each_ends_in_one_line

ROOT = Path(__file__).resolve().parents[2]


def _outside(shards: Path, tmp: Path) -> Path:
    """A copy of `shards` whose manifest reads its first train shard from ../elsewhere/ (the bytes intact)."""
    copy = tmp / "outside"
    shutil.copytree(shards, copy)
    (tmp / "elsewhere").mkdir()
    first = Manifest.load(copy).split("train").shards[0].path
    shutil.move(copy / first, tmp / "elsewhere" / first)
    edit_manifest(copy, lambda raw: raw["splits"]["train"]["shards"][0].update(path=f"../elsewhere/{first}"))
    return copy


def _one_document(folder: Path, megabytes: int) -> Path:
    """All of Shakespeare as ONE document (a .txt file is one unless --txt-doc-chars): one split gets it all."""
    text = "".join(p.read_text(encoding="utf-8") for p in shakespeare_files())
    path = folder / "one.txt"
    path.write_text((text * (megabytes * 2**20 // len(text) + 1))[: megabytes * 2**20], encoding="utf-8")
    return path


def _cases(tmp: Path, shards: Path) -> list[Case]:
    main = [str(ROOT / "main.py"), "fit", *NANO, "--data.data_dir", str(shards)]
    outside = _outside(shards, tmp)
    unsafe = tmp / "unsafe.yaml"
    unsafe.write_text('model: !!python/object/apply:os.system ["echo unsafe-code-ran"]\n')
    ckpt, _ = make_checkpoint(tmp)  # seq_len 32
    prepare = ["-m", "lightning_modules", "prepare", "--source", "shakespeare", "--no-progress"]
    costs = ["-m", "lightning_modules", "costs"]
    return [
        ("num_workers -1", [*main, "--data.num_workers", "-1"], {}, ["data.num_workers=-1", "must be 0"]),
        ("batch_size 0", [*main, "--data.batch_size", "0"], {}, ["data.batch_size=0", "at least 1"]),
        ("shard outside the data folder (main.py)", [*main, "--data.data_dir", str(outside)], {},
         ["../elsewhere/", "not a plain file name"]),
        ("shard outside the data folder (verify)", ["-m", "lightning_modules", "verify", str(outside)], {},
         ["lightning_modules verify: error:", "../elsewhere/", "not a plain file name"]),
        ("vocab 1e9", [*prepare, "--out", str(tmp / "huge"), "--vocab-size", "1000000000"], {},
         ["--vocab-size 1000000000", str(MAX_VOCAB)]),
        ("vocab 0", [*prepare, "--out", str(tmp / "zero"), "--vocab-size", "0"], {}, ["--vocab-size 0", "257"]),
        ("one huge document", ["-m", "lightning_modules", "prepare", str(_one_document(tmp, 3)), "--out", str(tmp / "one"),
                               "--no-progress"], {}, ["found before tokenizing", "--txt-doc-chars"]),
        ("costs micro-batch 0", [*costs, "--memory", "--size", "nano", "--micro-batch", "0"], {},
         ["--micro-batch", "at least 1"]),
        ("costs !!python yaml", [*costs, "--config", str(unsafe)], {}, [str(unsafe), "!!python", "line 1"]),
        ("costs --memory !!python yaml", [*costs, "--memory", "--config", str(unsafe)], {}, [str(unsafe), "!!python"]),
        ("prompt longer than the context", ["-m", "lightning_modules", "generate", "--ckpt", str(ckpt), "--prompt",
                                            "the quick brown fox " * 20],
         {}, ["the prompt is", "the model's context is seq_len=32", "shorten the prompt to at most 30 tokens"]),
    ]  # fmt: skip


@pytest.mark.slow
def test_each_bad_input_ends_in_one_line(tiny_shards: Path, mlflow_uri: str, tmp_path: Path) -> None:
    assert_each_ends_in_one_line(_cases(tmp_path, tiny_shards), tmp_path)
    # a refused preparation leaves no hidden build folder (nor any --out) behind
    assert not [
        p.name for p in tmp_path.iterdir() if p.name.startswith(".") or p.name in ("huge", "zero", "one")
    ]


@pytest.mark.slow
def test_garbled_manifest_for_main_ends_in_one_line(
    tiny_shards: Path, mlflow_uri: str, tmp_path: Path
) -> None:
    garbled = tmp_path / "garbled"
    shutil.copytree(tiny_shards, garbled)
    (garbled / "manifest.json").write_text('{"splits": [1, 2\n')
    main = [str(ROOT / "main.py"), "fit", *NANO, "--data.data_dir", str(garbled)]
    assert_each_ends_in_one_line([("garbled manifest", main, {}, [str(garbled / "manifest.json")])], tmp_path)


def test_a_corpus_that_cannot_fill_a_split_is_refused_before_the_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tokenizer was trained on a corpus that cannot fill its splits")

    monkeypatch.setattr(data.corpus_tokenizer, "train_bpe", no_training)
    big = _one_document(tmp_path, 1)
    for run in (
        lambda: prepare(tiny_config(tmp_path / "out", [str(big)])),
        lambda: prepare_distributed(tiny_config(tmp_path / "out", [str(big)]), DistributedOptions(tasks=1)),
    ):
        with pytest.raises(PrepareError, match=r"split '(train|val|test)' would get 0 of the 1 documents"):
            run()
    # too few bytes for one sample of a split, though it has a document
    (tmp_path / "short.txt").write_text("a few words")
    with pytest.raises(PrepareError, match=r"split 'train' would get 1 of the 1 documents \(11 bytes: fewer"):
        prepare(tiny_config(tmp_path / "out", [str(tmp_path / "short.txt")], val_frac=0.0, test_frac=0.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.txt", "short.txt"]  # no work or build folder


def test_vocab_size_bounds(tmp_path: Path) -> None:
    for bad in (0, -1, MIN_VOCAB - 1, MAX_VOCAB + 1, 1_000_000_000):
        with pytest.raises(PrepareError, match=rf"--vocab-size {bad}: use {MIN_VOCAB} .* to {MAX_VOCAB}"):
            check_options(tiny_config(tmp_path, ["x.txt"], vocab_size=bad))
    for good in (MIN_VOCAB, MAX_VOCAB, None):
        check_options(tiny_config(tmp_path, ["x.txt"], vocab_size=good))


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("batch_size", 0, "data.batch_size=0: must be at least 1"),
        ("val_batch_size", -2, "data.val_batch_size=-2"),
        ("global_batch_size", 0, "data.global_batch_size=0"),
        ("data_slices", 0, "data.data_slices=0"),
        ("shuffle_buffer", 0, "data.shuffle_buffer=0"),
        ("num_workers", -1, "data.num_workers=-1: must be 0"),
        ("verify", "sometimes", "data.verify='sometimes'"),
    ],
)
def test_datamodule_options_are_config_errors(tmp_path: Path, option: str, value: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as raised:
        ShardDataModule(str(tmp_path), **{option: value})  # type: ignore[arg-type]
    assert isinstance(raised.value, ValueError)  # library callers that caught ValueError still do


@pytest.mark.parametrize("name", ["../train-00000.tar", "/etc/passwd", "sub/train-00000.tar", "..", ""])
def test_manifest_names_only_files_in_its_folder(prepared_copy: Path, name: str) -> None:
    edit_manifest(prepared_copy, lambda raw: raw["splits"]["val"]["shards"][0].update(path=name))
    with pytest.raises(ManifestError, match="not a plain file name in the data folder"):
        Manifest.load(prepared_copy)
    with pytest.raises(ManifestError, match="not a plain file name"):
        ShardDataModule(str(prepared_copy), num_workers=0)


def test_tokenizer_outside_the_folder_is_refused(prepared_copy: Path) -> None:
    raw = json.loads((prepared_copy / "manifest.json").read_text())
    raw["tokenizer"] = "../tokenizer.json"
    (prepared_copy / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ManifestError, match="tokenizer '../tokenizer.json' is not a plain file name"):
        Manifest.load(prepared_copy)


def test_prompt_longer_than_the_context_names_both_lengths() -> None:
    model = SimpleNamespace(config=SimpleNamespace(seq_len=32))
    with pytest.raises(
        ValueError, match=r"^the prompt is 40 tokens and the model's context is seq_len=32: shorten"
    ):
        check_lengths(model, 40, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"the prompt is 31 tokens \(\+1 end-of-text .* at most 30 tokens"):
        check_lengths(model, 32, 1, added=1)  # type: ignore[arg-type]
    # a prompt that fits keeps the message about the new tokens
    with pytest.raises(ValueError, match=r"use at most 2 new tokens"):
        check_lengths(model, 30, 5)  # type: ignore[arg-type]
