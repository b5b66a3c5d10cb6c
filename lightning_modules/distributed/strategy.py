"""FSDP2Strategy: Lightning's ModelParallelStrategy with data-parallel size = world and tensor-parallel size 1.

ModelParallelStrategy builds a (data_parallel, tensor_parallel) device mesh and calls the LightningModule's
`configure_model`, where LanguageModel applies fully_shard (lightning_modules/distributed/parallel.py). Its "auto" sizes
mean (nodes, devices per node), a 2-D data x tensor parallel layout; the decoder has no tensor-parallel
plan, so every rank is a data-parallel rank here, whatever the number of nodes and devices. A YAML file
cannot write "world size", hence this subclass (docs/architecture.md, "Scale"). The sharded checkpoint directories
are Lightning's own; loading one is not: Lightning reads it through torch.distributed.checkpoint, which
unpickles the folder's index and the optimiser's non-tensor values without weights_only, so a crafted folder
would run code. `load_checkpoint` reads a folder through the project's safe reader instead
(lightning_modules/core/lightning_api.py, `load_sharded_into`); a one-file checkpoint stays Lightning's, with
weights_only=True.
"""

from __future__ import annotations

import pickle
from datetime import timedelta
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy

from lightning_modules.core.errors import UserError
from lightning_modules.core.lightning_api import load_sharded_into


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

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(self.broadcast(checkpoint_path))  # as Lightning: every rank reads rank 0's path
        if not path.is_dir():
            return super().load_checkpoint(path, weights_only=True)
        assert self.model is not None and self.lightning_module is not None
        try:
            return load_sharded_into(
                path, self.model, list(self.optimizers), strict=self.lightning_module.strict_loading
            )
        except pickle.UnpicklingError as exc:  # a crafted folder: one line, as the CLI's check says it
            raise UserError(
                f"--ckpt_path {path}: {exc}, so it was not written by this project's fit; not loaded "
                "(unpickling an untrusted file can run code)"
            ) from exc
        except FileNotFoundError as exc:  # reached when Lightning resolved the path itself (`last`)
            raise UserError(
                f"--ckpt_path {path}: {exc}; copy the whole folder again, or use an earlier checkpoint"
            ) from exc
