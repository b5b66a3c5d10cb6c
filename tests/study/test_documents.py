"""Every document's loss under a checkpoint, and the command that sets the documents' standard error beside a
ledger's seed standard error (lightning_modules/scoring/document_scores.py, lightning_modules/scoring/documents_report.py),
on shards cut into short documents, with small untrained decoders: what is checked is the bookkeeping, not a model."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from data.datamodule import ShardDataModule
from data.manifest import Manifest
from lightning_modules.commands.score_documents import main
from lightning_modules.generation.checkpoint import load_model
from lightning_modules.model.attention import AttentionConfig
from lightning_modules.model.transformer import Transformer
from lightning_modules.scoring.document_scores import score_documents
from tests.helpers import tiny_model

STEPS = 10
ARMS = {"mha": "mha", "lrkv-r4": "lrkv"}


@pytest.fixture(scope="module")
def doc_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two of Shakespeare's texts cut into ~2,000-character documents (the tiny shards keep whole files, one
    document per split), 32-token samples."""
    from data.sources import shakespeare_files
    from lightning_modules.commands.prepare import main as prepare

    out = tmp_path_factory.mktemp("doc_shards")
    files = [str(p) for p in shakespeare_files()[:2]]
    args = [*files, "--out", str(out), "--vocab-size", "512", "--seq-len", "32", "--no-progress"]
    assert prepare([*args, "--txt-doc-chars", "2000", "--val-frac", "0.1", "--test-frac", "0.1"]) == 0
    return out


def checkpoint(path: Path, shards: Path, kind: str, seed: int, step: int = STEPS + 1) -> Path:
    """A decoder in the training module's checkpoint format, at `step`, reading `shards`."""
    model_cfg = tiny_model(vocab_size=Manifest.load(shards).vocab_size, init_std=0.2)
    attention_cfg = AttentionConfig(kind=kind)  # its sizes from the model's attention_defaults
    torch.manual_seed(seed)
    net = Transformer(model_cfg, attention_cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "hyper_parameters": {
                "arch": dataclasses.asdict(model_cfg),
                "attention": dataclasses.asdict(attention_cfg),
            },
            "state_dict": {f"model.{k}": v for k, v in net.state_dict().items()},
            "datamodule_hyper_parameters": {"data_dir": str(shards)},
            "global_step": step,
        },
        path,
    )
    return path


def split_loss(ckpt: Path, shards: Path, split: str) -> float:
    """The split's loss the way the training module's evaluation takes it: the mean over batches of 8,
    weighted by their target tokens (lightning_modules/training/language_model.py)."""
    model, _ = load_model(ckpt)
    dm = ShardDataModule(str(shards), batch_size=8, num_workers=0, verify="off")
    dm.setup("test" if split == "test" else "validate")
    loader = dm.test_dataloader() if split == "test" else dm.val_dataloader()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for batch in loader:
            logits = model(batch[:, :-1])
            total += (
                float(F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())) * batch[:, 1:].numel()
            )
            tokens += batch[:, 1:].numel()
    return total / tokens


@pytest.mark.slow
def test_the_documents_add_up_to_the_split_loss_and_the_manifest(doc_shards: Path, tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path / "last.ckpt", doc_shards, "lrkv", seed=1)
    model, _ = load_model(ckpt)
    scored = score_documents(
        model, str(doc_shards), batch_size=5
    )  # batches of another size than the reference's
    manifest = Manifest.load(doc_shards)
    for split in ("test", "val"):
        part = scored[scored["split"] == split]
        info = manifest.split(split)
        assert int(part["tokens"].sum()) == info.tokens and len(part) == info.documents > 5
        assert part["loss_sum"].sum() / part["tokens"].sum() == pytest.approx(
            split_loss(ckpt, doc_shards, split), abs=1e-5
        )


def ledger(folder: Path, shards: Path, checkpoints: Path, seeds: tuple[int, ...]) -> Path:
    """runs.csv, evaluations.csv and pairs.csv for ARMS x seeds, each run's losses those of its checkpoint."""
    runs, evaluations = [], []
    for label, kind in ARMS.items():
        for seed in seeds:
            run_id, name = f"{label}{seed}".ljust(32, "0"), f"nano-{label}-seed{seed}"
            ckpt = checkpoint(checkpoints / f"{name}-{run_id[:8]}" / "last.ckpt", shards, kind, seed)
            runs.append({"run_id": run_id, "run_name": name, "label": label, "seed": seed, "steps": STEPS,
                         "test_loss": split_loss(ckpt, shards, "test")})  # fmt: skip
            evaluations.append(
                {"run_id": run_id, "split": "val", "step": STEPS, "loss": split_loss(ckpt, shards, "val")}
            )
    folder.mkdir(parents=True)
    pd.DataFrame(runs).to_csv(folder / "runs.csv", index=False)
    pd.DataFrame(evaluations).to_csv(folder / "evaluations.csv", index=False)
    pairs = [{"view": view, "a": "lrkv-r4", "b": "mha", "family": "primary", "n_pairs": len(seeds),
              "diff_mean": -0.01, "diff_sd": 0.004} for view in ("equal_flops", "equal_tokens", "equal_flops_val")]  # fmt: skip
    pd.DataFrame(pairs).to_csv(folder / "pairs.csv", index=False)
    return folder


