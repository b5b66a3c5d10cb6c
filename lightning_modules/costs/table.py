"""The cost rows (costs/counts.py) as the table `python -m lightning_modules costs` prints."""

from __future__ import annotations

from typing import Any


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def format_table(rows: list[dict[str, Any]]) -> str:
    header = f"{'size':>6} {'attention':<10} {'params':>9} {'non-emb':>9} {'attn':>9} {'train F/tok':>11} "
    header += f"{'decode F/tok':>12} {'KV B/tok':>10} {'KV vs MHA':>9}"
    lines = [header, "-" * len(header)]
    for r in rows:
        vs = f"{100 * r['kv_cache_vs_mha']:.1f}%"
        if "kv_cache_vs_mha_paper_convention" in r:
            vs += f" (paper: {100 * r['kv_cache_vs_mha_paper_convention']:.1f}%)"
        lines.append(
            f"{r['size']:>6} {r['label']:<10} {_human(r['params']):>9} {_human(r['non_embedding_params']):>9} "
            f"{_human(r['attention_params']):>9} {_human(r['train_flops_per_token']):>11} "
            f"{_human(r['decode_flops_per_token']):>12} {r['kv_cache_bytes_per_token']:>10,} {vs:>9}"
        )
    lines.append(
        "train F/tok: forward+backward FLOPs per token at the size's full context; decode F/tok: one new token "
        "at that context; KV B/tok: bf16 cache bytes per token, all layers (docs/costs.md)."
    )
    return "\n".join(lines)
