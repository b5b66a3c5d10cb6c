"""Batched Newton-Schulz (one call per matrix shape, lightning_modules/optim/muon.py) takes the same step as
the per-matrix reference loop (`orthogonalise`, batched_newton_schulz=False): on real models' gradients,
on mixed shapes and dtypes, and however the stacks are chunked."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from lightning_modules.model.transformer import Transformer
from lightning_modules.optim.muon import MuonAdamW, orthogonalise, orthogonalise_batched
from lightning_modules.optim.setup import OptimizerConfig, build_optimizer
from tests.helpers import attn, tiny_model

NS = MuonAdamW([torch.nn.Parameter(torch.ones(2, 2))]).defaults["ns_coefficients"]
CPU = torch.device("cpu")


def _backward(model: Transformer, seed: int) -> None:
    tokens = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(seed))
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()


def _muon_matrices(opt: MuonAdamW) -> list[torch.Size]:
    return [s for g in opt.param_groups if g["use_muon"] for p in g["params"] for s in opt.block_shapes(p)]


# lrkv: (H, d_h, r) factors, one matrix per head; mha: a fused weight in equal row blocks; gqa: unequal ones
@pytest.mark.parametrize("kind", ["lrkv", "mha", "gqa"])
def test_batched_step_equals_reference_loop_on_a_model(kind: str) -> None:
    torch.manual_seed(0)
    model = Transformer(tiny_model(), attn(kind))
    ref = copy.deepcopy(model)
    config = OptimizerConfig(name="muon", lr=0.02, embed_lr=0.1, head_lr=0.004)
    opt, ref_opt = build_optimizer(model, config), build_optimizer(ref, config)
    ref_opt.batched_newton_schulz = False
    assert opt.batched_newton_schulz  # the default
    start = [p.detach().clone() for p in model.parameters()]
    for step in range(2):  # the second step also compares the momenta the first one left
        for net, o in ((model, opt), (ref, ref_opt)):
            _backward(net, step)
            o.step()
            o.zero_grad()
    for (name, p), q, p0 in zip(model.named_parameters(), ref.parameters(), start, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), msg=f"{kind} {name}")
        assert not torch.equal(p.detach(), p0) or name.endswith("norm.weight"), f"{name} did not move"
    shapes = _muon_matrices(opt)
    assert ref_opt.ns_calls == 2 * len(shapes)  # one call per logical matrix per step
    assert opt.ns_calls == 2 * len(set(shapes)) < ref_opt.ns_calls  # one per shape per step
    assert opt.ns_flops == ref_opt.ns_flops


def test_batched_equals_reference_on_mixed_shapes_and_dtypes() -> None:
    """3-D stacks, fused weights in equal and unequal row blocks, tall and wide matrices, bf16 and fp32
    updates sharing a shape: each result equals orthogonalise on that update alone."""
    g = torch.Generator().manual_seed(0)
    cases: list[tuple[tuple[int, ...], tuple[int, ...] | None, torch.dtype]] = [
        ((3, 8, 4), None, torch.float32),
        ((2, 8, 4), None, torch.bfloat16),  # same matrix shape as the one above, another dtype
        ((24, 4), (8, 8, 8), torch.float32),  # equal blocks: one run of three (8, 4)
        ((20, 6), (4, 8, 8), torch.float32),  # unequal blocks, from two stacks
        ((6, 20), None, torch.float32),
        ((20, 6), None, torch.float32),
    ]
    updates = [torch.randn(shape, generator=g).to(dtype) for shape, _, dtype in cases]
    specs = [(u.shape, rows, CPU) for u, (_, rows, _) in zip(updates, cases, strict=True)]
    out, calls = orthogonalise_batched(specs, iter(updates), NS, 5, 1e-7, 2**24)
    assert calls == 5  # (8, 4), (4, 6), (8, 6), (6, 20), (20, 6)
    for u, (_, rows, _), o in zip(updates, cases, out, strict=True):
        ref = orthogonalise(u.clone(), rows, NS, 5, 1e-7)
        assert o.shape == u.shape and o.dtype == ref.dtype == torch.bfloat16
        torch.testing.assert_close(o, ref)


def test_chunked_stacks_give_the_same_step() -> None:
    """ns_batch_elements splits a shape's stack into several calls; the values do not change."""
    torch.manual_seed(0)
    model = Transformer(tiny_model(), attn("lrkv"))
    small = copy.deepcopy(model)
    config = OptimizerConfig(name="muon", lr=0.02)
    opt, small_opt = build_optimizer(model, config), build_optimizer(small, config)
    small_opt.ns_batch_elements = 100  # fewer elements than most matrices: about one call per matrix
    for net, o in ((model, opt), (small, small_opt)):
        _backward(net, 0)
        o.step()
    for (name, p), q in zip(model.named_parameters(), small.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), msg=name)
    assert small_opt.ns_calls > opt.ns_calls
