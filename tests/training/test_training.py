"""Training through main(): every attention fits and tests, lands in MLflow, trains on an equal FLOPs
budget, resumes exactly, and stops on a non-finite loss keeping the last good checkpoint."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from mlflow.tracking import MlflowClient

from lightning_modules.costs import counts as costs
from lightning_modules.optim.setup import OptimizerConfig
from lightning_modules.tracking.store import TrackingUnreachableError
from lightning_modules.training.language_model import LanguageModel, NonFiniteLossError
from main import main
from tests.conftest import TINY_SEQ_LEN
from tests.helpers import KINDS, attn, tiny_model
from tests.training.helpers import BATCH, args, losses, only_run

BUDGET_FLOPS = 6e9  # about five steps of nano at 4 x 32 tokens


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_fit_then_test_lands_in_mlflow_on_an_equal_flops_budget(
    kind: str, tiny_shards: Path, mlflow_uri: str
) -> None:
    cli = main(args("fit", tiny_shards, kind, "--model.budget.flops", str(BUDGET_FLOPS)))
    model = cli.model
    step_flops = BATCH * TINY_SEQ_LEN * model.flops_per_token(BATCH * TINY_SEQ_LEN)
    # One FLOPs budget, every variant: at least the budget, less than one step more.
    assert BUDGET_FLOPS <= model.flops_seen < BUDGET_FLOPS + step_flops
    assert cli.trainer.global_step == math.ceil(BUDGET_FLOPS / step_flops)
    last = Path(cli.trainer.checkpoint_callback.last_model_path)
    # two test batches: the whole split (about 500 batches) proves nothing more here, and
    # tests/data/test_datamodule.py shows evaluation reads every sample once
    main(args("test", tiny_shards, kind, "--ckpt_path", str(last), "--trainer.limit_test_batches", "2"))

    client, run = only_run(mlflow_uri)  # test continued the run that fit started
    assert run.info.run_name == f"nano-{model.attention.label()}-seed7"
    tags = run.data.tags
    assert (tags["size"], tags["attention"], tags["seed"]) == ("nano", kind, "7")
    assert tags["budget"] == f"flops={BUDGET_FLOPS:.3g}" and len(tags["git_commit"]) >= 7
    assert Path(tags["checkpoint_dir"]) == last.parent.resolve()
    nano, attention = costs.load_configs([costs.fragment("model", "nano"), costs.fragment("attention", kind)])
    resolved = costs.as_resolved(nano, attention)
    d_qk, d_v = resolved.variant.score_dims(nano, resolved.knobs)  # unequal (mla's) keep SDPA off its flash
    assert tags["attention_kernel"] == ("sdpa:flash" if d_qk == d_v else "sdpa:math")  # SDPA's CPU backends
    params = run.data.params
    expected = costs.cost_row(model.arch, model.attention)
    assert (
        int(params["cost.params"]) == expected["params"] == sum(p.numel() for p in model.model.parameters())
    )
    assert int(params["cost.kv_cache_bytes_per_token"]) == expected["kv_cache_bytes_per_token"]
    assert params["model.arch.n_layer"] == "4" and params["model.attention.kind"] == kind
    assert params["model.arch.vocab_size"] == "512"  # linked from the manifest, not nano.yaml's 4096
    metrics = run.data.metrics
    for name in (
        "train/loss",
        "train/tokens",
        "train/flops",
        "val/loss",
        "val/bpb",
        "test/loss",
        "test/ppl",
        "test/bpb",
    ):
        assert math.isfinite(metrics[name]), name
    assert metrics["train/tokens"] == model.tokens_seen == cli.trainer.global_step * BATCH * TINY_SEQ_LEN
    assert metrics["test/flops"] == pytest.approx(model.flops_seen)
    assert metrics["test/ppl"] == pytest.approx(math.exp(metrics["test/loss"]), rel=1e-5)
    assert sorted(losses(client, run.info.run_id)) == list(
        range(cli.trainer.global_step)
    )  # every step logged
    assert "config.yaml" in [a.path for a in client.list_artifacts(run.info.run_id)]


@pytest.mark.slow
def test_resume_continues_exactly(tiny_shards: Path, mlflow_uri: str, tmp_path: Path) -> None:
    common = ("--trainer.max_steps", "8", "--trainer.limit_val_batches", "0", "--trainer.callbacks+=ModelCheckpoint",
              "--trainer.callbacks.every_n_train_steps", "4")  # fmt: skip
    straight = main(
        args("fit", tiny_shards, "lrkv", *common, "--trainer.callbacks.dirpath", str(tmp_path / "a"))
    )
    interrupted = main(
        args("fit", tiny_shards, "lrkv", *common, "--trainer.callbacks.dirpath", str(tmp_path / "b"),
             "--trainer.callbacks+=tests.training_callbacks.StopAtStep", "--trainer.callbacks.step", "4")
    )  # fmt: skip
    assert interrupted.trainer.global_step == 4
    ckpt = next((tmp_path / "b").glob("*step=4.ckpt"))
    resumed = main(args("fit", tiny_shards, "lrkv", *common, "--trainer.callbacks.dirpath", str(tmp_path / "c"),
                        "--ckpt_path", str(ckpt)))  # fmt: skip
    assert resumed.trainer.global_step == 8
    client = MlflowClient(mlflow_uri)
    a = losses(client, straight.trainer.logger.run_id)
    b = losses(client, interrupted.trainer.logger.run_id)  # the resumed run continues this MLflow run
    assert resumed.trainer.logger.run_id == interrupted.trainer.logger.run_id
    assert sorted(a) == sorted(b) == list(range(8))
    for step in range(8):
        assert b[step] == pytest.approx(a[step], abs=1e-6), step
    assert resumed.model.tokens_seen == straight.model.tokens_seen
    assert resumed.model.flops_seen == pytest.approx(straight.model.flops_seen)
    for p, q in zip(resumed.model.parameters(), straight.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(
    tiny_shards: Path, mlflow_uri: str, tmp_path: Path
) -> None:
    extra = ("--trainer.max_steps", "10", "--trainer.limit_val_batches", "0",
             "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps", "2",
             "--trainer.callbacks.dirpath", str(tmp_path / "ck"),
             "--trainer.callbacks+=tests.training_callbacks.PoisonAtStep", "--trainer.callbacks.step", "5")  # fmt: skip
    with pytest.raises(NonFiniteLossError, match=r"non-finite training loss \(nan\) at step 5") as err:
        main(args("fit", tiny_shards, "mha", *extra))
    good = tmp_path / "ck" / "epoch=0-step=4.ckpt"
    assert str(good) in str(err.value)
    assert not list((tmp_path / "ck").glob("*step=5*")) and not list((tmp_path / "ck").glob("*step=6*"))
    state = torch.load(good, weights_only=False)["state_dict"]
    assert all(torch.isfinite(t).all() for t in state.values())


def test_unreachable_tracking_server_fails_before_training(
    tiny_shards: Path, mlflow_uri: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(TrackingUnreachableError, match=r"http://127\.0\.0\.1:9 is unreachable"):
        main(args("fit", tiny_shards, "mha", "--trainer.max_steps", "3"))
    assert not (tmp_path / "checkpoints").exists() or not list((tmp_path / "checkpoints").rglob("*.ckpt"))


@pytest.mark.slow
def test_fit_ending_between_checkpoint_steps_still_saves_the_end(
    tiny_shards: Path, mlflow_uri: str, tmp_path: Path
) -> None:
    extra = ("--trainer.max_steps", "5", "--trainer.limit_val_batches", "0",
             "--trainer.callbacks.every_n_train_steps", "2", "--trainer.callbacks.save_top_k", "-1",
             "--trainer.callbacks.dirpath", str(tmp_path / "ck"))  # fmt: skip
    cli = main(
        args(
            "fit",
            tiny_shards,
            "mha",
            *extra[:4],
            "--trainer.callbacks+=lightning_modules.checkpoint.callback.EndOfFitModelCheckpoint",
            *extra[4:],
        )
    )
    steps = sorted(torch.load(p, weights_only=True)["global_step"] for p in (tmp_path / "ck").glob("*.ckpt"))
    assert steps == [2, 4, 5]  # every 2 steps, and the end
    base = Path(cli.trainer.checkpoint_callbacks[0].last_model_path)  # conf/base.yaml's callback: last.ckpt
    assert base.name == "last.ckpt" and torch.load(base, weights_only=True)["global_step"] == 5


@pytest.mark.slow
def test_no_training_length_is_an_error(tiny_shards: Path, mlflow_uri: str) -> None:
    from lightning_modules.core.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"trainer\.max_steps or model\.budget must set the training length"
    ):
        main(args("fit", tiny_shards, "mha", "--trainer.max_steps", "-1"))


def test_ddp_fits_split_newton_schulz_over_their_ranks() -> None:
    """configure_optimizers asks Muon for the DDP split (lightning_modules/optim/distributed.py) only where
    every rank holds the whole model: DDP with several ranks; not one device, not FSDP's DTensors."""
    module = LanguageModel(tiny_model(), attn("lrkv"), OptimizerConfig(name="muon"))
    for strategy, world, replicated in (
        (DDPStrategy(), 2, True),
        (DDPStrategy(), 1, False),
        (SingleDeviceStrategy(torch.device("cpu")), 1, False),
    ):
        module._trainer = SimpleNamespace(strategy=strategy, world_size=world, max_steps=10)  # type: ignore[assignment]
        assert module.configure_optimizers()["optimizer"].replicated is replicated, (strategy, world)
