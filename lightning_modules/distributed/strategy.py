"""FSDP2Strategy: Lightning's ModelParallelStrategy with data-parallel size = world and tensor-parallel size 1.

ModelParallelStrategy builds a (data_parallel, tensor_parallel) device mesh and calls the LightningModule's
`configure_model`, where LanguageModel applies fully_shard (lightning_modules/distributed/parallel.py). Its "auto" sizes
mean (nodes, devices per node), a 2-D data x tensor parallel layout; the decoder has no tensor-parallel
plan, so every rank is a data-parallel rank here, whatever the number of nodes and devices. A YAML file
cannot write "world size", hence this subclass (docs/architecture.md, "Scale"). The sharded checkpoint directories
are Lightning's layout, written under a temporary name and renamed when whole (`save_checkpoint`); loading one is
not Lightning's: Lightning reads it through torch.distributed.checkpoint, which
unpickles the folder's index and the optimiser's non-tensor values without weights_only, so a crafted folder
would run code. `load_checkpoint` reads a folder through the project's safe reader instead
(lightning_modules/core/lightning_api.py, `load_sharded_into`); a one-file checkpoint stays Lightning's, with
weights_only=True.
"""

from __future__ import annotations

import pickle
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy

from lightning_modules.core.errors import UserError
from lightning_modules.core.files import fsync_tree, partial_dir, replace_dir, stale_partials
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

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """A sharded checkpoint written whole under a temporary name beside its own, then given its name.

        Lightning writes the shards into the checkpoint's folder in place, so a kill mid-save (a preemption)
        leaves a folder of old and new shards under the final name. Here every rank writes into a fresh folder
        that rank 0 names, the ranks meet, rank 0 syncs the files and swaps the folder in
        (core/files.py, replace_dir), and the ranks meet again before training goes on. Temporary folders of
        earlier, killed saves of the same name are removed first. One-file saves keep Lightning's path
        (through the CLI's AtomicCheckpointIO)."""
        if not self._save_distributed_checkpoint or storage_options is not None or "://" in str(filepath):
            super().save_checkpoint(checkpoint, filepath, storage_options)
            return
        path = Path(self.broadcast(str(filepath)))
        written: str | None = None
        if self.global_rank == 0:
            for stale in stale_partials(path):
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink(missing_ok=True)
            written = str(partial_dir(path))
        written_path = Path(self.broadcast(written))
        super().save_checkpoint(checkpoint, written_path)
        self.barrier("sharded checkpoint written")
        if self.global_rank == 0:
            fsync_tree(written_path)
            replace_dir(written_path, path)
        self.barrier("sharded checkpoint renamed")

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
