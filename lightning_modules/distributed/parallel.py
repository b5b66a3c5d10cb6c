"""How the decoder is spread over devices: FSDP2 sharding, its precision, and activation checkpointing.

docs/architecture.md, "Scale": FSDP is torch's FSDP2 (`fully_shard`) applied per decoder block, through Lightning's
ModelParallelStrategy (lightning_modules/distributed/strategy.py gives a 1-D data-parallel mesh over every rank).
`parallelize` shards bottom-up: each block, the token embedding, then the Transformer itself (the root,
which keeps the final norm and the output head). With sharding "hybrid" the mesh becomes 2-D,
(replicate = nodes, shard = devices per node): parameters are sharded within a node and replicated across
nodes (HSDP), so the frequent all-gathers stay on the fast intra-node links.

Precision. trainer.precision stays the one switch for the compute dtype. Under "bf16-mixed" the blocks'
weights are all-gathered in bf16 (half the traffic) and autocast runs the products in bf16 as on one
device; `cast_forward_inputs=False` and an fp32 embedding keep the residual stream in fp32, so a sharded
run computes what a single-device bf16-mixed run computes (only the norm gains are rounded to bf16, and a
gain of 1 rounds exactly). Gradients are reduced in `reduce_dtype` (fp32 by default) and kept in fp32 by
the sharded parameters, which the optimiser updates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch.distributed._composable import checkpoint
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from lightning_modules.core.errors import ConfigError
from lightning_modules.distributed.compile import compile_blocks
from lightning_modules.model.transformer import Transformer

SHARDINGS = ("full", "hybrid")
REDUCE_DTYPES = ("float32", "bfloat16")


@dataclass
class ParallelConfig:
    """model.parallel: settings of the FSDP strategies (conf/strategy/fsdp.yaml, hybrid-fsdp.yaml).

    sharding: "full" shards parameters, gradients and optimiser state over every rank; "hybrid" shards
        within a node and replicates across nodes.
    reduce_dtype: dtype of the gradient reduce-scatter, "float32" or "bfloat16" (half the traffic).
    reshard_after_forward: free a block's gathered weights after its forward and gather them again for
        backward (less memory); False keeps them from forward to backward (one all-gather fewer per block).
    activation_checkpointing: recompute each block's activations in backward instead of keeping them
        (any strategy, sharded or not).
    meta_init: build the decoder on the meta device and let each rank initialise only its shards
        (lightning_modules/distributed/meta_init.py; any strategy).
    """

    sharding: Literal["full", "hybrid"] = "full"
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    reshard_after_forward: bool = True
    activation_checkpointing: bool = False
    meta_init: bool = False

    def __post_init__(self) -> None:
        if self.sharding not in SHARDINGS:
            raise ConfigError(f"parallel.sharding={self.sharding!r}: allowed values are {SHARDINGS}")
        if self.reduce_dtype not in REDUCE_DTYPES:
            raise ConfigError(
                f"parallel.reduce_dtype={self.reduce_dtype!r}: allowed values are {REDUCE_DTYPES}"
            )

    def sharding_settings_changed(self) -> list[str]:
        """Fields set away from their defaults that only a sharded (FSDP) run can use."""
        default = ParallelConfig()
        fields = ("sharding", "reduce_dtype", "reshard_after_forward")
        return [
            f"parallel.{f}={getattr(self, f)!r}" for f in fields if getattr(self, f) != getattr(default, f)
        ]


def data_parallel_mesh(mesh: DeviceMesh, sharding: str, num_nodes: int) -> DeviceMesh:
    """The mesh fully_shard gets, from Lightning's (data_parallel, tensor_parallel) mesh.

    "full": the 1-D data-parallel mesh, every rank one shard. "hybrid": a 2-D (replicate, shard) mesh of
    shape (num_nodes, ranks per node); global ranks are numbered node by node (Lightning, torchrun and
    srun's default block distribution all do), so row i of the mesh is node i.
    """
    if mesh["tensor_parallel"].size() != 1:
        raise ConfigError(
            f"tensor_parallel_size={mesh['tensor_parallel'].size()}: the decoder has no tensor-parallel plan; "
            "use lightning_modules.distributed.strategy.FSDP2Strategy (data-parallel size = world, tensor-parallel 1)"
        )
    flat = mesh["data_parallel"]
    if sharding == "full":
        return flat
    world = flat.size()
    if world % num_nodes:
        raise ConfigError(
            f"parallel.sharding='hybrid': world size {world} is not a multiple of {num_nodes} nodes"
        )
    return init_device_mesh(
        flat.device_type, (num_nodes, world // num_nodes), mesh_dim_names=("replicate", "shard")
    )


def param_dtype_for(precision: str) -> torch.dtype | None:
    """Dtype the blocks' weights are all-gathered and computed in: bf16 under "bf16-mixed", else the
    parameters' own dtype (None)."""
    return torch.bfloat16 if precision == "bf16-mixed" else None


def parallelize(
    model: Transformer,
    config: ParallelConfig,
    mesh: DeviceMesh | None,
    param_dtype: torch.dtype | None,
    compile: bool = False,
) -> None:
    """Apply activation checkpointing (if set), torch.compile per block (if `compile`; lightning_modules/distributed/compile.py) and,
    given a mesh, FSDP2, in place, in that order and at most once.

    Parameters stay where they are (same names, so checkpoints do not depend on the strategy); under FSDP
    they become DTensors sharded on dim 0 (Shard(0), or (Replicate(), Shard(0)) on a hybrid mesh).
    """
    if isinstance(model, FSDPModule) or getattr(model, "_activation_checkpointing", False):
        raise RuntimeError("parallelize: this Transformer is already parallelised")
    if config.activation_checkpointing:
        # torch's composable checkpoint keeps module and parameter names unchanged (a wrapper module
        # would prefix them), and composes with fully_shard applied afterwards.
        for block in model.blocks:
            checkpoint(block)
        model._activation_checkpointing = True  # type: ignore[assignment]
    if compile:
        compile_blocks(model.blocks)
    if mesh is None:
        return
    reduce_dtype = getattr(torch, config.reduce_dtype)
    compute = MixedPrecisionPolicy(
        param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=False
    )
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=config.reshard_after_forward, mp_policy=compute)
    # The embedding stays in its own dtype (fp32): its output is the residual stream (module docstring).
    fully_shard(
        model.embed,
        mesh=mesh,
        reshard_after_forward=config.reshard_after_forward,
        mp_policy=MixedPrecisionPolicy(reduce_dtype=reduce_dtype),
    )
    # Root: final norm and head. Its reshard_after_forward default (None) keeps them gathered until backward,
    # which starts with them.
    fully_shard(model, mesh=mesh, mp_policy=compute)
