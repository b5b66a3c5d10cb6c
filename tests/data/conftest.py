"""Fixtures: a tiny corpus and prepared shard folders, built once per session so the data tests run in seconds."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from data.build import prepare
from tests.data.helpers import corpus_inputs, corpus_order, make_documents, tiny_config, write_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("corpus")
    docs = write_corpus(root, make_documents(120, seed=1))
    return root, corpus_order(docs)


@pytest.fixture(scope="session")
def prepared(corpus: tuple[Path, list[str]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    prepare(tiny_config(out, corpus_inputs(corpus[0])))
    return out


@pytest.fixture
def prepared_copy(prepared: Path, tmp_path: Path) -> Path:
    """A private copy to damage."""
    copy = tmp_path / "shards"
    shutil.copytree(prepared, copy)
    return copy


@pytest.fixture(scope="session")
def one_shard(corpus: tuple[Path, list[str]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every split in a single shard: fewer shards than ranks x workers."""
    out = tmp_path_factory.mktemp("one_shard")
    prepare(tiny_config(out, corpus_inputs(corpus[0]), shard_samples=10_000))
    return out
