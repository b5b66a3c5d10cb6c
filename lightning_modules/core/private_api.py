"""Every private (underscore) or version-sensitive torch and Lightning API the project uses, in one list.

pyproject.toml accepts a range of torch (the oldest a GPU machine may already have, up to the CPU pin in
Makefile) and of Lightning, not one release; a private API is free to move between releases, and a move
shows up only when the code that uses it runs. `missing()` resolves every entry on the installed torch and
Lightning without running anything, so tests/core/test_private_api.py names the API that moved, and the
version, at once; the same test scans the source so that a private API used but not listed here fails too.
Why each is needed is written where it is used (the entry's file); lightning_modules/core/lightning_api.py
wraps the Lightning and torch.distributed.checkpoint ones.

An entry is the dotted name as the source spells it: the longest importable module prefix, then
attributes. Kind "instance": the last part is an attribute the class sets on its instances (`self._x = ...`
in its own source or a base class's), so it is looked for there rather than on the class.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Api:
    used_in: str  # the file that uses it, and says why
    kind: Literal["attribute", "instance"] = "attribute"


_MUON = Api("lightning_modules/optim/muon.py")
_DCP = Api("lightning_modules/core/lightning_api.py")
_LOGGER = Api("lightning_modules/tracking/logger.py", "instance")

APIS: dict[str, Api] = {
    # torch: private modules and names.
    "torch.optim._muon._zeropower_via_newtonschulz": _MUON,
    "torch.optim._muon._adjust_lr": _MUON,
    "torch.optim._muon.DEFAULT_A": _MUON,
    "torch.optim._muon.DEFAULT_B": _MUON,
    "torch.optim._muon.DEFAULT_C": _MUON,
    "torch.distributed.tensor._utils.compute_local_shape_and_global_offset": _MUON,
    "torch.distributed.tensor._utils._compute_local_shape_and_global_offset": Api(
        "lightning_modules/optim/distributed.py"
    ),
    "torch._subclasses.fake_tensor.FakeTensorMode": Api("lightning_modules/costs/memory.py"),
    "torch.UntypedStorage._cdata": Api("lightning_modules/costs/memory.py"),
    "torch.distributed._composable.checkpoint": Api("lightning_modules/distributed/parallel.py"),
    "torch.ops.mkldnn._is_mkldnn_bf16_supported": Api("lightning_modules/core/precision.py"),
    "torch._fused_sdp_choice": Api("lightning_modules/model/attention/kernel.py"),
    "torch._dynamo.utils.get_compilation_metrics": Api("benchmarks/gpu.py"),
    "torch._dynamo.utils.clear_compilation_metrics": Api("benchmarks/gpu.py"),
    "torch.testing._internal.distributed.fake_pg.FakeStore": Api("benchmarks/memory_plan.py"),
    **{
        f"torch.ops.aten.{op}": Api("lightning_modules/costs/memory.py")
        for op in (
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_attention_math",
        )
    },
    **{
        f"torch.ops.aten.{op}": Api("lightning_modules/costs/step_time.py")
        for op in (
            "_scaled_dot_product_flash_attention_backward",
            "_scaled_dot_product_efficient_attention_backward",
            "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_cudnn_attention_backward",
        )
    },
    "torch._ops.OpOverload._overloadpacket": Api("lightning_modules/costs/step_time.py", "instance"),
    "torch.utils._python_dispatch.TorchDispatchMode": Api("lightning_modules/costs/step_time.py"),
    "torch.utils._pytree.tree_flatten": Api("lightning_modules/costs/step_time.py"),
    "torch.serialization._get_layout": _DCP,
    "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING": _DCP,
    "torch.distributed.checkpoint._traverse.set_element": _DCP,
    "torch.distributed.checkpoint.default_planner._EmptyStateDictLoadPlanner": _DCP,
    "torch.distributed.checkpoint.filesystem._StorageInfo": _DCP,
    "torch.distributed.checkpoint.state_dict_loader._load_state_dict": _DCP,
    # torch: public, but only in recent releases (FSDP2 left torch.distributed._composable in 2.6).
    "torch.distributed.fsdp.fully_shard": Api("lightning_modules/distributed/parallel.py"),
    "torch.distributed.fsdp.FSDPModule": Api("lightning_modules/distributed/parallel.py"),
    "torch.distributed.fsdp.MixedPrecisionPolicy": Api("lightning_modules/distributed/parallel.py"),
    "torch.distributed.tensor.DTensor": Api("lightning_modules/optim/distributed.py"),
    # Lightning: private names, methods the project calls or overrides, attributes of its instances.
    "lightning.fabric.utilities.load._METADATA_FILENAME": _DCP,
    "lightning.pytorch.callbacks.ModelCheckpoint._monitor_candidates": _DCP,
    "lightning.pytorch.callbacks.ModelCheckpoint._save_topk_checkpoint": _DCP,
    "lightning.pytorch.callbacks.ModelCheckpoint._save_last_checkpoint": _DCP,
    "lightning.pytorch.callbacks.ModelCheckpoint._last_global_step_saved": Api(
        "lightning_modules/core/lightning_api.py", "instance"
    ),
    "lightning.pytorch.loops.training_epoch_loop._TrainingEpochLoop._batches_that_stepped": Api(
        "lightning_modules/core/lightning_api.py", "instance"
    ),
    "lightning.pytorch.cli.LightningCLI._parse_ckpt_path": Api("lightning_modules/training/cli.py"),
    "lightning.pytorch.loggers.MLFlowLogger._scan_and_log_checkpoints": Api(
        "lightning_modules/tracking/logger.py"
    ),
    **{
        f"lightning.pytorch.loggers.MLFlowLogger.{name}": _LOGGER
        for name in (
            "_initialized",
            "_tracking_uri",
            "_run_id",
            "_mlflow_client",
            "_experiment_name",
            "_experiment_id",
            "_checkpoint_callback",
            "_artifact_location",
        )
    },
    "lightning.pytorch.strategies.ModelParallelStrategy": Api("lightning_modules/distributed/strategy.py"),
    "lightning.pytorch.strategies.ModelParallelStrategy._data_parallel_size": Api(
        "lightning_modules/distributed/strategy.py", "instance"
    ),
    "lightning.pytorch.strategies.ModelParallelStrategy._save_distributed_checkpoint": Api(
        "lightning_modules/distributed/strategy.py", "instance"
    ),
}


def _import_prefix(name: str) -> tuple[Any, list[str]]:
    """The longest importable module prefix of the dotted `name`, and the attribute names after it."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            return importlib.import_module(".".join(parts[:cut])), parts[cut:]
        except ImportError:
            continue
    raise ImportError(f"no module {parts[0]}")


