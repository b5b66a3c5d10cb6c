"""ShardDataModule: streams the shards of lightning_modules.commands.prepare evenly over ranks and workers, and resumes exactly.

Batches are LongTensor (batch_size, seq_len + 1): input = batch[:, :-1], target = batch[:, 1:].
The sample layout, the split of the work and the resume rule are described in data/manifest.py and
data/plan.py; the saved position and its checks are data/train_position.py. In short: every rank gets the
same number of train batches per epoch, shuffled from (seed, epoch); validation and test read each sample
exactly once across ranks and workers, with the same number of batches on every rank; state_dict() holds
(epoch, batches delivered in it), which Lightning stores in checkpoints, and a fresh DataModule that loads
it continues with exactly the next batches.

Elastic resume. The train plan is made for `data_slices` slices of the data (default: the world size), each
giving `global_batch_size / data_slices` samples to every global batch; a rank reads data_slices / world of
them and joins their batches. Global batch k is therefore the same samples whatever the world size, and
the position is kept in global samples. A checkpoint resumes on any world size that divides data_slices,
with the same global batch (data.global_batch_size, so that each rank's batch is global / world): no
sample is lost or repeated and the run continues as an uninterrupted one would.
"""

from __future__ import annotations

import hashlib
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from torch.utils.data import DataLoader

from data import worker_tempdir
from data.data_errors import DataError, ManifestError, ShardError
from data.manifest import SPLITS, Manifest
from data.plan import eval_shards_read, train_batches_per_rank, train_shards_read
from data.streaming import EvalStream, ShardSet, TrainStream
from data.train_position import StreamSettings, TrainPosition
from data.verification import ShardProblem, verify_sizes
from data.verification import verify as verify_shards
from lightning_modules.core.errors import ConfigError

log = logging.getLogger(__name__)

STAGE_SPLITS = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ()}


