"""MuonAdamW runs torch.optim.Muon's and torch.optim.AdamW's updates, on logical matrices."""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_modules.model.transformer import Transformer
from lightning_modules.optim.muon import MuonAdamW
from lightning_modules.optim.setup import OptimizerConfig, build_optimizer
from tests.helpers import attn, tiny_model


def _grads(params: list[torch.Tensor], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def _pair(shape: tuple[int, ...]) -> tuple[torch.nn.Parameter, torch.nn.Parameter]:
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(shape))
    return a, torch.nn.Parameter(a.detach().clone())


@pytest.mark.parametrize("shape", [(16, 8), (8, 24)])
def test_muon_group_equals_torch_muon(shape: tuple[int, int]) -> None:
    ours, ref = _pair(shape)
    opt = MuonAdamW([{"params": [ours], "use_muon": True}], lr=0.02, weight_decay=0.1)
    ref_opt = torch.optim.Muon([ref], lr=0.02, weight_decay=0.1)
    for step in range(3):
        _grads([ours], step)
        _grads([ref], step)
        opt.step()
        ref_opt.step()
    assert torch.equal(ours, ref)
    assert not torch.equal(ours, _pair(shape)[0])  # it moved


def test_adamw_group_equals_torch_adamw() -> None:
    ours, ref = _pair((10,))
    opt = MuonAdamW([{"params": [ours], "use_muon": False}], lr=0.004, weight_decay=0.1, betas=(0.9, 0.95))
    ref_opt = torch.optim.AdamW([ref], lr=0.004, weight_decay=0.1, betas=(0.9, 0.95), fused=True)
    for step in range(3):
        _grads([ours], step)
        _grads([ref], step)
        opt.step()
        ref_opt.step()
    torch.testing.assert_close(ours, ref, atol=0, rtol=0)


def test_row_blocks_update_like_separate_matrices() -> None:
    """A fused [A; B] weight with blocks (4, 12) moves exactly as separate A and B under torch's Muon."""
    fused, _ = _pair((16, 8))
    a = torch.nn.Parameter(fused.detach()[:4].clone())
    b = torch.nn.Parameter(fused.detach()[4:].clone())
    opt = MuonAdamW([{"params": [fused], "use_muon": True}], lr=0.02, blocks={fused: (4, 12)})
    ref_opt = torch.optim.Muon([a, b], lr=0.02)
    for step in range(3):
        _grads([fused], step)
        a.grad, b.grad = fused.grad[:4].clone(), fused.grad[4:].clone()
        opt.step()
        ref_opt.step()
    assert torch.equal(fused.detach(), torch.cat([a.detach(), b.detach()]))


def test_three_d_parameter_is_one_matrix_per_slice() -> None:
    stack, _ = _pair((3, 8, 4))
    slices = [torch.nn.Parameter(stack.detach()[i].clone()) for i in range(3)]
    opt = MuonAdamW([{"params": [stack], "use_muon": True}], lr=0.02)
    ref_opt = torch.optim.Muon(slices, lr=0.02)
    for step in range(2):
        _grads([stack], step)
        for i, s in enumerate(slices):
            s.grad = stack.grad[i].clone()
        opt.step()
        ref_opt.step()
    assert torch.equal(stack.detach(), torch.stack([s.detach() for s in slices]))


def test_rejects_vectors_and_bad_blocks() -> None:
    with pytest.raises(ValueError, match="Muon takes 2-D matrices"):
        MuonAdamW([{"params": [torch.nn.Parameter(torch.ones(4))], "use_muon": True}])
    p = torch.nn.Parameter(torch.ones(6, 2))
    with pytest.raises(ValueError, match=r"blocks \(2, 3\) do not split"):
        MuonAdamW([{"params": [p], "use_muon": True}], blocks={p: (2, 3)})


def test_newton_schulz_flops_are_counted_as_torch_counts_them() -> None:
    """ns_flops after a step equals torch's flop counter over that step (row blocks, 3-D stack, a plain
    matrix taller than wide): the count the distributed split balances is the work actually done."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    fused, stack, tall = (torch.nn.Parameter(torch.randn(s)) for s in [(12, 5), (3, 6, 4), (20, 6)])
    opt = MuonAdamW([{"params": [fused, stack, tall], "use_muon": True}], lr=0.02, blocks={fused: (4, 8)})
    _grads([fused, stack, tall], 0)
    with FlopCounterMode(display=False) as counter:
        opt.step()
    assert opt.ns_flops == counter.get_total_flops() > 0


def test_assignment_balances_flops_largest_first() -> None:
    from lightning_modules.optim.distributed import assign, ns_flops, split_matrices

    shapes = [torch.Size((12, 5)), torch.Size((3, 6, 4)), torch.Size((20, 6))]
    units = split_matrices(shapes, [(4, 8), None, None])
    assert [u[:3] for u in units] == [(0, 0, 4), (0, 4, 12), (1, 0, 1), (1, 1, 2), (1, 2, 3), (2, 0, 20)]
    assert units[2][3] == torch.Size((6, 4))
    assert assign([5, 9, 4, 4, 1], 2) == [
        1,
        0,
        1,
        0,
        1,
    ]  # 9 to 0, 5 to 1, 4 to 1 (5 < 9), 4 to 0 (tie), 1 to 1
    flops = [ns_flops(u[3], 5) for u in units]
    for world in (1, 2, 3):
        owner = assign(flops, world)
        load = [sum(f for f, o in zip(flops, owner, strict=True) if o == r) for r in range(world)]
        assert sum(load) == sum(flops) and max(load) <= 4 / 3 * max(sum(flops) / world, max(flops))


@pytest.mark.parametrize("path", ["fused", "foreach"])
@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_adamw_groups_step_as_the_single_tensor_path_does(
    name: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole tiny model's optimiser (every group, with its own LR and decay): the fused (default) and
    foreach AdamW paths take the steps the single-tensor path takes, and the kernel of the path asked for ran
    once per AdamW group and step."""
    torch.manual_seed(0)
    model = Transformer(tiny_model(), attn("lrkv"))
    twin = copy.deepcopy(model)
    config = OptimizerConfig(name=name, lr=0.02, embed_lr=0.1, head_lr=0.004)
    opt, ref = build_optimizer(model, config), build_optimizer(twin, config)
    assert opt.adamw_path == "fused"
    opt.adamw_path, ref.adamw_path = path, "single"
    kernel = "_fused_adamw_" if path == "fused" else "_foreach_addcdiv_"
    calls: list[int] = []
    original = getattr(torch, kernel)

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(len(args[0]))  # type: ignore[arg-type]
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, kernel, counted)
    for step in range(3):
        _grads(list(model.parameters()), step)
        _grads(list(twin.parameters()), step)
        opt.step()
        ref.step()
    adamw_groups = [g for g in opt.param_groups if not g["use_muon"]]
    assert calls == [len(g["params"]) for g in adamw_groups] * 3
    # foreach runs the same operations in the same order: bitwise on the CPU. The fused kernel computes the
    # same update in one pass, rounding differently: within a few float32 ulps after 3 steps.
    tolerance = {"rtol": 0.0, "atol": 0.0} if path == "foreach" else {"rtol": 1e-6, "atol": 1e-6}
    for (key, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, **tolerance, msg=key)
    with pytest.raises(ValueError, match="adamw_path='fast': one of fused, foreach, single"):
        MuonAdamW(model.parameters(), adamw_path="fast")
