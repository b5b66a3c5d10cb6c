"""Helpers that several test modules of this folder share (fixtures stay in conftest.py)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import Tensor

from lightning_modules.model.attention import AttentionConfig, resolve
from lightning_modules.model.attention.base import Attention
from lightning_modules.model.attention.mlra import LatentBlockAttention
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.layers import RMSNorm, RotaryEmbedding
from lightning_modules.model.transformer import Transformer
from tests.helpers import attn, rms, rope_reference, tiny_model

SEQ = 64  # tiny_model with a longer context, so that a prefill is followed by many single-token steps


def build(kind: str, seed: int = 0, **knobs: object) -> Transformer:
    """Tiny decoder with a larger init and random norm gains, so logits are O(1) and every weight matters."""
    torch.manual_seed(seed)
    net = Transformer(tiny_model(seq_len=SEQ, init_std=0.1), attn(kind, **knobs)).eval()
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, RMSNorm):
                module.weight.uniform_(0.5, 1.5)
    return net


def tokens(batch: int = 2, length: int = SEQ, seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randint(0, 128, (batch, length))


@torch.no_grad()
def decode_all(
    net: Transformer,
    toks: torch.Tensor,
    chunks: list[int],
    path: str | None = None,
    cache_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Prefill in the given chunk lengths, then one token at a time; the logits of every position."""
    caches = net.new_caches(toks.shape[0], toks.shape[1], path=path, dtype=cache_dtype)
    out, pos = [], 0
    for n in chunks:
        out.append(net.decode(toks[:, pos : pos + n], caches))
        pos += n
    while pos < toks.shape[1]:
        out.append(net.decode(toks[:, pos : pos + 1], caches))
        pos += 1
    assert all(c.length == toks.shape[1] for c in caches)
    return torch.cat(out, dim=1)


# ----- generation: the loop, the command line, checkpoints and tokenizers ---------------------------------
SENTENCES = [
    "To be, or not to be, that is the question.",
    "All the world's a stage, and all the men and women merely players.",
    "The quality of mercy is not strained; it droppeth as the gentle rain from heaven.",
    "Now is the winter of our discontent made glorious summer by this sun of York.",
]


