"""The FSDP2 strategy resumes from a sharded folder through the safe reader (lightning_modules/distributed/strategy.py,
lightning_modules/core/lightning_api.py): the same weights and optimiser state as Lightning's own loader, and a
crafted non-tensor value in a shard, whose payload Lightning's loader runs, refused without running it."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lightning_modules.core.errors import UserError
from lightning_modules.distributed import strategy as strategy_module
from lightning_modules.distributed.strategy import FSDP2Strategy
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_safe_resume_restores_what_lightning_restores_and_refuses_a_crafted_value(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tests.distributed.safe_resume_driver", str(tmp_path), str(free_port())],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["safe"] == result["lightning"] == result["saved"]
    assert result["metas"][0] == result["metas"][1] == {"global_step": 2}
    assert "holds posix.system, not only tensors" in result["refused"] and not result["payload_ran"]
    assert result["payload_ran_through_lightning"]  # the folder's payload is real


def test_the_strategy_reads_a_folder_through_the_safe_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(
        strategy_module, "load_sharded_into", lambda *a, **k: calls.append((*a, k)) or {"x": 1}
    )
    strategy = FSDP2Strategy()
    monkeypatch.setattr(FSDP2Strategy, "broadcast", lambda self, obj, src=0: obj)
    monkeypatch.setattr(FSDP2Strategy, "model", property(lambda self: "model"))
    monkeypatch.setattr(
        FSDP2Strategy, "lightning_module", property(lambda self: type("M", (), {"strict_loading": True})())
    )
    assert strategy.load_checkpoint(tmp_path) == {"x": 1}
    assert calls == [(tmp_path, "model", [], {"strict": True})]

    def crafted(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise pickle.UnpicklingError("the value optimizer_0.param_groups.0.lr holds posix.system")

    monkeypatch.setattr(strategy_module, "load_sharded_into", crafted)
    with pytest.raises(
        UserError, match=r"--ckpt_path .*: the value optimizer_0.* holds posix.system, .*not loaded"
    ):
        strategy.load_checkpoint(tmp_path)
