"""Where the train stream stands on one rank, as checkpoints save it and a resume reads it back.

The position is (epoch, batches of it consumed by the training loop). state() also records it in
world-independent units (`global_samples`: samples of this epoch trained on by all ranks) and what the stream
depends on (seed, data slices, global batch, streams, a fingerprint of the train shards), so that a resume on
other data settings is refused instead of silently reading other samples (data/datamodule.py: elastic resume).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from data.data_errors import DataError

REQUIRED_STATE = ("epoch", "batches_consumed", "seed", "batch_size", "world_size", "streams")


@dataclass(frozen=True)
class StreamSettings:
    """What this rank's train stream is made of; a resume must find the same (but for the world size)."""

    seed: int
    batch_size: int  # this rank's
    world_size: int
    slices: int
    slice_batch_size: int
    streams: int

    @property
    def global_batch_size(self) -> int:
        return self.slices * self.slice_batch_size


class TrainPosition:
    """Epoch and batches consumed on this rank, and a loaded checkpoint state not yet resumed from."""

    def __init__(self) -> None:
        self.epoch, self.consumed, self.started = 0, 0, False
        self.restored: dict[str, Any] | None = None
        self.slices_from_checkpoint: int | None = None

    def state(self, settings: StreamSettings, train_data: str) -> dict[str, Any]:
        """The checkpoint state at this position (with train_data, the train shards' fingerprint)."""
        return {
            "epoch": self.epoch,
            "batches_consumed": self.consumed,
            # the same position in world-independent units: samples of this epoch trained on by all ranks
            "global_samples": self.consumed * settings.global_batch_size,
            "seed": settings.seed,
            "batch_size": settings.batch_size,
            "world_size": settings.world_size,
            "slices": settings.slices,
            "slice_batch_size": settings.slice_batch_size,
            "streams": settings.streams,
            "train_data": train_data,
        }

    def load(self, state_dict: dict[str, Any]) -> None:
        missing = set(REQUIRED_STATE) - set(state_dict)
        if missing:
            raise DataError(f"the checkpoint's data state lacks {sorted(missing)}")
        self.restored = dict(state_dict)
        # checkpoints from before elastic resume: one slice per rank
        self.slices_from_checkpoint = int(state_dict.get("slices", state_dict["world_size"]))

    def begin_epoch(
        self, batches: int, settings: StreamSettings, train_data: Callable[[], str]
    ) -> tuple[int, int]:
        """(epoch, batches already consumed) for the train iteration that is starting, `batches` long."""
        if self.restored is not None:
            state, self.restored = self.restored, None
            check_resumable(state, settings, train_data)
            epoch = int(state["epoch"])
            if "global_samples" in state:  # the position in samples; a global batch is the same at any world
                consumed = int(state["global_samples"]) // settings.global_batch_size
            else:
                consumed = int(state["batches_consumed"])
            if consumed >= batches:  # checkpoint taken at the end of an epoch
                epoch, consumed = epoch + 1, 0
        elif self.started:
            epoch, consumed = self.epoch + 1, 0
        else:
            epoch, consumed = self.epoch, 0
        self.epoch, self.consumed, self.started = epoch, consumed, True
        return epoch, consumed


def check_resumable(state: dict[str, Any], settings: StreamSettings, train_data: Callable[[], str]) -> None:
    """A DataError unless `state` was saved with the stream settings of now (any world size that divides
    its data slices, with the same global batch)."""
    state = {
        **state,
        "slices": state.get("slices", state["world_size"]),
        "global_batch_size": state.get("slice_batch_size", state["batch_size"])
        * state.get("slices", state["world_size"]),
    }
    now = {
        "seed": settings.seed,
        "slices": settings.slices,
        "global_batch_size": settings.global_batch_size,
        "streams": settings.streams,
    }
    if "train_data" in state:
        now["train_data"] = train_data()
    differ = [f"{k}: checkpoint {state[k]!r}, now {v!r}" for k, v in now.items() if state[k] != v]
    if differ:
        raise DataError(
            "cannot continue the data stream exactly: the checkpoint was taken with other data settings ("
            + "; ".join(differ)
            + "); num_workers decides the streams (max(1, num_workers)); another world size needs the same "
            "data.global_batch_size and a data.data_slices it divides"
        )
