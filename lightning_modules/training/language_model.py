"""The LightningModule: next-token cross-entropy, evaluation metrics, optimisers and compute accounting.

Every training step adds the tokens it trained on and their FLOPs (lightning_modules/costs/counts.py, on the path that runs) to
counters that travel in the checkpoint, so curves can be drawn against tokens or against compute and a
budget in either sets the number of steps (docs/costs.md).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torchmetrics import MeanMetric

from lightning_modules.checkpoint import step_log
from lightning_modules.core import lightning_api
from lightning_modules.core.errors import ConfigError
from lightning_modules.costs import counts as costs
from lightning_modules.costs.budget import Budget
from lightning_modules.distributed import meta_init
from lightning_modules.distributed.parallel import (
    ParallelConfig,
    data_parallel_mesh,
    parallelize,
    param_dtype_for,
)
from lightning_modules.model.attention import AttentionConfig, Resolved, kernel, resolve
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.transformer import Transformer
from lightning_modules.optim.setup import OptimizerConfig, build_optimizer, build_schedule
from lightning_modules.training import host_sync


class NonFiniteLossError(RuntimeError):
    """Training stopped on a NaN or infinite loss; no checkpoint of the bad state was written."""


def _as(cls: type, value: Any) -> Any:
    """Accept a dataclass or its dict (checkpoints store dicts so they load without this package's pickles)."""
    return cls(**value) if isinstance(value, dict) else value


class LanguageModel(L.LightningModule):
    def __init__(
        self,
        arch: ModelConfig,
        attention: AttentionConfig,
        optimizer: OptimizerConfig | None = None,
        budget: Budget | None = None,
        parallel: ParallelConfig | None = None,
        compile: bool = False,
    ) -> None:
        """compile: torch.compile each decoder block (lightning_modules/distributed/compile.py)."""
        super().__init__()
        self.arch: ModelConfig = _as(ModelConfig, arch)
        # Resolved once, here where the model is built; the decoder and the cost model take it as it is.
        self.resolved: Resolved = resolve(self.arch, _as(AttentionConfig, attention))
        self.attention: AttentionConfig = self.resolved.config
        self.optim_config: OptimizerConfig = _as(OptimizerConfig, optimizer) or OptimizerConfig()
        self.budget: Budget = _as(Budget, budget) or Budget()
        self.parallel: ParallelConfig = _as(ParallelConfig, parallel) or ParallelConfig()
        self.compile_blocks = compile
        # logger=False: the CLI logs the whole merged config once (cli.MLflowConfigCallback), not this subset.
        self.save_hyperparameters(logger=False)
        if self.parallel.meta_init:  # shapes only; configure_model shards, then materialises (lightning_modules/distributed/meta_init.py)
            self.model = meta_init.build_on_meta(self.arch, self.resolved)
        else:
            self.model = Transformer(self.arch, self.resolved)
        self.tokens_seen = 0
        self._flops_per_token: dict[int, float] = {}
        self.flops_seen = 0.0
        self.metrics = torch.nn.ModuleDict({split: MeanMetric() for split in ("val", "test")})
        self._parallelized = False
        self._kernel_logged = False
        self._last_step: step_log.StepMetrics | None = None  # what the latest training step logs
        self._loss_watch = host_sync.LossWatch()  # read back only on host_sync.due steps
        self._resumed_unlogged: dict[str, Any] | None = (
            None  # from the checkpoint resumed (lightning_modules/checkpoint/step_log.py)
        )

    # ----- compute accounting -------------------------------------------------------------------
    def flops_per_token(self, tokens_per_forward: int) -> float:
        # Called every training step: computed once per micro-batch size, not re-resolved each step.
        if tokens_per_forward not in self._flops_per_token:
            self._flops_per_token[tokens_per_forward] = costs.train_flops_per_token(
                self.arch, self.resolved, tokens_per_forward
            )
        return self._flops_per_token[tokens_per_forward]

    def tokens_per_step(self, micro_batch: int) -> int:
        """Tokens one optimizer step trains on, over all ranks and accumulated micro-batches."""
        trainer = self.trainer
        return micro_batch * self.arch.seq_len * trainer.world_size * trainer.accumulate_grad_batches

    def budget_steps(self, micro_batch: int) -> int | None:
        per_step = self.tokens_per_step(micro_batch)
        if self.budget.tokens is not None:
            return math.ceil(self.budget.tokens / per_step)
        if self.budget.flops is not None:
            return math.ceil(
                self.budget.flops / (per_step * self.flops_per_token(micro_batch * self.arch.seq_len))
            )
        return None

    def setup(self, stage: str) -> None:
        if stage != "fit":
            return
        datamodule = getattr(self.trainer, "datamodule", None)
        micro_batch = getattr(datamodule, "batch_size", None)
        if self.budget.tokens is not None or self.budget.flops is not None:
            if micro_batch is None:
                raise ConfigError("model.budget needs a datamodule with a batch_size to turn into steps")
            # Lightning reads max_steps from the fit loop; the budget replaces trainer.max_steps.
            self.trainer.fit_loop.epoch_loop.max_steps = self.budget_steps(micro_batch)
        if self.trainer.max_steps is None or self.trainer.max_steps < 1:
            raise ConfigError("trainer.max_steps or model.budget must set the training length")

    # ----- parallelism (docs/architecture.md, "Scale"; lightning_modules/distributed/parallel.py) ----------------------------
    def configure_model(self) -> None:
        """Shard the built decoder with FSDP2 when the strategy gives a device mesh (FSDP2Strategy), and
        checkpoint each block's activations if asked, whatever the strategy. Lightning calls this hook in
        every fit / validate / test, so it applies once."""
        if self._parallelized:
            return
        if self.device_mesh is None:
            unused = self.parallel.sharding_settings_changed()
            if (
                unused
            ):  # docs/architecture.md, "Style": a knob that cannot apply is an error, not silently ignored
                raise ConfigError(
                    f"{', '.join(unused)}: only a sharded strategy uses this; compose conf/strategy/fsdp.yaml "
                    "or conf/strategy/hybrid-fsdp.yaml"
                )
            parallelize(self.model, self.parallel, None, None, compile=self.compile_blocks)
        else:
            mesh = data_parallel_mesh(self.device_mesh, self.parallel.sharding, self.trainer.num_nodes)
            precision = param_dtype_for(str(self.trainer.precision))
            parallelize(self.model, self.parallel, mesh, precision, compile=self.compile_blocks)
        if meta_init.is_meta(self.model):
            meta_init.materialize(self.model, self.trainer.strategy.root_device, torch.initial_seed())
        self._parallelized = True

    def on_train_start(self) -> None:
        self._kernel_logged = False
        kernel.forget()  # tag the first training step's kernels, not the sanity check's (no grad there)
        if self._resumed_unlogged is not None and self.trainer.is_global_zero:
            logged = step_log.log_missing(self.logger, self._resumed_unlogged)
            if logged:
                rank_zero_info(f"resume: logged step {self._resumed_unlogged['step']}'s {', '.join(logged)}")
        self._resumed_unlogged = None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """After the first step, say which attention kernel ran (kernel.attend records each call's, SDPA's
        backend included, e.g. sdpa:flash): MLflow tags `attention_kernel` and `attention_kernel_reason` on
        rank 0, and a log line."""
        if self._kernel_logged:
            return
        self._kernel_logged = True
        ran, why = kernel.summary()
        rank_zero_info(f"attention kernel: {ran} ({why})")
        if isinstance(self.logger, MLFlowLogger) and self.trainer.is_global_zero:
            self.logger.experiment.set_tag(self.logger.run_id, "attention_kernel", ran)
            self.logger.experiment.set_tag(self.logger.run_id, "attention_kernel_reason", why)

    # ----- steps --------------------------------------------------------------------------------
    def forward(self, tokens: Tensor) -> Tensor:
        return self.model(tokens)

    def _loss(self, batch: Tensor) -> Tensor:
        """batch: (B, T + 1) token ids; predict tokens 1..T from 0..T-1. Mean cross-entropy in nats, fp32,
        in chunks that never hold the (B, T, V) logits (lightning_modules/model/loss.py)."""
        return self.model(batch[:, :-1], targets=batch[:, 1:])

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self._loss_watch.observe(loss, self.global_step, batch_idx)
        due = host_sync.due(self.trainer)  # the steps Lightning logs, the only ones that read back
        if due:
            self._stop_if_non_finite(now=self.global_step)
        tokens = batch[:, 1:].numel() * self.trainer.world_size
        self.tokens_seen += tokens
        self.flops_seen += tokens * self.flops_per_token(batch[:, 1:].numel())
        metrics = {
            "train/loss": loss.detach(),
            "train/tokens": float(self.tokens_seen),
            "train/flops": self.flops_seen,
        }
        # Every step logs only the loss, a device tensor. A logged float becomes a device tensor by a blocking
        # copy (a host sync on CUDA), and Lightning reads every progress-bar value back at each batch's end
        # (its logger connector's on_batch_end), so the counters, and the bar's host copy of the loss, are
        # logged on the steps that log: the values reaching the logger are the same.
        self.log("train/loss", metrics["train/loss"])
        if due:
            self.log("train/tokens", metrics["train/tokens"])
            self.log("train/flops", metrics["train/flops"])
            self.log("loss", loss.detach().float().cpu(), prog_bar=True, logger=False)
        self._last_step = step_log.StepMetrics(lightning_api.log_step(self.trainer), metrics)
        return loss

    def _stop_if_non_finite(self, now: int | None = None, found: str = "") -> None:
        """Raise NonFiniteLossError naming the first non-finite loss seen, if any: at training step `now`
        (before its update), or where `found` says. A loss is read back only every
        trainer.log_every_n_steps steps, so the steps between the bad one and the check may have updated the
        weights; no checkpoint is written after it (on_save_checkpoint checks first). Every rank raises the
        same error, naming the rank that saw the loss."""
        # Every rank reaches each call on the same step (host_sync.due, a checkpoint save, the fit's end), so
        # the gather is a collective they all enter: each stops on the same first bad loss, not only its own.
        gather = self.trainer.strategy.all_gather if self.trainer.world_size > 1 else None
        bad = self._loss_watch.first_bad(self.device, gather)
        if bad is None:
            return
        step, rank, batch_idx, value = bad
        where = f" on rank {rank}" if self.trainer.world_size > 1 else ""
        if now == step:
            found = "stopped before the update"
        elif now is not None:
            found = (
                f"found at step {now}, before its update (the loss is read back every "
                f"{host_sync.every(self.trainer)} steps: trainer.log_every_n_steps): steps {step} to "
                f"{now - 1} updated the weights and no checkpoint was written after it"
            )
        raise NonFiniteLossError(
            f"non-finite training loss ({value}) at step {step} (batch {batch_idx}){where}; {found}. "
            f"Last good checkpoint: {self._last_checkpoint()}"
        )

    def on_train_end(self) -> None:
        self._stop_if_non_finite(found="found at the end of training (the last steps are checked here)")

    def _last_checkpoint(self) -> str:
        """The newest checkpoint any ModelCheckpoint callback has written (in this run, or in its folder)."""
        paths = set()
        for callback in self.trainer.checkpoint_callbacks:
            paths.update([callback.last_model_path, callback.best_model_path, *callback.best_k_models])
            if callback.dirpath:  # a save refused by on_save_checkpoint has moved the paths above on already
                paths.update(str(p) for p in Path(callback.dirpath).glob("*.ckpt"))
        written = [Path(p) for p in paths if p and Path(p).exists()]  # sharded checkpoints are directories
        return str(max(written, key=lambda p: p.stat().st_mtime_ns)) if written else "none written yet"

    def _eval_step(self, split: str, batch: Tensor) -> None:
        loss = self._loss(batch)
        self.metrics[split].update(loss, weight=batch[:, 1:].numel())  # token-weighted, synced across ranks

    def _eval_end(self, split: str) -> None:
        metric = self.metrics[split]
        if metric.update_count == 0:
            return
        ce = metric.compute()
        metric.reset()
        values = {f"{split}/ppl": ce.exp(), f"{split}/tokens": float(self.tokens_seen)}
        values[f"{split}/flops"] = self.flops_seen
        tokens_per_byte = self._tokens_per_byte(split)
        if tokens_per_byte is not None:
            # bits per byte = nats per token / ln 2 x tokens per UTF-8 byte of that split's text
            values[f"{split}/bpb"] = ce / math.log(2) * tokens_per_byte
        self.log_dict(values, sync_dist=False)
        self.log(f"{split}/loss", ce, prog_bar=True)

    def _tokens_per_byte(self, split: str) -> float | None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is None or not hasattr(datamodule, "text_bytes"):
            return None
        return datamodule.tokens(split) / datamodule.text_bytes(split)

    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        self._eval_step("val", batch)

    def on_validation_epoch_end(self) -> None:
        self._eval_end("val")

    def test_step(self, batch: Tensor, batch_idx: int) -> None:
        self._eval_step("test", batch)

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")

    # ----- optimisation -------------------------------------------------------------------------
    def configure_optimizers(self) -> dict[str, Any]:
        # Under DDP every rank holds the whole model, so Muon splits Newton-Schulz over the ranks
        # (lightning_modules/optim/distributed.py); FSDP's DTensors are split by their own plan.
        replicated = isinstance(self.trainer.strategy, DDPStrategy) and self.trainer.world_size > 1
        optimizer = build_optimizer(self.model, self.optim_config, replicated=replicated)
        schedule = build_schedule(optimizer, self.optim_config, self.trainer.max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    # ----- checkpoint state beyond Lightning's ------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._stop_if_non_finite(found=f"found when saving step {self.global_step}'s checkpoint: not written")
        hparams = checkpoint.setdefault("hyper_parameters", {})
        hparams.update(
            arch=asdict(self.arch),
            attention=asdict(self.attention),
            optimizer=asdict(self.optim_config),
            budget=asdict(self.budget),
            parallel=asdict(self.parallel),
        )
        checkpoint["compute"] = {"tokens_seen": self.tokens_seen, "flops_seen": self.flops_seen}
        if isinstance(self.logger, MLFlowLogger):  # so that resume / validate / test continue this run
            checkpoint["mlflow_run_id"] = self.logger.run_id
        unlogged = step_log.pending_record(self.trainer, self._last_step)
        if unlogged is not None:
            checkpoint[step_log.CHECKPOINT_KEY] = unlogged
        # Plain tensors, ints and tuples only, so the checkpoint loads with torch.load(weights_only=True).
        name, keys, pos, has_gauss, gauss = np.random.get_state()
        checkpoint["rng"] = {
            "torch": torch.get_rng_state(),
            "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
            "python": random.getstate(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        compute = checkpoint.get("compute", {})
        self.tokens_seen = int(compute.get("tokens_seen", 0))
        self.flops_seen = float(compute.get("flops_seen", 0.0))
        self._resumed_unlogged = checkpoint.get(step_log.CHECKPOINT_KEY)
        rng = checkpoint.get("rng")
        if rng:
            torch.set_rng_state(rng["torch"])
            name, keys, pos, has_gauss, gauss = rng["numpy"]
            np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
            random.setstate(rng["python"])
