"""Sampling and the generation loop: prefill the prompt once, then one cached decode step per new token.

Plain torch; the command line (checkpoint, tokenizer, streaming to stdout) is lightning_modules/commands/generate.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_modules.model.transformer import Transformer


@dataclass(frozen=True)
class Sampling:
    """greedy (or temperature 0): argmax. Otherwise softmax(logits / temperature), restricted to the top_k
    most likely tokens when top_k is set."""

    temperature: float = 1.0
    top_k: int | None = None
    greedy: bool = False

    def __post_init__(self) -> None:
        if not self.temperature >= 0 or math.isinf(self.temperature):  # NaN fails every comparison
            raise ValueError(f"temperature={self.temperature}: must be a finite number >= 0 (0 means greedy)")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k={self.top_k}: must be >= 1")


def sample_next(logits: Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> Tensor:
    """logits: (B, V) -> next token ids (B,)."""
    if sampling.greedy or sampling.temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[:, -1:]  # (B, 1), the k-th largest
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def check_lengths(model: Transformer, prompt_tokens: int, max_new_tokens: int, added: int = 0) -> None:
    """Generation stays within the context the model was trained for: RoPE positions beyond seq_len were never
    seen in training (and the caches are sized for prompt + new tokens). `added`: of the prompt's tokens, those
    the caller put before the user's text (the end-of-text token, lightning_modules/commands/generate.py)."""
    seq_len = model.config.seq_len
    if prompt_tokens < 1:
        raise ValueError(
            "empty prompt: give at least one token (e.g. the end-of-text id, as documents start)"
        )
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 0")
    if prompt_tokens >= seq_len:  # no room for even one new token; the cache has no sliding window
        plus = f" (+{added} end-of-text token before it)" if added else ""
        raise ValueError(
            f"the prompt is {prompt_tokens - added} tokens{plus} and the model's context is seq_len={seq_len}: "
            f"shorten the prompt to at most {seq_len - 1 - added} tokens to leave room for new ones "
            "(generation keeps the whole prompt in the context; there is no sliding window)"
        )
    if prompt_tokens + max_new_tokens > seq_len:
        raise ValueError(
            f"prompt ({prompt_tokens} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context "
            f"seq_len={seq_len}; use at most {max(seq_len - prompt_tokens, 0)} new tokens or a shorter prompt"
        )


@torch.inference_mode()
def generate(
    model: Transformer,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    sampling: Sampling | None = None,
    eot_id: int | None = None,
    seed: int | None = None,
    on_token: Callable[[int], None] | None = None,
) -> list[int]:
    """Continue `prompt_ids` (one sequence) by up to `max_new_tokens` tokens; stop early after `eot_id` when
    given (it is returned as the last id). `on_token` sees every id as soon as it is chosen, for streaming.

    Only ids below the real vocabulary size are ever chosen (the padded rows of the head are masked). The
    caches are allocated for exactly prompt + max_new_tokens positions, so what they hold is what the cost
    model predicts (costs.kv_cache_bytes_per_token).
    """
    sampling = sampling or Sampling()
    check_lengths(model, len(prompt_ids), max_new_tokens)
    if max_new_tokens == 0:
        return []
    device = model.head.weight.device
    generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    vocab = model.config.vocab_size
    caches = model.new_caches(1, len(prompt_ids) + max_new_tokens)
    prompt = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)  # (1, P)
    logits = model.decode(prompt, caches, last_only=True)[:, -1]  # (1, padded vocab)
    new: list[int] = []
    while True:
        logits[:, vocab:] = float("-inf")  # padding rows of the head are not tokens
        token = sample_next(logits, sampling, generator)  # (1,)
        new.append(int(token.item()))
        if on_token is not None:
            on_token(new[-1])
        if len(new) == max_new_tokens or (eot_id is not None and new[-1] == eot_id):
            return new
        logits = model.decode(token.view(1, 1), caches)[:, -1]
