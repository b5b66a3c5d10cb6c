"""The Lightning internals behind lightning_modules/core/lightning_api.py still exist and behave as the project
assumes. A Lightning upgrade that moves or changes one fails here, naming it."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from lightning.fabric.utilities import load
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_modules.core import lightning_api


def parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def test_model_checkpoint_save_internals() -> None:
    assert parameters(ModelCheckpoint._monitor_candidates) == ["self", "trainer"]
    assert parameters(ModelCheckpoint._save_topk_checkpoint) == ["self", "trainer", "monitor_candidates"]
    assert parameters(ModelCheckpoint._save_last_checkpoint) == ["self", "trainer", "monitor_candidates"]
    callback = ModelCheckpoint()
    assert lightning_api.last_saved_step(callback) == 0  # an int that starts at 0 before any save


def test_sharded_checkpoint_internals(tmp_path: Path) -> None:
    """A directory written by torch.distributed.checkpoint plus Lightning's metadata file, as
    ModelParallelStrategy writes it, loads back whole through the loader, metadata included."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import default_planner, filesystem, state_dict_loader
    from torch.distributed.checkpoint._traverse import set_element

    # The torch internals the safe reader stands on (lightning_modules/core/lightning_api.py).
    assert "no_dist" in parameters(state_dict_loader._load_state_dict)
    assert "keys" in parameters(default_planner._EmptyStateDictLoadPlanner.__init__)
    assert parameters(set_element)[:3] == ["root_dict", "path", "value"]
    assert {"relative_path", "offset", "length"} <= set(filesystem._StorageInfo.__dataclass_fields__)
    assert load._METADATA_FILENAME == lightning_api.METADATA_FILENAME
    folder = tmp_path / "step.ckpt"
    weights = {"model": {"w": torch.arange(6.0).view(2, 3)}}
    dcp.save(weights, checkpoint_id=folder)
    torch.save({"mlflow_run_id": "abc", "global_step": 3}, folder / lightning_api.METADATA_FILENAME)
    loaded = lightning_api.load_sharded_checkpoint(folder)
    assert loaded["mlflow_run_id"] == "abc" and loaded["global_step"] == 3
    torch.testing.assert_close(loaded["model"]["w"], weights["model"]["w"])
