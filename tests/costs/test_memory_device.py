"""The memory plan's device (lightning_modules/costs/memory.py, Setup.device): a CUDA plan counts what a CUDA step
saves (SDPA's fused kernels, the fused RMSNorm, CUDA autocast's fp32 ops), a CPU plan what the CPU trace saves.
Exact byte counts, written out by hand from the model's code, at a size small enough to list every tensor."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from lightning_modules.commands.cost_report import main as costs_main
from lightning_modules.core.errors import ConfigError
from lightning_modules.core.fragments import fragment
from lightning_modules.costs import cuda_step, memory
from lightning_modules.model.attention import load_configs
from tests.helpers import attn, tiny_model

B = 2  # the micro-batch of the tiny traces


def traced(kind: str, precision: str, device: str) -> memory.Activations:
    setup = memory.Setup(micro_batch=B, precision=precision, device=device)
    return memory.activations_traced(tiny_model(), attn(kind), setup)


def test_cuda_mla_block_saves_the_efficient_kernels_tensors_and_no_probabilities() -> None:
    """Every storage one MLA block saves in a bf16-mixed CUDA step, by hand (tiny_model: d 64, H 4, dh 16,
    d_c 24, d_R 8, T 32, MLP 256). Linear layers save their bf16 input and autocast's bf16 weight copy."""
    m = tiny_model()
    T, d, H, dh, hidden = m.seq_len, m.d_model, m.n_head, m.head_dim, 4 * m.d_model
    d_c, d_r = 24, 8
    fp32, bf16 = 4, 2
    rows = B * T
    q_width = H * (dh + d_r)
    linear = lambda fan_in, fan_out: rows * fan_in * bf16 + fan_out * fan_in * bf16  # noqa: E731
    expected = {
        # attn_norm on the fp32 residual (the fused kernel: input and rstd; its weight is the parameter)
        "attn_norm": rows * d * fp32 + rows * fp32,
        "in_proj": linear(d, q_width + d_c + d_r),
        # RoPE on q^R and k^R: cos and sin cast to the bf16 projection's dtype, (T, 1, d_R / 2) each, twice
        "rope tables": 4 * T * (d_r // 2) * bf16,
        # kv_norm: autocast runs rms_norm in fp32, so c, its rstd and the bf16 gain each get an fp32 copy
        "kv_norm": rows * d_c * fp32 + rows * fp32 + d_c * fp32,
        "kv_up": linear(d_c, 2 * H * dh),
        # memory-efficient SDPA: q = [q^C ; q^R], k = [k^C ; k^R] (new), v a view of kv_up's output (its
        # whole storage, keys' half included), the output, the fp32 log-sum-exp (T padded to 32), the seeds
        "attention": 2 * rows * q_width * bf16
        + rows * 2 * H * dh * bf16
        + rows * H * dh * bf16
        + B * H * math.ceil(T / 32) * 32 * fp32
        + 2 * 8,
        # out's input is the attention output itself ((B, T, H, dh) underneath): only its weight is new
        "out": d * H * dh * bf16,
        "mlp_norm": rows * d * fp32 + rows * fp32,
        "fc": linear(d, hidden),
        "relu": rows * hidden * bf16,
        "square": rows * hidden * fp32,  # pow on CUDA autocast's fp32 list: its fp32 input is saved
        "proj": linear(hidden, d),
    }
    cuda = traced("mla", "bf16-mixed", "cuda")
    assert cuda.attention_kernel == "efficient"  # flash refuses q/k head dims (24) != v's (16)
    assert cuda.block == sum(expected.values())
    cpu = traced("mla", "bf16-mixed", "cpu")
    assert cpu.attention_kernel == "math"
    assert cpu.block > cuda.block  # the math path's fp32 (B, H, T, T) probabilities, among others


def test_mha_cuda_and_cpu_plans_differ_by_the_known_terms() -> None:
    """fp32, where the CPU also runs a fused SDPA kernel (its flash): CUDA's memory-efficient kernel saves
    the same q, k, v, output and log-sum-exp plus two int64 seeds; the CPU's composite RMSNorm saves the
    normalised input that CUDA's fused RMSNorm does not, for each norm (attn, mlp, q and k; the final norm
    in the ends)."""
    m = tiny_model()
    T, d, H, dh = m.seq_len, m.d_model, m.n_head, m.head_dim
    cpu, cuda = traced("mha", "32-true", "cpu"), traced("mha", "32-true", "cuda")
    assert (cpu.attention_kernel, cuda.attention_kernel) == ("flash", "efficient")
    normalised = 2 * B * T * d * 4 + 2 * B * T * H * dh * 4
    assert cpu.block - cuda.block == normalised - 2 * 8
    assert cpu.ends - cuda.ends == B * T * d * 4


@pytest.mark.parametrize(
    ("precision", "kernels"),
    [
        ("bf16-mixed", {"mha": "flash", "mqa": "flash", "gqa": "flash", "mla": "efficient", "lrkv": "flash"}),
        # fp32: flash needs fp16/bf16; efficient takes no grouped kv heads (EFFICIENT_TAKES_GROUPED_HEADS)
        (
            "32-true",
            {"mha": "efficient", "mqa": "math", "gqa": "math", "mla": "efficient", "lrkv": "efficient"},
        ),
    ],
)
def test_each_attention_plans_the_kernel_cuda_runs(precision: str, kernels: dict[str, str]) -> None:
    for kind, kernel in kernels.items():
        plan = memory.plan(tiny_model(), attn(kind), memory.Setup(micro_batch=B, precision=precision))
        assert (kind, plan.device, plan.attention_kernel) == (kind, "cuda", kernel)


def test_cuda_kernel_rules() -> None:
    def qkv(dtype: torch.dtype, dq: int = 64, dv: int = 64, kv_heads: int = 4) -> list[torch.Tensor]:
        return [
            torch.empty(2, heads, 128, dim, dtype=dtype, device="meta")
            for heads, dim in ((4, dq), (kv_heads, dq), (kv_heads, dv))
        ]

    bf16, fp32 = torch.bfloat16, torch.float32
    assert cuda_step.sdpa_cuda_kernel(*qkv(bf16), masked=False, causal=True) == "flash"
    assert cuda_step.sdpa_cuda_kernel(*qkv(bf16, kv_heads=1), masked=False, causal=True) == "flash"
    assert cuda_step.sdpa_cuda_kernel(*qkv(bf16), masked=True, causal=False) == "efficient"
    assert cuda_step.sdpa_cuda_kernel(*qkv(bf16, dq=192, dv=128), masked=False, causal=True) == "efficient"
    assert cuda_step.sdpa_cuda_kernel(*qkv(bf16, dq=264, dv=264), masked=False, causal=True) == "efficient"
    assert (
        cuda_step.sdpa_cuda_kernel(*qkv(bf16, dq=60, dv=64), masked=False, causal=True) == "math"
    )  # align 8
    assert cuda_step.sdpa_cuda_kernel(*qkv(fp32, dq=60, dv=60), masked=False, causal=True) == "efficient"
    assert cuda_step.sdpa_cuda_kernel(*qkv(fp32), masked=False, causal=True) == "efficient"
    assert cuda_step.sdpa_cuda_kernel(*qkv(fp32, kv_heads=2), masked=False, causal=True) == "math"


@pytest.mark.slow
def test_mla_at_128m_batch_16_loses_the_probabilities_on_cuda() -> None:
    """The paper's 128m MLA at its recipe's micro-batch: the CPU trace's largest saved tensor is the math
    path's fp32 (B, H, T, T) probabilities; the CUDA plan's is the MLP's fp32 ReLU output (B, T, 4d)."""
    model, attention = load_configs([fragment("model", "128m"), fragment("attention", "mla")])
    model = dataclasses.replace(model, n_layer=1)  # the block is all the test reads
    batch, T = 16, model.seq_len
    cpu = memory.activations(model, attention, memory.Setup(micro_batch=batch, device="cpu"))
    cuda = memory.activations(model, attention, memory.Setup(micro_batch=batch, device="cuda"))
    assert cpu.block_largest == batch * model.n_head * T * T * 4
    assert cuda.block_largest == batch * T * 4 * model.d_model * 4
    assert cpu.block - cuda.block > batch * model.n_head * T * T * 4 - cuda.block_largest


def test_bad_device_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="device='tpu'; allowed: cuda, cpu"):
        memory.Setup(device="tpu")
    with pytest.raises(SystemExit):
        costs_main(["--memory", "--size", "nano", "--device", "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_prints_the_plan_of_the_device_asked(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--memory", "--size", "nano", "--attention", "mla", "--micro-batch", "2"]
    assert costs_main(base) == 0
    out = capsys.readouterr().out
    assert "on cuda (attention: SDPA efficient)" in out and "on cpu" not in out
    assert costs_main([*base, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "on cpu (attention: SDPA math)" in out and "on cuda" not in out