class ShardDataModule(L.LightningDataModule):
    """WebDataset shards written by `python -m lightning_modules prepare` (the folder holding manifest.json).

    Args:
        data_dir: folder with manifest.json, tokenizer and shards.
        batch_size: training samples per batch on each rank (ignored when global_batch_size is set).
        global_batch_size: training samples per optimiser step over all ranks; each rank's batch is then
            global_batch_size / world size. Set it to resume on another number of ranks with the same
            global batch (elastic resume, module docstring).
        data_slices: how many slices the train plan cuts the data into (default: the world size at the
            start, then whatever the checkpoint says). Resuming needs a world size that divides it: set it
            to the largest number of ranks a run may resume on (e.g. 8 for 1, 2, 4 or 8 ranks).
        num_workers: DataLoader worker processes per rank (0: read in the main process).
        seed: shard order and shuffle buffer derive from (seed, epoch).
        shuffle_buffer: samples held by each worker's shuffle buffer (1: no sample shuffling).
        seq_len: expected sequence length; an error if the shards were built with another one.
        val_batch_size: validation/test batch size (default: batch_size).
        verify: the check at set-up. "sizes" (default): the shards this rank will read are present and of
            the size their sample count makes, one stat each, no byte read; the train shards again at each
            epoch's start. "full" (every shard of the split: sha256, counts, every sample's shape and ids) and
            "quick" (sha256 and counts) read every byte of the split on every rank; "off": none. Reading
            always checks each shard as it is opened and streamed (data/streaming.py ShardSet).
        skip_bad_shards: leave out shards that fail verification (logged with their names) instead of
            stopping. Off by default: bad data should stop a run, not thin it silently. With "sizes" every
            rank then checks every shard of the split, so that all ranks leave out the same ones.
    """

    def __init__(
        self,
        data_dir: str,
        batch_size: int = 32,
        num_workers: int = 2,
        seed: int = 0,
        shuffle_buffer: int = 1024,
        seq_len: int | None = None,
        val_batch_size: int | None = None,
        verify: Literal["sizes", "full", "quick", "off"] = "sizes",
        skip_bad_shards: bool = False,
        global_batch_size: int | None = None,
        data_slices: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        _check_options(
            batch_size=batch_size,
            val_batch_size=val_batch_size,
            global_batch_size=global_batch_size,
            data_slices=data_slices,
            num_workers=num_workers,
            shuffle_buffer=shuffle_buffer,
            verify=verify,
        )
        self.data_dir = str(data_dir)
        self.manifest = Manifest.load(data_dir)
        if seq_len is not None and seq_len != self.manifest.seq_len:
            raise ManifestError(
                f"seq_len {seq_len} differs from the shards' {self.manifest.seq_len} "
                f"({Path(data_dir) / 'manifest.json'}); rebuild with --seq-len {seq_len} or set seq_len to "
                f"{self.manifest.seq_len}"
            )
        self._batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.global_batch_size, self.data_slices = global_batch_size, data_slices
        self.shuffle_buffer = shuffle_buffer
        self.val_batch_size = val_batch_size or batch_size
        self.verify_mode, self.skip_bad_shards = verify, skip_bad_shards
        self._shards: dict[str, ShardSet] = {}
        self._sizes_checked: set[int] = set()  # train epochs whose shards (this rank's) were checked
        self._rank_override: tuple[int, int] | None = None
        # Train position: epoch and batches of it delivered to the training loop on this rank.
        self._position = TrainPosition()

    # ---- what the model and the CLI read -------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.manifest.vocab_size

    @property
    def seq_len(self) -> int:
        return self.manifest.seq_len

    @property
    def eot_id(self) -> int:
        return self.manifest.eot_id

    @property
    def tokenizer_path(self) -> str:
        return str(Path(self.data_dir) / self.manifest.tokenizer)

    def tokens(self, split: str) -> int:
        """Target tokens in the split (samples x seq_len): what one full pass trains or evaluates on."""
        return self.manifest.split(split).tokens

    def text_bytes(self, split: str) -> int:
        """UTF-8 bytes of the split's text: bits/byte = mean loss / ln 2 * tokens(split) / text_bytes(split)."""
        return self.manifest.split(split).text_bytes

    def samples(self, split: str) -> int:
        return self.manifest.split(split).samples

    @property
    def batch_size(self) -> int:
        """Training samples per batch on this rank."""
        if self.global_batch_size is None:
            return self._batch_size
        if self.global_batch_size % self.world_size:
            raise DataError(
                f"data.global_batch_size={self.global_batch_size} is not a multiple of the world size "
                f"{self.world_size}: choose a global batch that every rank can take an equal share of"
            )
        return self.global_batch_size // self.world_size

    @property
    def slices(self) -> int:
        """Slices of the train plan (module docstring: elastic resume)."""
        return self.data_slices or self._position.slices_from_checkpoint or self.world_size

    @property
    def slice_batch_size(self) -> int:
        """Samples each slice gives to a global batch."""
        slices, world = self.slices, self.world_size
        if slices % world or (self.batch_size * world) % slices:
            raise DataError(
                f"{world} ranks cannot share {slices} data slices of a {self.batch_size * world}-sample global "
                f"batch: resume on a world size that divides data.data_slices={slices}, with "
                "data.global_batch_size set to the checkpoint's global batch"
            )
        return self.batch_size * world // slices

    # ---- ranks ---------------------------------------------------------------------------------------
    def set_rank(self, rank: int, world_size: int) -> None:
        """Pretend to be `rank` of `world_size` (tests, custom launchers); otherwise the trainer decides."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        self._rank_override = (rank, world_size)

    @property
    def rank(self) -> int:
        return self._distributed()[0]

    @property
    def world_size(self) -> int:
        return self._distributed()[1]

    def _distributed(self) -> tuple[int, int]:
        if self._rank_override is not None:
            return self._rank_override
        if self.trainer is not None:
            return self.trainer.global_rank, self.trainer.world_size
        return 0, 1

    # ---- Lightning hooks -----------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        # Verify now, before the first step, what this stage will read.
        for split in STAGE_SPLITS.get(stage, ()):
            if split != "train" and self.samples(split) == 0:
                continue
            self.shard_set(split)

    def train_dataloader(self) -> _TrainLoader:
        self.shard_set("train")
        return _TrainLoader(self)

    def val_dataloader(self) -> _EvalLoader | list:
        # An empty split (--val-frac 0) means no validation, which Lightning spells as an empty list.
        return _EvalLoader(self, "val") if self.samples("val") else []

    def test_dataloader(self) -> _EvalLoader | list:
        return _EvalLoader(self, "test") if self.samples("test") else []

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Lightning calls this once per batch it hands to training_step, after its own prefetching, so
        # the count (saved in checkpoints) is of batches trained on, not of batches fetched from workers.
        if self.trainer is not None and self.trainer.training:
            self._position.consumed += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        if self._position.restored is not None:  # loaded but not yet iterated: hand the same position on
            return dict(self._position.restored)
        return self._position.state(self._settings(), self._train_fingerprint())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._position.load(state_dict)

    # ---- shards --------------------------------------------------------------------------------------
    def shard_set(self, split: str) -> ShardSet:
        """The split's readable shards, verified once (stops on a bad shard unless skip_bad_shards)."""
        if split not in self._shards:
            self._shards[split] = self._verified(split)
        return self._shards[split]

    def _verified(self, split: str) -> ShardSet:
        info = self.manifest.split(split)
        problems = self._set_up_problems(split)
        bad = {p.path: p.message for p in problems}
        if bad:
            if not self.skip_bad_shards:
                raise ShardError(self._problems_line(split, problems))
            lines = "\n".join(f"  {Path(self.data_dir) / path}: {message}" for path, message in bad.items())
            log.warning(
                "skip_bad_shards: leaving out %d of %d %s shards:\n%s",
                len(bad),
                len(info.shards),
                split,
                lines,
            )
        good = [shard for shard in info.shards if shard.path not in bad]
        if not good:
            raise ShardError(f"no usable {split} shards in {self.data_dir}")
        m = self.manifest
        paths, counts = tuple(s.path for s in good), tuple(s.samples for s in good)
        digests = tuple(s.sha256 for s in good)
        return ShardSet(self.data_dir, paths, counts, m.seq_len, m.vocab_size, m.dtype, digests)

    def _set_up_problems(self, split: str) -> list[ShardProblem]:
        """What the `verify` level finds wrong with the split's shards before they are read."""
        if self.verify_mode == "off":
            return []
        if self.verify_mode in ("full", "quick"):
            return verify_shards(self.data_dir, self.manifest, [split], full=self.verify_mode == "full")
        shards = self.manifest.split(split).shards
        if not self.skip_bad_shards:
            # a rank reads only its own shards, so it stats only those; with skip_bad_shards every rank
            # must leave out the same shards (the plan is computed from them), so each checks them all
            counts = [s.samples for s in shards]
            shards = [shards[i] for i in self._rank_shards(split, counts, self._position.epoch)]
            if split == "train":
                self._sizes_checked.add(self._position.epoch)
        return verify_sizes(self.data_dir, self.manifest, split, shards)

    def _rank_shards(self, split: str, counts: list[int], epoch: int) -> list[int]:
        """The shards (indices into counts) this rank reads of `split` (of train: in `epoch`)."""
        rank, world = self._distributed()
        if split != "train":
            return eval_shards_read(counts, rank=rank, world=world)
        per_rank = self.slices // world
        return train_shards_read(
            counts,
            seed=self.seed,
            epoch=epoch,
            slices=range(rank * per_rank, (rank + 1) * per_rank),
            world=self.slices,
            batch_size=self.slice_batch_size,
        )

    def _check_epoch_shards(self, epoch: int) -> None:
        """At an epoch's start, "sizes" again for the train shards this rank reads in it (they change with the
        epoch's shard order): one stat each, so a shard deleted or cut during the run is named before a worker
        meets it."""
        if self.verify_mode == "off" or epoch in self._sizes_checked:
            return
        self._sizes_checked.add(epoch)
        shards = self.shard_set("train")
        by_path = {s.path: s for s in self.manifest.split("train").shards}
        mine = [by_path[shards.paths[i]] for i in self._rank_shards("train", list(shards.counts), epoch)]
        if problems := verify_sizes(self.data_dir, self.manifest, "train", mine):
            raise ShardError(self._problems_line("train", problems))

    def _problems_line(self, split: str, problems: list[ShardProblem]) -> str:
        """One line: the first bad shard and what is wrong with it, and how many more there are."""
        first = problems[0]
        more = f"; {len(problems) - 1} more bad {split} shard(s)" if len(problems) > 1 else ""
        return (
            f"{Path(self.data_dir) / first.path}: {first.message}{more} (check every shard with "
            f"`python -m lightning_modules verify {self.data_dir}`)"
        )

    # ---- train position ------------------------------------------------------------------------------
    @property
    def _streams(self) -> int:
        return max(1, self.num_workers)

    @property
    def batches_per_epoch(self) -> int:
        """Train batches per epoch on every rank."""
        shards = self.shard_set("train")
        world = self.world_size
        count = train_batches_per_rank(shards.samples, self.slices, self.slice_batch_size)
        if count == 0:
            raise DataError(
                f"{shards.samples} train samples give no batch of {self.batch_size} on each of {world} ranks"
            )
        return count

    def _begin_epoch(self) -> tuple[int, int]:
        """(epoch, batches already consumed) for the train iteration that is starting."""
        batches = self.batches_per_epoch
        if self.trainer is not None:  # an epoch ends early under Trainer(limit_train_batches=...)
            batches = min(batches, self.trainer.num_training_batches)
        return self._position.begin_epoch(batches, self._settings(), self._train_fingerprint)

    def _settings(self) -> StreamSettings:
        return StreamSettings(
            seed=self.seed,
            batch_size=self.batch_size,
            world_size=self.world_size,
            slices=self.slices,
            slice_batch_size=self.slice_batch_size,
            streams=self._streams,
        )

    def _train_fingerprint(self) -> str:
        """Identifies the train shards read (content and order), so a resume on other data is caught."""
        used = set(self.shard_set("train").paths)
        digests = [s.sha256 for s in self.manifest.split("train").shards if s.path in used]
        return hashlib.sha256(" ".join(digests).encode()).hexdigest()[:16]

    def _loader(self, dataset: torch.utils.data.IterableDataset) -> DataLoader:
        worker_tempdir.check(self.num_workers)
        return DataLoader(
            dataset,
            batch_size=None,  # the datasets yield whole batches
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
            in_order=True,  # batch order is part of the plan
            worker_init_fn=_leave_signals_to_the_trainer if self.num_workers else None,
        )


def _leave_signals_to_the_trainer(worker_id: int) -> None:
    """A loader worker ignores SIGTERM, SIGINT and SIGUSR1: a scheduler signals the whole process group, and
    the training process decides when to stop (it saves the step first, lightning_modules/training/signals.py);
    torch ends its workers when that process goes."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)


def _check_options(*, num_workers: int, verify: str, **counts: int | None) -> None:
    """A ConfigError naming the first bad option as main.py spells it (data.<name>): the CLI reports it in
    one line (lightning_modules/core/errors.py), and it is still a ValueError for library callers."""
    for name, value in counts.items():
        if value is not None and value < 1:
            raise ConfigError(f"data.{name}={value}: must be at least 1")
    if num_workers < 0:
        raise ConfigError(
            f"data.num_workers={num_workers}: must be 0 (read in the training process) or a number of "
            "loader processes per rank"
        )
    if verify not in ("sizes", "full", "quick", "off"):
        raise ConfigError(f"data.verify={verify!r}: choose 'sizes', 'full', 'quick' or 'off'")


class _TrainLoader:
    """One pass = one epoch. Lazy: Lightning calls iter() once just to check, which must not start an epoch."""

    def __init__(self, datamodule: ShardDataModule) -> None:
        self.dm = datamodule

    # Lightning also saves and restores a train loader's own state when it has one; forwarding to the
    # DataModule keeps a single position and tells Lightning that mid-epoch checkpoints resume exactly.
    def state_dict(self) -> dict[str, Any]:
        return self.dm.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.dm.load_state_dict(state_dict)

    def __len__(self) -> int:
        # Whole epoch even when resuming mid-epoch: Lightning restores its own batch counter and stops the
        # epoch at this length, which is when our stream ends as well.
        return self.dm.batches_per_epoch

    def __iter__(self) -> Iterator[torch.Tensor]:
        dm = self.dm
        epoch, consumed = dm._begin_epoch()
        if consumed >= dm.batches_per_epoch:
            return
        dm._check_epoch_shards(epoch)
        rank, world = dm._distributed()
        per_rank = dm.slices // world
        dataset = TrainStream(
            dm.shard_set("train"),
            seed=dm.seed,
            epoch=epoch,
            rank=rank,
            world=dm.slices,
            streams=dm._streams,
            batch_size=dm.slice_batch_size,
            buffer=dm.shuffle_buffer,
            consumed=consumed,
            slices=range(rank * per_rank, (rank + 1) * per_rank),
        )
        for index, batch in enumerate(dm._loader(dataset), start=consumed):
            if dm.trainer is None:  # no trainer, no hook: whoever iterates is the consumer
                dm._position.consumed = index + 1
            yield batch


class _EvalLoader:
    def __init__(self, datamodule: ShardDataModule, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(split)
        self.dm, self.split = datamodule, split

    def _dataset(self) -> EvalStream:
        rank, world = self.dm._distributed()
        return EvalStream(
            self.dm.shard_set(self.split), rank=rank, world=world, batch_size=self.dm.val_batch_size
        )

    def __len__(self) -> int:
        return len(self._dataset())

    def __iter__(self) -> Iterator[torch.Tensor]:
        yield from self.dm._loader(self._dataset())
