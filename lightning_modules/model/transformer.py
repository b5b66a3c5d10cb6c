"""The decoder as plain torch (no Lightning): pre-norm blocks whose attention is chosen by config.

tokens (B, T) -> embedding (B, T, d) -> L x [x + attn(norm(x)); x + mlp(norm(x))] -> norm -> head (B, T, V)
Untied input and output embeddings, no biases (docs/architecture.md).

Decoding is a separate entry point, `decode(tokens, caches)`, so that the training forward stays exactly as
it was: `new_caches` makes one cache per layer (lightning_modules/model/attention/cache.py), the caller owns them
and passes them in; a prefill of T > 1 tokens and single-token steps go through the same call.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lightning_modules.model.attention import AttentionConfig, Resolved, as_resolved
from lightning_modules.model.attention.cache import LayerCache
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.layers import MLP, RMSNorm, RotaryEmbedding
from lightning_modules.model.loss import cross_entropy_from_hidden


class Block(nn.Module):
    def __init__(self, model: ModelConfig, attention: Resolved) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(model.d_model, model.norm_eps)
        self.attn = attention.variant(model, attention.knobs)
        self.mlp_norm = RMSNorm(model.d_model, model.norm_eps)
        self.mlp = MLP(model.d_model, model.mlp_ratio * model.d_model)

    def forward(self, x: Tensor, rope: RotaryEmbedding) -> Tensor:
        x = x + self.attn(self.attn_norm(x), rope)
        return x + self.mlp(self.mlp_norm(x))

    def decode(self, x: Tensor, rope: RotaryEmbedding, cache: LayerCache) -> Tensor:
        x = x + self.attn.decode(self.attn_norm(x), rope, cache)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, model: ModelConfig, attention: AttentionConfig | Resolved) -> None:
        super().__init__()
        self.config = model
        resolved = as_resolved(model, attention)
        self.resolved = resolved  # what the cost model reads for this decoder, without resolving again
        self.attention_config = resolved.config
        vocab = model.padded_vocab_size
        self.embed = nn.Embedding(vocab, model.d_model)
        self.rope = RotaryEmbedding(
            resolved.variant.rope_dim(model, resolved.knobs), model.seq_len, model.rope_base
        )
        self.blocks = nn.ModuleList(Block(model, resolved) for _ in range(model.n_layer))
        self.norm = RMSNorm(model.d_model, model.norm_eps)
        self.head = nn.Linear(model.d_model, vocab, bias=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2 style: N(0, std) everywhere, residual-branch outputs scaled by 1/sqrt(2 L)."""
        std = self.config.init_std
        out_std = std / math.sqrt(2 * self.config.n_layer)
        nn.init.normal_(self.embed.weight, std=std)
        nn.init.normal_(self.head.weight, std=std)
        for module in self.modules():
            if isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        for block in self.blocks:
            block.attn.init_weights(std, out_std)
            nn.init.normal_(block.mlp.fc.weight, std=std)
            nn.init.normal_(block.mlp.proj.weight, std=out_std)

    def forward(self, tokens: Tensor, targets: Tensor | None = None) -> Tensor:
        """tokens: (B, T) int64 with T <= seq_len. Returns logits (B, T, padded vocab); with targets (B, T),
        the mean cross-entropy against them instead, in chunks that never make the (B, T, V) logits
        (lightning_modules/model/loss.py). The loss is computed here, in the forward, so that a wrapper's
        hooks around it (FSDP2 gathers the head's weight in the root's) cover the head's use."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.rope)
        if targets is not None:
            return cross_entropy_from_hidden(self.norm(x), self.head.weight, targets)
        return self.head(self.norm(x))

    # ----- decoding ------------------------------------------------------------------------------------
    def new_caches(
        self, batch: int, max_len: int, path: str | None = None, dtype: torch.dtype | None = None
    ) -> list[LayerCache]:
        """One empty cache per layer for `batch` sequences of up to `max_len` positions. `path` picks a
        variant's decode path (default: the one lightning_modules/costs/counts.py counts); `dtype` defaults to the weights'."""
        if max_len > self.rope.cos.shape[0]:
            # RoPE past its table recomputes the table on every call (every layer, every step); build a long
            # enough one once. Same base and dim, so positions below seq_len get the same angles.
            self.rope = RotaryEmbedding(self.rope.dim, max_len, self.rope.base).to(self.rope.cos.device)
        return [block.attn.new_cache(batch, max_len, path=path, dtype=dtype) for block in self.blocks]

    def decode(self, tokens: Tensor, caches: list[LayerCache], last_only: bool = False) -> Tensor:
        """tokens: (B, T) new tokens at positions caches[0].length .. + T - 1; fills the caches. Returns
        logits (B, T, padded vocab), or (B, 1, padded vocab) for the last position only with `last_only`
        (a long prefill need not pay for T rows of the output head)."""
        x = self.embed(tokens)
        for block, cache in zip(self.blocks, caches, strict=True):
            x = block.decode(x, self.rope, cache)
        if last_only:
            x = x[:, -1:]
        return self.head(self.norm(x))
