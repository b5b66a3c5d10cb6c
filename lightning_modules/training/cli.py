"""LightningCLI for fit / validate / test, with the project's conventions applied before anything runs:

- the data manifest's vocabulary size is written into model.arch.vocab_size, and a model.arch.seq_len that
  differs from the manifest's is an error (shards are packed at one length);
- seed_everything also seeds the data order;
- an integer batch limit stays an integer (`--trainer.limit_val_batches 1` is one batch, 1.0 the whole split;
  lightning_modules/training/batch_limits.py);
- trainer.precision, when not set, is chosen by the hardware (lightning_modules/core/precision.py), printed once
  and tagged on the MLflow run;
- the MLflow logger gets the store (./mlruns SQLite or MLFLOW_TRACKING_URI), the run name
  `{size}-{label}-seed{seed}` and its tags; the store is checked before the first step;
- a fit stopped by SIGTERM, Ctrl-C or SIGUSR1 saves its step, ends its MLflow run KILLED and exits non-zero
  (lightning_modules/training/signals.py adds its callback to every fit);
- checkpoints go to <trainer.default_root_dir, else the working directory>/checkpoints/<run name>-<time>-<random
  suffix> unless a dirpath is given (runs started in the same second never share a folder); a run resumed or
  evaluated from a checkpoint continues the MLflow run that wrote it; MLflow calls held through an outage are
  saved beside the checkpoints (lightning_modules/tracking/logger.py);
- `fit --ckpt_path auto` resumes from the newest readable checkpoint of the run's folders (found by the run's
  name, lightning_modules/checkpoint/newest.py) and goes on writing there, or starts fresh where there is none,
  saying which in one line: a requeued SLURM job reruns its command unchanged (scripts/slurm/train.sbatch).
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_only
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from data.datamodule import ShardDataModule
from data.manifest import Manifest
from lightning_modules.checkpoint.local_io import AtomicCheckpointIO
from lightning_modules.checkpoint.newest import newest_of_run, newest_readable, run_folder
from lightning_modules.checkpoint.reader import EARLIER, is_special, read_checkpoint
from lightning_modules.checkpoint.resume_policy import reconcile
from lightning_modules.core import precision
from lightning_modules.core.errors import ConfigError, UserError
from lightning_modules.costs import counts as costs
from lightning_modules.costs.budget import Budget
from lightning_modules.distributed.parallel import ParallelConfig
from lightning_modules.model.attention import AttentionConfig, resolve_attention
from lightning_modules.model.config import ModelConfig
from lightning_modules.optim.setup import OptimizerConfig
from lightning_modules.tracking import runs
from lightning_modules.tracking import store as tracking
from lightning_modules.tracking import ui as mlflow_ui
from lightning_modules.training.batch_limits import BatchLimitTrainer
from lightning_modules.training.final_validation import ValidateLastStep
from lightning_modules.training.language_model import LanguageModel
from lightning_modules.training.signals import StopOnSignal


def _budget_label(budget: Namespace | None) -> str:
    return Budget(**budget.as_dict()).describe() if budget is not None else "steps"


def _init_args(component: Any) -> Namespace | None:
    return component.get("init_args") if isinstance(component, Namespace) else None


def _model_defaults() -> dict[str, Any]:
    """The model sections' dataclass defaults: a value equal to its default counts as not given on resume."""
    classes = {"arch": ModelConfig, "attention": AttentionConfig, "optimizer": OptimizerConfig}
    classes.update(budget=Budget, parallel=ParallelConfig)
    return {key: dataclasses.asdict(cls()) for key, cls in classes.items()}


AUTO = "auto"  # --ckpt_path auto: the run's newest readable checkpoint, or a fresh run


def checkpoint_root(cfg: Namespace) -> Path:
    """Where run folders go: <trainer.default_root_dir>/checkpoints, else ./checkpoints (relative, as before the
    setting was read, so a run's checkpoint paths stay those its messages have always named)."""
    root = cfg.trainer.get("default_root_dir")
    return Path(root) / "checkpoints" if root else Path("checkpoints")


def _checkpoint_dirpath(cfg: Namespace) -> Path | None:
    """The dirpath given to a ModelCheckpoint callback of the config, if any (the last one: a callback a user
    adds with --trainer.callbacks+= comes after conf/base.yaml's)."""
    given = None
    for callback in cfg.trainer.get("callbacks") or []:
        args = _init_args(callback)
        if args is not None and callback.class_path.endswith("ModelCheckpoint") and args.get("dirpath"):
            given = Path(args.dirpath)
    return given