def make_checkpoint(tmp_path: Path, kind: str = "lrkv") -> tuple[Path, Path]:
    """A tiny byte-level BPE, its manifest, and a checkpoint in the training module's format."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(SENTENCES, trainer=trainer)
    tokenizer.save(str(data_dir / "tokenizer.json"))
    (data_dir / "manifest.json").write_text(json.dumps({"tokenizer": "tokenizer.json", "eot_id": 0}))
    model_cfg = tiny_model(vocab_size=tokenizer.get_vocab_size(), init_std=0.2)
    attention_cfg = AttentionConfig(kind=kind)
    torch.manual_seed(0)
    net = Transformer(model_cfg, attention_cfg)
    ckpt = {
        "hyper_parameters": {
            "arch": dataclasses.asdict(model_cfg),
            "attention": dataclasses.asdict(attention_cfg),
        },
        "state_dict": {f"model.{k}": v for k, v in net.state_dict().items()},
        "datamodule_hyper_parameters": {"data_dir": str(data_dir)},
    }
    path = tmp_path / "last.ckpt"
    torch.save(ckpt, path)
    return path, data_dir


# ----- float64 checks of one variant against a reference written from its paper ---------------------------
def variant_size(n_head: int, head_dim: int, seq_len: int = 24, **overrides: object) -> ModelConfig:
    """A one-layer size of n_head heads of head_dim, for references at several shapes."""
    fields: dict[str, object] = dict(
        name="ref", vocab_size=128, seq_len=seq_len, n_layer=1, n_head=n_head,
        d_model=n_head * head_dim, head_dim=head_dim,
    )  # fmt: skip
    fields.update(overrides)
    return ModelConfig(**fields)  # type: ignore[arg-type]


def float64_layer(kind: str, model: ModelConfig, seed: int = 0, **knobs: object) -> Attention:
    """One attention layer in float64 with weights of std 0.3 and random norm gains, so every weight matters."""
    resolved = resolve(model, attn(kind, **knobs))
    torch.manual_seed(seed)
    module = resolved.variant(model, resolved.knobs).double()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.3)
    return module


def exact_rope(dim: int, length: int) -> RotaryEmbedding:
    """RoPE with float64 tables computed as tests/helpers.py rope_reference computes them (the module's own
    tables are fp32: 1e-7 off, too coarse for a 1e-10 comparison)."""
    rope = RotaryEmbedding(dim, length).double()
    angle = torch.arange(length, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(dim // 2, dtype=torch.float64) * 2 / dim
    )
    rope.cos, rope.sin = angle.cos(), angle.sin()
    rope.basis = torch.cat([rope.cos, rope.sin], dim=-1)
    return rope


@torch.no_grad()
def float64_decode_diff(kind: str, chunks: list[int], length: int = 40, **knobs: object) -> float:
    """max |cached decode - full forward| over `length` tokens of a float64 tiny decoder whose seq_len is 24,
    so the generation runs past it: prefill in `chunks`, then single steps."""
    torch.manual_seed(0)
    net = Transformer(tiny_model(seq_len=24, init_std=0.1), attn(kind, **knobs)).eval().double()
    for module in net.modules():
        if isinstance(module, RMSNorm):
            module.weight.uniform_(0.5, 1.5)
    net.rope = exact_rope(net.rope.dim, length)
    toks = tokens(length=length)
    full = net(toks)
    assert full.std() > 0.3
    return (decode_all(net, toks, chunks) - full).abs().max().item()


def latent_block_reference(
    module: LatentBlockAttention, x: Tensor, mistake: str = "", latent_scaling: bool = True
) -> Tensor:
    """n latent blocks c_b = RMSNorm_b(x W^DKV_b) sqrt(d / w), dealt to m branches of P = n / m blocks; head h
    reads block b = i P + h // (H / P) in branch i, as row hh = h mod (H / P) of that block's up-projections:
    k_{i,h} = [c_b W^UK_{b,hh} ; RoPE(x W^KR)], v_{i,h} = c_b W^UV_{b,hh}, q_h = [q^C_h ; RoPE(q^R_h)] (through
    W^UQ(RMSNorm(x W^DQ) sqrt(d / d_cq)) when compressed); y_h = sum_i softmax(q_h . k_{i,h} / sqrt(d_h + d_R))
    v_{i,h} / sqrt(m) (MLRA, arXiv 2603.02188; GLA, arXiv 2505.21487, is m = 1 without the two sqrt scalings:
    `latent_scaling` False). `mistake` plants one error."""
    B, T, d = x.shape
    H, dh, d_r, d_c, d_cq = module.n_head, module.head_dim, module.d_r, module.d_c, module.d_cq
    n, m = module.n_blocks, module.n_branches
    P, w = n // m, d_c // n
    q_rows = module.in_proj.out_features - d_c - d_r
    w_q, w_dkv, w_kr = module.in_proj.weight.split([q_rows, d_c, d_r])
    q_all = x @ w_q.T
    if d_cq:
        q_scale = math.sqrt(d / d_cq) if latent_scaling else 1.0
        q_all = (rms(q_all, module.q_norm.weight) * q_scale) @ module.q_up.weight.T
    q_all = q_all.view(B, T, H, dh + d_r)
    scale = math.sqrt(d / w) if latent_scaling and mistake != "no latent scaling" else 1.0
    latent = x @ w_dkv.T
    c = [rms(latent[..., b * w : (b + 1) * w], module.kv_norms[b].weight) * scale for b in range(n)]
    k_rope = rope_reference((x @ w_kr.T)[:, :, None])[:, :, 0]  # (B, T, d_R)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    heads = []
    for h in range(H):
        q = torch.cat([q_all[:, :, h, :dh], rope_reference(q_all[:, :, h : h + 1, dh:])[:, :, 0]], dim=-1)
        y = torch.zeros(B, T, dh, dtype=x.dtype)
        for i in range(m):
            j = h % P if mistake == "interleaved heads" else h // (H // P)
            b, hh = i * P + j, h % (H // P)
            k = torch.cat([c[b] @ module.w_uk[b, hh * dh : (hh + 1) * dh].T, k_rope], dim=-1)
            v = c[b] @ module.w_uv[b, hh * dh : (hh + 1) * dh].T
            scores = torch.einsum("btd,bsd->bts", q, k) / math.sqrt(dh + d_r)
            y = y + torch.einsum("bts,bsd->btd", scores.masked_fill(~mask, -math.inf).softmax(-1), v)
        heads.append(y / math.sqrt(m))
    return torch.cat(heads, dim=-1) @ module.out.weight.T
