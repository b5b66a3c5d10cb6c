"""Optimiser and LR schedule: AdamW, or the paper's recipe (Muon for block matrices, AdamW for the
embedding and the output head, each with its own LR; docs/paper-errata.md, "Recipe"), then linear warmup and
cosine decay."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from lightning_modules.core.errors import ConfigError
from lightning_modules.model.transformer import Transformer
from lightning_modules.optim.muon import MuonAdamW


@dataclass
class OptimizerConfig:
    """name: "adamw" (every parameter by AdamW) or "muon" (block matrices by Muon, the rest by AdamW).
    lr: the block matrices' LR (Muon's in "muon" mode). embed_lr, head_lr: AdamW LRs of the token embedding
    and the output head (default: lr). scalar_lr: AdamW LR of the norm gains (default: head_lr).
    weight_decay applies to the block matrices only; embedding, head and gains are not decayed.
    warmup_steps then cosine decay to min_lr_ratio x each group's LR at the last step."""

    name: str = "adamw"
    lr: float = 3e-3
    embed_lr: float | None = None
    head_lr: float | None = None
    scalar_lr: float | None = None
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    momentum: float = 0.95
    warmup_steps: int = 100
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in ("adamw", "muon"):
            raise ConfigError(f"optimizer.name={self.name!r}: allowed values are 'adamw', 'muon'")
        for field in ("lr", "embed_lr", "head_lr", "scalar_lr"):
            value = getattr(self, field)
            if value is not None and not value > 0:
                raise ConfigError(f"optimizer.{field}={value}: must be > 0")
        if self.warmup_steps < 0:
            raise ConfigError(f"optimizer.warmup_steps={self.warmup_steps}: must be >= 0")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"optimizer.min_lr_ratio={self.min_lr_ratio}: must be in [0, 1]")


def param_groups(
    model: Transformer, config: OptimizerConfig
) -> tuple[list[dict], dict[nn.Parameter, tuple[int, ...]]]:
    """Groups named embed, head, matrices, scalars, and the Muon row blocks of fused weights."""
    embed_lr = config.embed_lr or config.lr
    head_lr = config.head_lr or config.lr
    scalar_lr = config.scalar_lr or head_lr
    matrices: list[nn.Parameter] = []
    scalars: list[nn.Parameter] = []
    for p in model.blocks.parameters():
        (matrices if p.ndim >= 2 else scalars).append(p)
    scalars += list(model.norm.parameters())
    blocks: dict[nn.Parameter, tuple[int, ...]] = {}
    for block in model.blocks:
        for name, rows in block.attn.muon_blocks().items():
            blocks[block.attn.get_parameter(name)] = rows
    use_muon = config.name == "muon"
    groups = [
        {
            "name": "embed",
            "params": [model.embed.weight],
            "lr": embed_lr,
            "weight_decay": 0.0,
            "use_muon": False,
        },
        {
            "name": "head",
            "params": [model.head.weight],
            "lr": head_lr,
            "weight_decay": 0.0,
            "use_muon": False,
        },
        {
            "name": "matrices",
            "params": matrices,
            "lr": config.lr,
            "weight_decay": config.weight_decay,
            "use_muon": use_muon,
        },
        {"name": "scalars", "params": scalars, "lr": scalar_lr, "weight_decay": 0.0, "use_muon": False},
    ]
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters())), "a parameter has no group"
    return groups, blocks


def build_optimizer(model: Transformer, config: OptimizerConfig, replicated: bool = False) -> MuonAdamW:
    """replicated: every rank holds the whole model (DDP), so Muon splits Newton-Schulz over the ranks."""
    groups, blocks = param_groups(model, config)
    return MuonAdamW(
        groups, momentum=config.momentum, betas=config.betas, blocks=blocks, replicated=replicated
    )


def warmup_cosine(warmup_steps: int, total_steps: int, min_ratio: float) -> Callable[[int], float]:
    """LR multiplier at optimizer step s: (s + 1) / warmup during warmup, then cosine from 1 to min_ratio."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def build_schedule(optimizer: MuonAdamW, config: OptimizerConfig, total_steps: int) -> LambdaLR:
    return LambdaLR(optimizer, warmup_cosine(config.warmup_steps, total_steps, config.min_lr_ratio))