def sets_attribute(cls: type, attribute: str) -> bool:
    """Whether `cls` or a base class in Python source assigns `self.<attribute>` (an instance attribute,
    absent from the class itself until __init__ runs)."""
    assigns = re.compile(rf"\bself\.{re.escape(attribute)}\s*(:[^=\n]+)?=(?!=)")
    return any(assigns.search(_source(klass)) for klass in cls.__mro__)


@functools.cache
def _source(cls: type) -> str:
    """The class's source; cached, since inspect parses the whole module to find a class."""
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # a C type or object: no Python source to read
        return ""


def resolve(name: str) -> None:
    """Raise LookupError when `name` (an APIS key) does not exist in the installed torch / Lightning."""
    api = APIS[name]
    try:
        target, attributes = _import_prefix(name)
        last = attributes.pop() if api.kind == "instance" else None
        for attribute in attributes:
            target = getattr(target, attribute)
    except (ImportError, AttributeError, RuntimeError) as exc:  # torch.ops raises RuntimeError for no op
        raise LookupError(f"{type(exc).__name__}: {exc}") from None
    if last is not None and not (hasattr(target, last) or sets_attribute(target, last)):
        raise LookupError(f"{target.__qualname__} no longer sets self.{last}")


def missing() -> list[str]:
    """Each listed API the installed torch / Lightning lacks: "name (used in file): why it failed"."""
    found = []
    for name, api in APIS.items():
        try:
            resolve(name)
        except LookupError as exc:
            found.append(f"{name} (used in {api.used_in}): {exc}")
    return found
