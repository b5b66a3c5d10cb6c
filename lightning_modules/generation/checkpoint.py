"""The decoder of a training checkpoint, ready to generate.

The checkpoint is the training module's Lightning checkpoint: "hyper_parameters" holds "arch" (ModelConfig
fields) and "attention" (AttentionConfig fields), "state_dict" the decoder's weights under "model.", and
"datamodule_hyper_parameters" the "data_dir" the run read. A sharded (FSDP) checkpoint folder is read too, its
weights gathered in memory, through the same safe reader as every command (lightning_modules/checkpoint/reader.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lightning_modules.checkpoint.reader import read_checkpoint
from lightning_modules.core.errors import ConfigError, UserError
from lightning_modules.model.attention import AttentionConfig
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.transformer import Transformer

STATE_PREFIX = "model."  # the LightningModule holds the decoder as self.model
COMPILED_PREFIX = "_orig_mod."  # torch.compile's wrapper, when the run compiled the model


class GenerateError(UserError, RuntimeError):
    """A checkpoint, manifest or tokenizer that cannot be used; the message names the file."""


def _config(cls: type, value: Any, where: str) -> Any:
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise GenerateError(f"{where}: expected a dict of {cls.__name__} fields, got {type(value).__name__}")
    return cls(**value)


def load_model(
    ckpt_path: str | Path, device: torch.device | str = "cpu"
) -> tuple[Transformer, dict[str, Any]]:
    """The decoder of a Lightning checkpoint, in eval mode on `device`, and the checkpoint dict."""
    path = Path(ckpt_path)
    if not path.exists():
        raise GenerateError(f"--ckpt {path}: no such checkpoint file; give a .ckpt written by fit")
    try:  # weights_only: a foreign file or folder is refused, never unpickled
        ckpt = read_checkpoint(path, "--ckpt", required=(), weights=True)
    except UserError as exc:
        raise GenerateError(str(exc)) from exc
    try:
        hp = ckpt["hyper_parameters"]
        model_cfg = _config(ModelConfig, hp["arch"], f"{path}: hyper_parameters.arch")
        attention_cfg = _config(AttentionConfig, hp["attention"], f"{path}: hyper_parameters.attention")
        state = ckpt["state_dict"]
    except KeyError as exc:
        raise GenerateError(
            f"{path}: not a training checkpoint of this project (no {exc.args[0]!r})"
        ) from exc
    except (TypeError, ConfigError) as exc:
        raise GenerateError(f"{path}: bad model config in hyper_parameters ({exc})") from exc
    model = Transformer(model_cfg, attention_cfg)
    weights = {
        k.removeprefix(STATE_PREFIX).replace(COMPILED_PREFIX, ""): v
        for k, v in state.items()
        if k.startswith(STATE_PREFIX)
    }
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise GenerateError(f"{path}: weights do not fit the config in the checkpoint ({exc})") from exc
    return model.to(device).eval(), ckpt
