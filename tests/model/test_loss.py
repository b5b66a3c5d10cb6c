"""The chunked loss (lightning_modules/model/loss.py) computes what the plain loss did, F.cross_entropy over
the whole (B, T, V) logits in fp32, to rounding: the loss and every parameter's gradient, in fp32 and under
bf16 autocast, in one chunk or many with a short last one; and it never makes a tensor of B x T x V."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from lightning_modules.model.loss import cross_entropy_from_hidden
from lightning_modules.model.transformer import Transformer
from tests.helpers import attn, tiny_model

B, T, V = 3, 32, 128  # tiny_model's vocabulary


def plain_loss(net: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """The loss as lightning_modules/training/language_model.py computed it before the chunked one."""
    return F.cross_entropy(net(tokens[:, :-1]).flatten(0, 1).float(), tokens[:, 1:].flatten())


class LargestOutput(TorchFunctionMode):
    """The most elements of any tensor an operation returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.largest = max(self.largest, out.numel())
        return out


@pytest.mark.parametrize("mixed", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("elements", [2**20, 10 * V, V], ids=["one-chunk", "10-rows", "1-row"])
def test_chunked_loss_and_gradients_equal_the_plain_loss(mixed: bool, elements: int) -> None:
    torch.manual_seed(0)
    ref = Transformer(tiny_model(), attn("lrkv"))
    net = copy.deepcopy(ref)
    tokens = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
        want = plain_loss(ref, tokens)
        x = net.embed(tokens[:, :-1])
        for block in net.blocks:
            x = block(x, net.rope)
        with LargestOutput() as seen:
            got = cross_entropy_from_hidden(net.norm(x), net.head.weight, tokens[:, 1:], elements=elements)
    want.backward()
    got.backward()
    if elements < B * T * V:  # 96 rows in chunks of 10 or 1, the last one short: never B x T x V at once
        assert seen.largest <= max(elements, V * net.config.d_model), seen.largest
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for (name, p), q in zip(ref.named_parameters(), net.parameters(), strict=True):
        assert q.grad is not None and q.grad.dtype == p.dtype, name
        if mixed:
            # the same bf16 logits, but the head weight's gradient summed over chunks of bf16 products (and
            # everything before it from there): bf16 rounding, relative to the gradient's size
            scale = p.grad.abs().max()
            torch.testing.assert_close(q.grad / scale, p.grad / scale, rtol=0, atol=1e-2, msg=name)
        else:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_forward_with_targets_is_the_chunked_loss_and_without_a_gradient_the_same_value() -> None:
    torch.manual_seed(0)
    net = Transformer(tiny_model(), attn("gqa"))
    tokens = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = plain_loss(net, tokens)
        quiet = net(tokens[:, :-1], targets=tokens[:, 1:])
    loud = net(tokens[:, :-1], targets=tokens[:, 1:])
    assert quiet.grad_fn is None and loud.grad_fn is not None
    torch.testing.assert_close(quiet, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loud.detach(), want, rtol=1e-6, atol=1e-6)