def check_yaml_files(args: list[str]) -> None:
    """A --config file with a YAML syntax error, named with its line (jsonargparse would say
    `<unicode string>`)."""
    paths = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--config"]
    paths += [arg.removeprefix("--config=") for arg in args if arg.startswith("--config=")]
    for path in paths:
        file = Path(path)
        if not file.is_file():
            continue  # jsonargparse names a missing file itself
        try:
            yaml.safe_load(file.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise UserError(f"--config {file}: YAML syntax error{at}: {problem}; fix the file") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"--config {file}: cannot be read ({exc})") from exc


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
            params = runs.flatten(self.config.as_dict())
            row = costs.cost_row(pl_module.arch, pl_module.resolved)
            params.update({f"cost.{k}": v for k, v in row.items() if k not in ("size", "attention", "label")})
            logger.log_hyperparams(params)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / ("config.yaml" if not resumed else f"config-{stage}-{int(time.time())}.yaml")
            path.write_text(self.parser.dump(self.config, skip_none=False))
            client.log_artifact(run_id, str(path))
        for key, value in (logger.tags or {}).items():
            if key.startswith("resume."):  # a continued run gets no creation tags: set these here
                client.set_tag(run_id, key, value)
        mlflow_ui.mark_model_training(client, logger.experiment_id)
        data_dir = getattr(trainer.datamodule, "data_dir", None)
        if data_dir is not None:
            mlflow_ui.log_dataset(client, run_id, data_dir, stage)
        callback = trainer.checkpoint_callback
        if stage == "fit" and callback is not None and callback.dirpath:
            client.set_tag(run_id, "checkpoint_dir", str(Path(callback.dirpath).resolve()))


