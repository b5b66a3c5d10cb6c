"""One gloo process for tests/distributed/test_safe_resume.py: a fully_shard model and its optimiser saved as
ModelParallelStrategy saves them, loaded back by Lightning's own loader and by the project's safe one
(lightning_modules/core/lightning_api.py, `load_sharded_into`), which must restore the same weights and the same
optimiser state; then the safe loader given a folder with a crafted param-group value, which must refuse it.

Run as `python -m tests.distributed.safe_resume_driver OUT PORT`; writes OUT/result.json.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.strategies.model_parallel import _load_checkpoint, _save_checkpoint
from torch import nn
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard

from lightning_modules.core.lightning_api import load_sharded_into
from tests.checkpoint.crafted import crafted_value
from tests.gloo_exit import leave


def build(seed: int) -> tuple[nn.Module, list[torch.optim.Optimizer]]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    for layer in (model[0], model[2], model):
        fully_shard(layer)
    return model, [torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.9))]


def plain(value: Any) -> Any:
    """Tensors (DTensors too) as lists, so two states compare with ==."""
    if isinstance(value, torch.Tensor):
        local = value.full_tensor() if hasattr(value, "full_tensor") else value
        return local.detach().cpu().tolist()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def state(model: nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    return plain({"model": dict(model.state_dict()), "optimizer": get_optimizer_state_dict(model, optimizer)})


def main(out: Path, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=0, world_size=1)
    model, (optimizer,) = build(0)
    for _ in range(2):
        model(torch.randn(5, 4)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    folder = out / "step.ckpt"
    _save_checkpoint(
        folder,
        {"state_dict": model, "optimizer_0": optimizer, "global_step": 2},
        full_state_dict=False,
        rank=0,
    )
    theirs, (their_optimizer,) = build(1)
    their_meta = _load_checkpoint(
        folder, {"state_dict": theirs, "optimizer_0": their_optimizer}, optimizer_states_from_list=True
    )
    ours, (our_optimizer,) = build(2)
    our_meta = load_sharded_into(folder, ours, [our_optimizer], strict=True)
    marker = out / "payload-ran"
    evil = crafted_value(folder, out / "evil.ckpt", marker)
    refused = ""
    try:
        load_sharded_into(evil, *build(3), strict=True)
    except pickle.UnpicklingError as exc:
        refused = str(exc).splitlines()[0]
    safe_ran = marker.exists()
    other, (other_optimizer,) = build(4)
    # The same folder through Lightning's loader runs the payload: the crafted value is a real attack.
    _load_checkpoint(
        evil, {"state_dict": other, "optimizer_0": other_optimizer}, optimizer_states_from_list=True
    )
    result = {
        "saved": state(model, optimizer),
        "lightning": state(theirs, their_optimizer),
        "safe": state(ours, our_optimizer),
        "metas": [their_meta, our_meta],
        "refused": refused,
        "payload_ran": safe_ran,
        "payload_ran_through_lightning": marker.exists(),
    }
    (out / "result.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
    leave()
