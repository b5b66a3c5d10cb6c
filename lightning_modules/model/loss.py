"""Next-token cross-entropy from the final hidden states, without the (B, T, V) logits.

The plain loss, `F.cross_entropy(head(h).float(), targets)`, holds the logits of every token at once: in the
compute dtype, again in fp32, and fp32 log-probabilities saved for the backward, then two fp32 gradients of
that size in it. At 128m (B 16, T 2048, V 50304) each is 6.6 GB in fp32. Here the tokens go through the head in chunks of `chunk_rows(V)` rows: each chunk's
logits are computed in the compute dtype (bf16 under autocast, as the head's Linear would), widened to fp32
for the log-softmax, and, when a gradient is wanted, the chunk's logit gradient (softmax - one-hot) / N is
turned at once into its share of the hidden states' and the head weight's gradients (the two matrix products
the head's backward would run, in the compute dtype, the weight's summed over chunks in fp32). The forward
keeps those two gradients, (N, d) and the head weight's size, and the backward only scales them by the
incoming gradient. No tensor of N x V elements is ever made, and the FLOPs are the head's usual
forward + backward.

Numerically it is the plain loss reordered: the loss sums per chunk (fp32), and the head weight's gradient
is summed over chunks of bf16 products instead of one bf16 product over all tokens
(tests/model/test_loss.py bounds both against the plain loss, fp32 and bf16).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

# Logits (elements) of one chunk: 2**25 is 128 MiB in fp32, about 600 tokens of a 50k vocabulary.
CHUNK_ELEMENTS = 2**25


def chunk_rows(vocab: int, elements: int = CHUNK_ELEMENTS) -> int:
    """Tokens per chunk for a vocabulary of `vocab` (at least one)."""
    return max(1, elements // vocab)


def compute_dtype(device: torch.device, fallback: torch.dtype) -> torch.dtype:
    """The dtype a Linear runs in here: autocast's where it is on for this device, else the inputs'."""
    kind = device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else fallback


def _chunk_losses(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """fp32 (n, V) logits -> (sum of the n losses, each row's log-sum-exp)."""
    lse = torch.logsumexp(logits, dim=-1)
    return (lse - logits.gather(1, targets[:, None]).squeeze(1)).sum(), lse


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of hidden (N, d) @ weight (V, d)^T against targets (N,); the gradients are made in
    the forward, chunk by chunk, and scaled in the backward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, rows: int, dtype: torch.dtype
    ) -> Tensor:
        n_tokens = hidden.shape[0]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty(hidden.shape, dtype=dtype, device=hidden.device)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        w = weight.to(dtype)
        with torch.autocast(hidden.device.type, enabled=False):  # the dtypes are chosen here, explicitly
            for lo in range(0, n_tokens, rows):
                h = hidden[lo : lo + rows].to(dtype)
                t = targets[lo : lo + rows]
                logits = (h @ w.T).float()  # (n, V): the head's output in its dtype, then fp32
                loss, lse = _chunk_losses(logits, t)
                total += loss
                # d loss / d logits = (softmax - one-hot) / N, made in place in the fp32 logits
                grad = logits.sub_(lse[:, None]).exp_()
                grad[torch.arange(grad.shape[0], device=grad.device), t] -= 1.0
                grad = grad.div_(n_tokens).to(dtype)
                torch.matmul(grad, w, out=grad_hidden[lo : lo + rows])
                grad_weight += (grad.T @ h).float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return total / n_tokens

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        return (
            (grad_hidden * grad_loss).to(hidden_dtype),
            (grad_weight * grad_loss).to(weight_dtype),
            None,
            None,
            None,
        )


def cross_entropy_from_hidden(
    hidden: Tensor, weight: Tensor, targets: Tensor, elements: int = CHUNK_ELEMENTS
) -> Tensor:
    """Mean next-token cross-entropy (nats, fp32) of `hidden` (..., d) through the output head `weight`
    (V, d) against `targets` (...), in chunks of at most `elements` logits. Equals
    F.cross_entropy((hidden @ weight.T).float(), targets) to rounding. Without a gradient to make (eval,
    no_grad) it computes the loss alone, chunk by chunk."""
    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1)
    rows = chunk_rows(weight.shape[0], elements)
    dtype = compute_dtype(hidden.device, hidden.dtype)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _ChunkedCrossEntropy.apply(hidden, weight, targets, rows, dtype)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    w = weight.to(dtype)
    with torch.autocast(hidden.device.type, enabled=False):
        for lo in range(0, hidden.shape[0], rows):
            logits = (hidden[lo : lo + rows].to(dtype) @ w.T).float()
            total += _chunk_losses(logits, targets[lo : lo + rows])[0]
    return total / hidden.shape[0]
