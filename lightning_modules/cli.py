"""LightningCLI for fit / validate / test, with the project's conventions applied before anything runs:

- the data manifest's vocabulary size is written into model.arch.vocab_size, and a model.arch.seq_len that
  differs from the manifest's is an error (shards are packed at one length);
- seed_everything also seeds the data order;
- trainer.precision, when not set, is chosen by the hardware (lightning_modules/precision.py), printed once
  and tagged on the MLflow run;
- the MLflow logger gets the store (./mlruns SQLite or MLFLOW_TRACKING_URI), the run name
  `{size}-{label}-seed{seed}` and its tags; the store is checked before the first step;
- checkpoints go to checkpoints/<run name>-<time> unless a dirpath is given; a run resumed or evaluated
  from a checkpoint continues the MLflow run that wrote it.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from jsonargparse import Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_only
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from data.datamodule import ShardDataModule
from lightning_modules import costs, precision, tracking
from lightning_modules.attention import AttentionConfig, resolve_attention
from lightning_modules.config import ConfigError, ModelConfig
from lightning_modules.language_model import Budget, LanguageModel
from lightning_modules.lightning_api import METADATA_FILENAME
from lightning_modules.optim.setup import OptimizerConfig


def _budget_label(budget: Namespace | None) -> str:
    return Budget(**budget.as_dict()).describe() if budget is not None else "steps"


def _init_args(component: Any) -> Namespace | None:
    return component.get("init_args") if isinstance(component, Namespace) else None


def _checkpoint_run_id(path: Path) -> str | None:
    """The MLflow run that wrote a checkpoint: a single file, or a sharded FSDP directory whose non-tensor
    state sits in its metadata file."""
    if path.is_dir():
        path = path / METADATA_FILENAME
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", mmap=path.stat().st_size > 0, weights_only=False).get(
        "mlflow_run_id"
    )


class MLflowConfigCallback(SaveConfigCallback):
    """Rank 0 logs the flattened merged config and the derived costs as parameters, the merged config.yaml
    as an artifact, and the checkpoint directory as a tag."""

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        logger = trainer.logger
        if not isinstance(logger, MLFlowLogger):
            return
        client, run_id = logger.experiment, logger.run_id
        run = client.get_run(run_id)
        resumed = "mlflow.source.name" in run.data.tags and bool(run.data.params)
        if not resumed:  # MLflow forbids changing a parameter; a resumed run keeps the first values
            params = tracking.flatten(self.config.as_dict())
            row = costs.cost_row(pl_module.arch, pl_module.attention)
            params.update({f"cost.{k}": v for k, v in row.items() if k not in ("size", "attention", "label")})
            logger.log_hyperparams(params)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / ("config.yaml" if not resumed else f"config-{stage}-{int(time.time())}.yaml")
            path.write_text(self.parser.dump(self.config, skip_none=False))
            client.log_artifact(run_id, str(path))
        callback = trainer.checkpoint_callback
        if stage == "fit" and callback is not None and callback.dirpath:
            client.set_tag(run_id, "checkpoint_dir", str(Path(callback.dirpath).resolve()))


class LanguageModelCLI(LightningCLI):
    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        super().__init__(
            LanguageModel,
            ShardDataModule,
            save_config_callback=MLflowConfigCallback,
            save_config_kwargs={"save_to_log_dir": False},
            args=args,
            run=run,
            auto_configure_optimizers=False,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("seed_everything", "data.seed")

    def _section(self) -> Namespace:
        return self.config[self.subcommand] if self.subcommand else self.config

    def before_instantiate_classes(self) -> None:
        """Validate the configs and apply the conventions; a bad value is a parse error naming its field."""
        cfg = self._section()
        try:
            arch = ModelConfig(**cfg.model.arch.as_dict())
            attention = resolve_attention(arch, AttentionConfig(**cfg.model.attention.as_dict()))
            for key, dataclass in (("optimizer", OptimizerConfig), ("budget", Budget)):
                if cfg.model.get(key) is not None:
                    dataclass(**cfg.model[key].as_dict())
            self._link_manifest(cfg)
        except ConfigError as e:
            self.parser.error(str(e))
        name = tracking.run_name(arch, attention, cfg.seed_everything)
        self._choose_precision(cfg)
        self._configure_logger(cfg, arch, attention, name)
        self._configure_checkpoints(cfg, name)

    def _choose_precision(self, cfg: Namespace) -> None:
        hardware = precision.detect(cfg.trainer.get("accelerator"))
        choice = precision.choose(cfg.trainer.get("precision"), hardware)
        cfg.trainer.precision = choice.precision
        self._precision_tags = {
            "precision": choice.precision,
            "precision_source": choice.source,
            "hardware": hardware.capability,
            "hardware_name": hardware.name,
        }
        rank_zero_info(precision.describe(choice))

    def _link_manifest(self, cfg: Namespace) -> None:
        manifest_path = Path(cfg.data.data_dir) / "manifest.json"
        if not manifest_path.exists():
            raise ConfigError(
                f"data.data_dir={cfg.data.data_dir}: no manifest.json there; build shards with `make data` "
                f"or `python -m data.prepare --out {cfg.data.data_dir} ...`"
            )
        manifest = json.loads(manifest_path.read_text())
        if cfg.model.arch.seq_len != manifest["seq_len"]:
            raise ConfigError(
                f"model.arch.seq_len={cfg.model.arch.seq_len} differs from seq_len={manifest['seq_len']} in "
                f"{manifest_path}; prepare shards with --seq-len {cfg.model.arch.seq_len} or set model.arch.seq_len"
            )
        cfg.model.arch.vocab_size = manifest["vocab_size"]  # the tokenizer defines it; linked, never repeated

    def _configure_logger(
        self, cfg: Namespace, arch: ModelConfig, attention: AttentionConfig, name: str
    ) -> None:
        loggers = cfg.trainer.logger if isinstance(cfg.trainer.logger, list) else [cfg.trainer.logger]
        for logger in loggers:
            args = _init_args(logger)
            if args is None or not logger.class_path.endswith("MLFlowLogger"):
                continue
            if not args.get("tracking_uri"):
                args.tracking_uri = tracking.tracking_uri()
            if not args.get("artifact_location"):
                args.artifact_location = tracking.local_artifact_location(args.tracking_uri)
            if not args.get("run_name"):
                args.run_name = name
            tags = tracking.run_tags(
                arch, attention, cfg.seed_everything, _budget_label(cfg.model.get("budget"))
            )
            args.tags = {**tags, **self._precision_tags, **(args.get("tags") or {})}
            ckpt_path = cfg.get("ckpt_path")
            if ckpt_path and not args.get("run_id"):
                args.run_id = _checkpoint_run_id(Path(ckpt_path))
            self._tracking_uri = args.tracking_uri

    def _configure_checkpoints(self, cfg: Namespace, name: str) -> None:
        for callback in cfg.trainer.get("callbacks") or []:
            args = _init_args(callback)
            if (
                args is not None
                and callback.class_path.endswith("ModelCheckpoint")
                and not args.get("dirpath")
            ):
                args.dirpath = str(Path("checkpoints") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")

    def _check_tracking(self) -> None:
        uri = getattr(self, "_tracking_uri", None)
        # Rank 0 only: under torchrun or srun every rank runs this, and ranks racing to create a fresh
        # SQLite store can collide; rank 0 is also the only one that logs.
        if uri and rank_zero_only.rank == 0:
            tracking.check_reachable(uri)

    def before_fit(self) -> None:
        self._check_tracking()

    def before_validate(self) -> None:
        self._check_tracking()

    def before_test(self) -> None:
        self._check_tracking()


def main(args: list[str] | None = None, run: bool = True) -> LanguageModelCLI:
    return LanguageModelCLI(args=args, run=run)
