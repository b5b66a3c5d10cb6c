"""torch.compile per decoder block (lightning_modules/distributed/compile.py): compiled training follows eager training
over a few steps (fp32 on this CPU), with activation checkpointing, and the parameter names (so the
checkpoints) do not change. FSDP2 + compile + checkpointing + resume through main() is in
tests/distributed/test_fsdp_training.py."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from lightning_modules.distributed.parallel import ParallelConfig, parallelize
from lightning_modules.model.transformer import Transformer
from lightning_modules.optim.setup import OptimizerConfig, build_optimizer
from tests.helpers import attn, tiny_model

pytestmark = pytest.mark.slow  # inductor compiles C++ on first use: a minute or more on 2 cores


def train(net: Transformer, tokens: torch.Tensor, steps: int) -> list[float]:
    optimizer = build_optimizer(net, OptimizerConfig(name="muon", lr=0.02, embed_lr=0.2, head_lr=0.004))
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(net(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_compiled_blocks_train_like_eager_with_checkpointing() -> None:
    torch.manual_seed(0)
    eager = Transformer(tiny_model(), attn("lrkv"))
    compiled = copy.deepcopy(eager)
    config = ParallelConfig(activation_checkpointing=True)
    parallelize(eager, config, None, None)
    parallelize(compiled, config, None, None, compile=True)
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in compiled.blocks)
    assert list(compiled.state_dict()) == list(eager.state_dict())  # checkpoints are interchangeable
    tokens = torch.randint(0, 128, (4, 33), generator=torch.Generator().manual_seed(1))
    start = [p.detach().clone() for p in eager.parameters()]
    expected, got = train(eager, tokens, 4), train(compiled, tokens, 4)
    assert got[-1] < got[0]  # it trains
    # Inductor fuses and reorders fp32 sums (about 1e-7 relative per op); Muon's bf16 Newton-Schulz turns
    # that into ~1e-5 on the loss after a few steps (seen: 2e-5).
    assert got == pytest.approx(expected, abs=1e-4)
    # Muon's orthogonalised (sign-like) steps move small matrices by whole steps for small differences: the
    # compiled weights are within 5 % of how far eager training moved them.
    for p, q, p0 in zip(compiled.parameters(), eager.parameters(), start, strict=True):
        assert (p - q).norm() <= 0.05 * (q - p0).norm(), "compiled weights drifted from eager"
