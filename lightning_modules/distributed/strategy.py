"""FSDP2Strategy: Lightning's ModelParallelStrategy with data-parallel size = world and tensor-parallel size 1.

ModelParallelStrategy builds a (data_parallel, tensor_parallel) device mesh and calls the LightningModule's
`configure_model`, where LanguageModel applies fully_shard (lightning_modules/distributed/parallel.py). Its "auto" sizes
mean (nodes, devices per node), a 2-D data x tensor parallel layout; the decoder has no tensor-parallel
plan, so every rank is a data-parallel rank here, whatever the number of nodes and devices. A YAML file
cannot write "world size", hence this subclass (docs/architecture.md, "Scale"). Everything else, including the sharded
distributed checkpoint directories and their loading on resume, is Lightning's own.
"""

from __future__ import annotations

from datetime import timedelta

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy


class FSDP2Strategy(ModelParallelStrategy):
    """save_distributed_checkpoint: True writes one shard file per rank into a checkpoint directory (no
    rank ever holds the whole state); False gathers everything on rank 0 into one file."""

    def __init__(
        self,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )

    def setup_environment(self) -> None:
        # num_nodes and the devices of this node are known once the trainer has set the strategy up.
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()
