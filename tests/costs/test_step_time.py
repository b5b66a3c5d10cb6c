"""The first-principles step time (lightning_modules/costs/step_time.py): its tally agrees with the FLOP
formula of counts.py, fusing moves fewer bytes than eager, each part of the time follows its assumption, and
BENCHMARKS.md prints the figures the code computes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from lightning_modules.costs import counts, step_time
from lightning_modules.model.attention import as_resolved
from tests.helpers import attn, nano_model

ROOT = Path(__file__).resolve().parents[2]


def test_the_tally_counts_the_blocks_matrix_products_as_counts_py_does() -> None:
    model = dataclasses.replace(nano_model(), seq_len=64)
    resolved = as_resolved(model, attn("mha"))
    block, ends = step_time.traced_work(model, resolved, 2)
    d, T, H, dh = model.d_model, model.seq_len, model.n_head, model.head_dim
    tokens = 2 * T
    # forward and backward (3 x forward) of q, k, v, o and the MLP's two matrices, per token
    matrices = 3 * 2 * (4 * d * H * dh + 2 * d * model.mlp_ratio * d)
    assert block.gemm_flops == pytest.approx(matrices * tokens, rel=1e-9)
    # FlashAttention's count: forward 2 products of 2 B H T^2 dh, backward 2.5 times that (it recomputes)
    assert block.attention_flops == pytest.approx(3.5 * 2 * 2 * 2 * H * T * T * dh, rel=1e-9)
    assert ends.gemm_flops == pytest.approx(3 * 2 * d * model.padded_vocab_size * tokens, rel=1e-9)
    assert 0 < block.fused_bytes < block.eager_bytes and 0 < ends.fused_bytes <= ends.eager_bytes


def test_each_part_of_the_time_follows_its_assumption() -> None:
    model, attention = nano_model(), attn("mha")
    eager = step_time.estimate(model, attention, 4, compiled=False)
    compiled = step_time.estimate(model, attention, 4, compiled=True)
    h100 = step_time.H100
    assert eager.gemm_s == pytest.approx(eager.gemm_flops / (step_time.GEMM_EFFICIENCY * h100.peak_flops))
    assert eager.attention_s == pytest.approx(
        eager.attention_flops / 2 / (step_time.ATTENTION_EFFICIENCY * h100.peak_flops)  # the causal half
    )
    assert eager.memory_s == pytest.approx(
        eager.memory_bytes / (step_time.HBM_EFFICIENCY * h100.hbm_bytes_per_s)
    )
    tokens = 4 * model.seq_len
    assert eager.model_flops == counts.train_flops_per_token(model, attention, tokens) * tokens
    assert eager.mfu == pytest.approx(eager.model_flops / (h100.peak_flops * eager.step_s))
    # fusion changes only the blocks' memory-bound bytes
    assert (compiled.gemm_s, compiled.attention_s) == (eager.gemm_s, eager.attention_s)
    assert compiled.memory_bytes < eager.memory_bytes and compiled.mfu > eager.mfu
    faster = step_time.estimate(model, attention, 4, compiled=False, device=step_time.H200)
    assert faster.memory_s < eager.memory_s and faster.gemm_s == eager.gemm_s


def test_the_optimiser_counts_every_parameter_once() -> None:
    model = nano_model()
    resolved = as_resolved(model, attn("mha"))
    flops, moved = step_time.optimizer_work(model, resolved)
    params = counts.param_counts(model, resolved)
    assert moved >= (step_time.CLIP_BYTES + step_time.MUON_BYTES) * params.total
    assert moved <= (step_time.CLIP_BYTES + step_time.ADAMW_BYTES) * params.total
    assert flops > 0  # Newton-Schulz on every block matrix


@pytest.mark.parametrize("size", ["128m", "1b"])
def test_benchmarks_md_prints_the_figures_the_code_computes(size: str) -> None:
    text = (ROOT / "BENCHMARKS.md").read_text()
    for compiled in (False, True):
        line = step_time.target(size, compiled).arithmetic()
        assert line in text, line
