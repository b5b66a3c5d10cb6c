"""Which host reads of device values a fit makes at each step, on a CPU-only machine.

On a GPU, reading a tensor that lives on the device (`.item()`, `bool()`, `.tolist()`, `.cpu()`...) or making a
device tensor from a Python value (`torch.tensor(x, device=...)`, a blocking copy) waits for every kernel
queued before it. On the CPU every tensor is a host tensor, so HostReads keeps the distinction by hand, as a
TorchFunctionMode over the whole fit: a tensor is on the host if it was made without a device (torch's
optimiser step counters, a Python value), by `.cpu()`, or only from host tensors; everything else
(parameters, gradients, the batch once StepMarker has seen it, what autograd makes) is on the device. A read
of a device tensor, or a tensor made from a Python value with a device given, is a host sync, recorded under
the log step (lightning_api.log_step) current when it was made, between the fit's training start and end."""

from __future__ import annotations

import traceback
from collections import defaultdict
from typing import Any

import lightning as L
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from lightning_modules.core import lightning_api

READS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy", "__array__", "cpu"}
FROM_PYTHON = {"tensor", "as_tensor"}
ACTIVE: list[HostReads] = []


def _name(func: Any) -> str:
    return getattr(func, "__name__", str(func))


class HostReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.host: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.trainer: L.Trainer | None = None  # while it trains (StepMarker)
        self.syncs: dict[int, list[str]] = defaultdict(list)

    def __enter__(self) -> HostReads:
        ACTIVE.append(self)
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        ACTIVE.remove(self)
        super().__exit__(*exc)

    def on_device(self, value: Any) -> None:
        for t in tree_leaves(value):
            if isinstance(t, torch.Tensor):
                self.host.pop(t, None)

    def _is_host(self, t: torch.Tensor) -> bool:
        return t in self.host

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = _name(func)
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if name in READS and inputs and not self._is_host(inputs[0]):
            self._record(f"{name} of a device tensor {tuple(inputs[0].shape)}")
        elif name in FROM_PYTHON and kwargs.get("device") is not None:
            self._record(f"torch.{name}(..., device=...) from host values")
        out = func(*args, **kwargs)
        host = name in READS or (
            all(self._is_host(t) for t in inputs) if inputs else kwargs.get("device") is None
        )
        if host:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.host[t] = True
        return out

    def _record(self, what: str) -> None:
        if self.trainer is None:
            return
        frames = [f for f in traceback.extract_stack()[:-3] if "host_reads.py" not in f.filename]
        where = " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in reversed(frames[-6:]))
        # Lightning's log step moves on once a step is logged: an LR logged at a step's start is that step's.
        self.syncs[lightning_api.log_step(self.trainer)].append(f"{what} at {where}")


class StepMarker(L.Callback):
    """Tells the active HostReads when training runs, under which log step, and that each batch is on the
    device."""

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if ACTIVE:
            ACTIVE[-1].trainer = trainer

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if ACTIVE:
            ACTIVE[-1].on_device(batch)

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if ACTIVE:
            ACTIVE[-1].trainer = None
