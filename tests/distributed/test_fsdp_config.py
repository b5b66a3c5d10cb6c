"""model.parallel and the strategy fragments, in one process: settings only FSDP can use fail without it,
bad values fail at parse time, activation checkpointing recomputes each block without changing a number."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lightning_modules.core.errors import ConfigError
from lightning_modules.distributed.parallel import ParallelConfig, parallelize, param_dtype_for
from lightning_modules.distributed.strategy import FSDP2Strategy
from lightning_modules.model.transformer import Transformer
from lightning_modules.training.language_model import LanguageModel
from main import main
from tests.helpers import attn, tiny_model

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


def test_bad_parallel_values_fail_at_parse_time(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["fit", "--config", str(CONF / "base.yaml"), "--config", str(CONF / "model/nano.yaml")]
    for key, value in (("sharding", "half"), ("reduce_dtype", "float16")):
        with pytest.raises(SystemExit) as exit_info:
            main([*base, f"--model.parallel.{key}", value])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "model.parallel" in err and f'{key}"' in err and f"Got value: {value}" in err


def test_sharding_settings_without_a_sharded_strategy_are_an_error() -> None:
    model = LanguageModel(tiny_model(), attn("mha"), parallel=ParallelConfig(sharding="hybrid"))
    with pytest.raises(ConfigError, match=r"parallel\.sharding='hybrid': only a sharded strategy uses this"):
        model.configure_model()
    with pytest.raises(ConfigError, match=r"parallel\.reduce_dtype='bfloat16'"):
        LanguageModel(tiny_model(), attn("mha"), parallel={"reduce_dtype": "bfloat16"}).configure_model()
    with pytest.raises(
        ConfigError, match=r"parallel\.sharding='rows': allowed values are \('full', 'hybrid'\)"
    ):
        ParallelConfig(sharding="rows")  # type: ignore[arg-type]


def test_strategy_fragments_name_real_classes() -> None:
    import yaml

    for name in ("fsdp", "hybrid-fsdp"):
        strategy = yaml.safe_load((CONF / "strategy" / f"{name}.yaml").read_text())["trainer"]["strategy"]
        assert strategy["class_path"] == "lightning_modules.distributed.strategy.FSDP2Strategy"
    assert FSDP2Strategy()._tensor_parallel_size == 1
    assert param_dtype_for("bf16-mixed") == torch.bfloat16 and param_dtype_for("32-true") is None


@pytest.mark.parametrize("kind", ["lrkv", "mla"])
def test_activation_checkpointing_recomputes_blocks_and_changes_nothing(kind: str) -> None:
    torch.manual_seed(0)
    ref = Transformer(tiny_model(), attn(kind))
    model = LanguageModel(tiny_model(), attn(kind), parallel=ParallelConfig(activation_checkpointing=True))
    model.model.load_state_dict(ref.state_dict())
    model.configure_model()
    model.configure_model()  # Lightning calls the hook in every stage: applied once
    assert list(dict(model.model.named_parameters())) == list(dict(ref.named_parameters()))  # same names
    calls = []
    model.model.blocks[0].attn.register_forward_hook(lambda *_: calls.append(1))
    tokens = torch.randint(0, 128, (2, 17))
    losses = []
    for net in (ref, model.model):
        logits = net(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        losses.append(loss)
    assert len(calls) == 2  # forward, then recomputed in backward
    assert torch.equal(losses[0], losses[1])
    for (name, p), q in zip(ref.named_parameters(), model.model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=name)
    with pytest.raises(RuntimeError, match="already parallelised"):
        parallelize(model.model, ParallelConfig(activation_checkpointing=True), None, None)