@pytest.mark.slow
def test_the_command_scores_each_final_checkpoint_once_and_sets_both_errors_side_by_side(
    doc_shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoints = tmp_path / "checkpoints"
    folder = ledger(tmp_path / "results", doc_shards, checkpoints, seeds=(1, 2))
    assert main([str(folder), "--checkpoints", str(checkpoints)]) == 0
    out, err = capsys.readouterr()
    assert (
        err.count("scored nano-") == 4 and "| test | lrkv-r4 - mha | primary | -0.0100 (2) | 0.0028 |" in out
    )
    page = (folder / "documents.md").read_text()
    assert (
        page.startswith("# Seeds and documents: `results`") and "lrkv-r4 seeds 1, 2; mha seeds 1, 2" in page
    )
    assert "| 1 2 |" in page and out.split("written: ")[0] in page  # the table printed is the page's
    per_doc = pd.read_csv(folder / "per_document.csv")
    manifest = Manifest.load(doc_shards)
    assert len(per_doc) == 4 * (manifest.split("test").documents + manifest.split("val").documents)
    table = pd.read_csv(folder / "documents.csv").set_index("split")
    for split in ("test", "val"):
        row = table.loc[split]
        assert row["n_seeds"] == 2 and row["seeds"] == "1 2" and row["doc_se_with_noise"] >= row["doc_se"]
        seed_se = 0.004 / math.sqrt(2)  # from the ledger's pairs.csv, not from the checkpoints
        assert row["ledger_seed_se"] == pytest.approx(seed_se)
        assert row["combined_se"] == pytest.approx(math.hypot(seed_se, row["doc_se_with_noise"]))  # errs wide
        assert row["combined_low"] == pytest.approx(-0.01 - 1.959964 * row["combined_se"])
    # the per-seed differences of the checkpoints are the ledger's own losses, split by document
    runs = pd.read_csv(folder / "runs.csv").set_index(["label", "seed"])["test_loss"]
    test = per_doc[per_doc["split"] == "test"].groupby(["label", "seed"])[["loss_sum", "tokens"]].sum()
    assert (test["loss_sum"] / test["tokens"]).to_dict() == pytest.approx(runs.to_dict(), abs=1e-5)
    # again: nothing new to score, the same table
    assert main([str(folder), "--checkpoints", str(checkpoints)]) == 0
    again_out, again_err = capsys.readouterr()
    assert "scored" not in again_err and again_out == out


@pytest.mark.slow
def test_a_checkpoint_that_is_not_the_runs_end_is_refused_or_skipped(
    doc_shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoints = tmp_path / "checkpoints"
    folder = ledger(tmp_path / "results", doc_shards, checkpoints, seeds=(1,))
    runs = pd.read_csv(folder / "runs.csv")
    mha = runs.index[runs["label"] == "mha"][0]
    path = checkpoints / f"{runs.loc[mha, 'run_name']}-{runs.loc[mha, 'run_id'][:8]}" / "last.ckpt"
    runs.loc[mha, "test_loss"] += 0.01  # the ledger's run is not what this checkpoint gives
    runs.to_csv(folder / "runs.csv", index=False)
    assert main([str(folder), "--checkpoints", str(checkpoints)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("python -m lightning_modules score-documents: error: ") and "the ledger says" in err
    assert str(path) in err and not (folder / "documents.csv").exists()  # nothing written
    runs.loc[mha, "test_loss"] -= 0.01
    runs.to_csv(folder / "runs.csv", index=False)
    checkpoint(path, doc_shards, "mha", seed=1, step=STEPS - 3)  # a checkpoint from before the run's end
    assert main([str(folder), "--checkpoints", str(checkpoints)]) == 0
    err = capsys.readouterr().err
    assert f"skipped nano-mha-seed1: {path} is at step {STEPS - 3} of {STEPS}" in err
    assert (pd.read_csv(folder / "documents.csv")["n_seeds"] == 0).all()  # no mha run: no pair to compare


@pytest.mark.slow
def test_one_seed_gives_only_the_bound_and_the_combined_figures_take_it(
    doc_shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoints = tmp_path / "checkpoints"
    folder = ledger(tmp_path / "results", doc_shards, checkpoints, seeds=(1,))
    assert main([str(folder), "--checkpoints", str(checkpoints)]) == 0
    out = capsys.readouterr().out
    row = pd.read_csv(folder / "documents.csv").set_index("split").loc["test"]
    assert (
        math.isnan(row["doc_se"]) and row["doc_se_with_noise"] > 0
    )  # no second seed to share documents with
    assert math.isnan(row["ledger_seed_se"]) and math.isnan(
        row["combined_se"]
    )  # the ledger's one pair: no sd
    assert f"| 1 |  | {row['doc_se_with_noise']:.4f} | " in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkpoints", "nowhere"], "--checkpoints nowhere: no such folder"),
        (["--checkpoints", ".", "--batch-size", "0"], "--batch-size 0: give a positive number"),
    ],
    ids=["no-checkpoints", "batch-size"],
)
def test_bad_options_end_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main([str(tmp_path), *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_a_ledger_without_a_report_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path), "--checkpoints", str(tmp_path)]) == 2
    line = capsys.readouterr().err.strip()
    assert f"no {tmp_path / 'runs.csv'}: report the protocol first" in line and "\n" not in line
