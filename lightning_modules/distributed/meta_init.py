"""Meta-device initialisation (`model.parallel.meta_init: true`): the decoder is built on the meta device
(shapes only, no memory), sharded there (lightning_modules/distributed/parallel.py), and then each rank allocates and
initialises only what it holds: under FSDP its dim-0 shard of every parameter, so no rank ever holds the
whole model (at 6.3b in fp32 that is ~25 GB a rank, ~200 GB for a node of 8).

Initialisation is Transformer.init_weights, unchanged, run on the local shards: the same distributions
(N(0, std), residual outputs N(0, std / sqrt(2 L)), LRKV's B at residual_init / sqrt(r), gains 1). Each
shard draws from its own stream, seeded by the run's seed and the rank's position along the mesh's shard
dimension, so the weights are the same for the same seed and world size, shards are independent of each
other, and the replicas of a hybrid mesh (same shard position on another node) are equal. They are not
the weights of a whole-model init (a different random stream), which is why meta_init is a setting and
not implied by the strategy: a run keeps its weights when its strategy changes unless it asks.
The RoPE tables, buffers computed from the config, are rebuilt on the device.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from lightning_modules.model.attention import AttentionConfig, Resolved
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.layers import RotaryEmbedding
from lightning_modules.model.transformer import Transformer

# Spreads (seed, shard position) pairs over torch's seed space; any odd constant above the world size works.
_SHARD_STRIDE = 1_000_003


def build_on_meta(model: ModelConfig, attention: AttentionConfig | Resolved) -> Transformer:
    with torch.device("meta"):
        return Transformer(model, attention)


def shard_position(model: Transformer) -> int:
    """This rank's index along the shard dimension of the parameters' mesh (0 when nothing is sharded)."""
    p = next(model.parameters())
    if not isinstance(p, DTensor):
        return 0
    mesh = p.device_mesh
    return mesh.get_local_rank(mesh.ndim - 1)  # (shard,) or (replicate, shard): the last dim shards


def materialize(model: Transformer, device: torch.device | str, seed: int) -> None:
    """Allocate the (local shards of the) parameters on `device` and initialise them; the global RNG state
    is left as it was (data order and dropout-free training depend on it)."""
    model.to_empty(device=device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed * _SHARD_STRIDE + shard_position(model))
        model.init_weights()
    rope = model.rope
    model.rope = RotaryEmbedding(rope.dim, rope.max_seq_len, rope.base).to(device)


def is_meta(model: torch.nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())