class LanguageModelCLI(LightningCLI):
    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        super().__init__(
            LanguageModel,
            ShardDataModule,
            trainer_class=BatchLimitTrainer,  # `--trainer.limit_val_batches 1` is one batch (batch_limits.py)
            save_config_callback=MLflowConfigCallback,
            save_config_kwargs={"save_to_log_dir": False},
            args=args,
            run=run,
            auto_configure_optimizers=False,
        )

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """fit, validate and test. Not predict: the model has no predict_step (generation is
        `python -m lightning_modules generate`), so it is not offered rather than offered and failing."""
        return {name: keys for name, keys in LightningCLI.subcommands().items() if name != "predict"}

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        # Not a config entry: a fit without it would exit 0 on SIGTERM, and a validate or test stopped by a
        # signal would end its MLflow run FAILED rather than KILLED (signals.py, on_exception).
        if self.subcommand in ("fit", "validate", "test"):
            trainer.callbacks.append(StopOnSignal())
        # Not a config entry either: every fit, the study's workers' included (they build the trainer without
        # a subcommand), ends with a validation (final_validation.py); it acts only in a fit's training loop.
        trainer.callbacks.append(ValidateLastStep())
        # One-file checkpoints written beside their name and renamed, on any filesystem layout (local_io.py).
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        return trainer

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("seed_everything", "data.seed")

    def _parse_ckpt_path(self) -> None:
        """Replaces LightningCLI's, which unpickled the checkpoint before any check and overwrote the given
        model settings with the checkpoint's without a word: here the file is read safely (one-line errors)
        and lightning_modules/checkpoint/resume_policy.py decides what is refused and what is applied."""
        self._checkpoint: dict[str, Any] | None = None
        self._resume_applied: list[str] = []
        self._run_folder: Path | None = None
        subcommand = self.config.get("subcommand")
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if path == AUTO:
            path = self._resolve_auto(subcommand)
            self.config[subcommand].ckpt_path = path
        if not path or is_special(path):
            return
        self._checkpoint = read_checkpoint(path)
        saved = self._checkpoint.get("hyper_parameters") or {}
        given = self.config[subcommand].model.as_dict()
        merged, self._resume_applied = reconcile(given, _model_defaults(), saved, subcommand, str(path))
        self.config = self.parser.parse_object({subcommand: {"model": merged}}, self.config)
        if self._resume_applied and rank_zero_only.rank == 0:
            print(f"resume: applied {'; '.join(self._resume_applied)}", file=sys.stderr)

    def _resolve_auto(self, subcommand: str) -> str | None:
        """`--ckpt_path auto`: the newest readable checkpoint of this run, or None (a fresh run), said in one
        line. The run is known by its checkpoint folder: the dirpath given to a checkpoint callback, else the
        folders named after the run under the checkpoint root (the same command names the same run)."""
        if subcommand != "fit":
            raise UserError(f"--ckpt_path {AUTO} resumes a fit; {subcommand} needs a checkpoint's path")
        cfg = self.config[subcommand]
        set_aside = rank_zero_only.rank == 0  # one process renames unreadable files; the others skip them
        given = _checkpoint_dirpath(cfg)
        if given is not None:
            where, folder, newest = given, given, newest_readable(given, set_aside)
        else:
            try:
                arch = ModelConfig(**cfg.model.arch.as_dict())
                attention = resolve_attention(arch, AttentionConfig(**cfg.model.attention.as_dict()))
            except ConfigError as e:
                self.parser.error(str(e))
            name = runs.run_name(arch, attention, cfg.seed_everything)
            where = checkpoint_root(cfg) / f"{name}-*"
            found = newest_of_run(checkpoint_root(cfg), name, set_aside)
            folder, newest = found.folder, found.newest
        lines = [line.replace(f"; {EARLIER}", "") for line in newest.skipped]  # that advice is what auto does
        skipped = f"; skipped {len(lines)} unreadable: {' | '.join(lines)}" if lines else ""
        if newest.path is None:
            message = f"--ckpt_path {AUTO}: no readable checkpoint in {where}: starting fresh{skipped}"
        else:
            self._run_folder = folder
            message = f"--ckpt_path {AUTO}: resuming from {newest.path} (step {newest.step}){skipped}"
        if rank_zero_only.rank == 0:
            print(message, file=sys.stderr)
        return str(newest.path) if newest.path is not None else None

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
        name = runs.run_name(arch, attention, cfg.seed_everything)
        self._choose_precision(cfg)
        self._configure_checkpoints(cfg, name)
        self._configure_logger(cfg, arch, attention, name)

    def _choose_precision(self, cfg: Namespace) -> None:
        hardware = precision.detect(cfg.trainer.get("accelerator"))
        choice = precision.choose(cfg.trainer.get("precision"), hardware)
        cfg.trainer.precision = choice.precision
        self.precision_tags = {
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
                f"or `python -m lightning_modules prepare --out {cfg.data.data_dir} ...`"
            )
        # Manifest.load names a garbled or tampered manifest in one line (a UserError, data/manifest.py).
        manifest = Manifest.load(cfg.data.data_dir)
        if cfg.model.arch.seq_len != manifest.seq_len:
            raise ConfigError(
                f"model.arch.seq_len={cfg.model.arch.seq_len} differs from seq_len={manifest.seq_len} in "
                f"{manifest_path}; prepare shards with --seq-len {cfg.model.arch.seq_len} or set model.arch.seq_len"
            )
        cfg.model.arch.vocab_size = manifest.vocab_size  # the tokenizer defines it; linked, never repeated

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
            tags = runs.run_tags(arch, attention, cfg.seed_everything, _budget_label(cfg.model.get("budget")))
            args.tags = {**tags, **self.precision_tags, **(args.get("tags") or {})}
            checkpoint = getattr(self, "_checkpoint", None)
            if checkpoint is not None and not args.get("run_id"):
                args.run_id = checkpoint.get("mlflow_run_id")
            if getattr(self, "_resume_applied", None):
                args.tags["resume.applied"] = "; ".join(self._resume_applied)
            if logger.class_path.endswith("BufferedMLFlowLogger") and not args.get("pending_dir"):
                args.pending_dir = self._pending_dir(cfg)
            self._tracking_uri = args.tracking_uri

    def _configure_checkpoints(self, cfg: Namespace, name: str) -> None:
        # One random suffix per run, so two runs started in the same second never share a folder; under
        # several ranks ModelCheckpoint broadcasts rank 0's dirpath, so the ranks' own suffixes are unused.
        # A run resumed by `--ckpt_path auto` goes on in the folder it resumed from.
        folder = getattr(self, "_run_folder", None) or run_folder(checkpoint_root(cfg), name)
        for callback in cfg.trainer.get("callbacks") or []:
            args = _init_args(callback)
            if (
                args is not None
                and callback.class_path.endswith("ModelCheckpoint")
                and not args.get("dirpath")
            ):
                args.dirpath = str(folder)

    def _pending_dir(self, cfg: Namespace) -> str | None:
        """Beside the checkpoints: this fit's folder, or the folder of the checkpoint being evaluated."""
        if self.subcommand != "fit" and cfg.get("ckpt_path"):
            return str(Path(cfg.ckpt_path).parent)
        for callback in cfg.trainer.get("callbacks") or []:
            args = _init_args(callback)
            if args is not None and callback.class_path.endswith("ModelCheckpoint") and args.get("dirpath"):
                return str(args.dirpath)
        return None

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
    check_yaml_files(list(sys.argv[1:] if args is None else args))
    return LanguageModelCLI(args=args, run=run)
