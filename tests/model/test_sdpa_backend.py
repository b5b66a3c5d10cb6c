"""Which SDPA backend kernel.attend records (lightning_modules/model/attention/kernel.py), held against what
SDPA really ran: the profiler's names for the backends' ops. On a CPU SDPA has two backends, its flash
kernel and math; MLA's unequal q/k and v head dims take math. And LRKV_SDPA_BACKEND: forcing math runs
math, a bad value and a backend that cannot run are one-line ConfigErrors."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

from lightning_modules.core.errors import ConfigError
from lightning_modules.model.attention import kernel
from lightning_modules.model.transformer import Transformer
from main import main
from tests.conftest import TINY_SEQ_LEN
from tests.helpers import KINDS, attn, tiny_model

ROOT = Path(__file__).resolve().parents[2]
# The op each CPU backend runs under aten::scaled_dot_product_attention.
OPS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "sdpa:flash",
    "aten::_scaled_dot_product_attention_math": "sdpa:math",
}
# (H, G, d_qk, d_v, Tq, Tk): each path of attend.
SHAPES = {
    "mha": (4, 4, 16, 16, 8, 8),
    "gqa": (4, 2, 16, 16, 8, 8),
    "mla": (4, 4, 24, 16, 8, 8),  # q/k head dim d_h + d_R, v head dim d_h
    "mla-absorbed-decode": (4, 1, 24, 16, 1, 8),  # one latent head, v a slice of it: the grouped decode path
    "gqa-decode": (4, 2, 16, 16, 1, 8),
    "mha-chunk-after-cache": (4, 4, 16, 16, 3, 8),  # the bottom-right mask
}
DTYPES = {
    "fp32": (torch.float32, False),
    "bf16": (torch.bfloat16, False),
    "bf16-autocast": (torch.float32, True),
}


@pytest.fixture(autouse=True)
def sdpa_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kernel.BACKEND_ENV, raising=False)
    monkeypatch.setattr(kernel, "flash_attn_func", None)  # SDPA on every machine, flash-attn or not


def qkv(shape: str, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    H, G, d, d_v, Tq, Tk = SHAPES[shape]
    torch.manual_seed(0)
    k = torch.randn(2, G, Tk, d, dtype=dtype)
    v = k[..., :d_v] if shape == "mla-absorbed-decode" else torch.randn(2, G, Tk, d_v, dtype=dtype)
    return torch.randn(2, H, Tq, d, dtype=dtype), k, v


def ran(fn: Callable[[], object]) -> tuple[set[str], set[str]]:
    """(the backends the profiler saw SDPA run, the kernels attend recorded) during fn()."""
    kernel.forget()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {OPS[e.name] for e in prof.events() if e.name in OPS}, set(kernel.kernels_seen)


def reference(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d) + bottom-right causal mask) v in fp64, K/V repeated to H heads."""
    H, G, Tq, Tk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    k, v = (t.double().repeat_interleave(H // G, dim=1) for t in (k, v))
    scores = q.double() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=Tk - Tq)
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("precision", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_recorded_backend_is_the_one_sdpa_ran(shape: str, precision: str) -> None:
    dtype, autocast = DTYPES[precision]
    q, k, v = qkv(shape, dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        seen, recorded = ran(lambda: kernel.attend(q, k, v))
    assert recorded == seen == {"sdpa:math" if shape.startswith("mla") else "sdpa:flash"}
    assert kernel.last_kernel in recorded and kernel.last_reason.endswith("chosen by SDPA's dispatch")


@pytest.mark.parametrize("precision", ["fp32", "bf16-autocast"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_variant_records_what_ran_in_training(kind: str, precision: str) -> None:
    """A training forward and backward of each variant: the record is the profiler's, one backend each."""
    model = Transformer(tiny_model(), attn(kind))
    tokens = torch.randint(0, 128, (2, 16))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-autocast"):
            model(tokens).float().sum().backward()

    seen, recorded = ran(step)
    d_qk, d_v = model.resolved.variant.score_dims(model.config, model.resolved.knobs)
    assert recorded == seen == {"sdpa:flash" if d_qk == d_v else "sdpa:math"}  # CPU flash: equal head dims


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", ["mha", "gqa-decode", "mha-chunk-after-cache", "mla"])
def test_forcing_math_runs_math(monkeypatch: pytest.MonkeyPatch, shape: str, precision: str) -> None:
    dtype = DTYPES[precision][0]
    q, k, v = qkv(shape, dtype)
    monkeypatch.setenv(kernel.BACKEND_ENV, "math")
    out: list[Tensor] = []
    seen, recorded = ran(lambda: out.append(kernel.attend(q, k, v)))
    assert recorded == seen == {"sdpa:math"}
    assert (kernel.last_kernel, kernel.last_reason) == ("sdpa:math", "forced by LRKV_SDPA_BACKEND=math")
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(out[0].double(), reference(q, k, v), **tol)


def test_forcing_flash_where_it_can_run(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v = qkv("gqa", torch.float32)
    monkeypatch.setenv(kernel.BACKEND_ENV, " Flash ")  # case and spaces do not matter
    seen, recorded = ran(lambda: kernel.attend(q, k, v))
    assert recorded == seen == {"sdpa:flash"}


def test_auto_lets_sdpa_choose(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v = qkv("mla", torch.float32)
    monkeypatch.setenv(kernel.BACKEND_ENV, "auto")
    assert ran(lambda: kernel.attend(q, k, v)) == ({"sdpa:math"}, {"sdpa:math"})


@pytest.mark.parametrize("value", ["bogus", "mem_efficient", "flash_attn"])
def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(kernel.BACKEND_ENV, value)
    with pytest.raises(ConfigError) as err:
        kernel.attend(*qkv("mha", torch.float32))
    assert str(err.value) == (
        f"LRKV_SDPA_BACKEND={value!r} is not an SDPA backend; use one of auto, flash, efficient, cudnn, math"
    )


@pytest.mark.parametrize(
    ("forced", "shape", "why"),
    [
        ("flash", "mla", "Flash attention requires q,k,v to have the same last dimension"),
        ("efficient", "mha", "on a CPU SDPA has only its flash and math backends"),
        ("cudnn", "mha", "on a CPU SDPA has only its flash and math backends"),
    ],
)
def test_a_forced_backend_that_cannot_run_is_one_line(
    monkeypatch: pytest.MonkeyPatch, forced: str, shape: str, why: str
) -> None:
    monkeypatch.setenv(kernel.BACKEND_ENV, forced)
    q, k, v = qkv(shape, torch.float32)
    with pytest.raises(ConfigError) as err:
        kernel.attend(q, k, v)
    message = str(err.value)
    assert "\n" not in message and "Triggered internally" not in message
    assert message.startswith(
        f"LRKV_SDPA_BACKEND={forced}: SDPA's {forced} backend cannot run this attention call"
    )
    assert f"v {tuple(v.shape)}" in message and why in message
    assert message.endswith(
        "Unset LRKV_SDPA_BACKEND (or set it to auto) to let SDPA choose, or force another backend"
    )


def test_a_step_mixing_kernels_names_each() -> None:
    kernel.forget()
    kernel.attend(*qkv("mha", torch.float32))
    kernel.attend(*qkv("mla", torch.float32))
    kernel.attend(*qkv("gqa", torch.float32))
    why = "flash-attn not installed; chosen by SDPA's dispatch"
    assert kernel.summary() == ("sdpa:flash+sdpa:math", f"sdpa:flash: {why}; sdpa:math: {why}")
    assert kernel.last_kernel == "sdpa:flash"  # still the latest call's, as benchmarks/gpu.py reads it
    kernel.forget()
    assert kernel.summary() == ("none", "no call yet")


@pytest.mark.slow
def test_the_tag_lands_in_mlflow(tiny_shards: Path, mlflow_uri: str) -> None:
    """A one-step fit of mla (the variant whose backend differs): its tags name SDPA's math backend."""
    main(
        [
            "fit",
            "--config", str(ROOT / "conf/base.yaml"),
            "--config", str(ROOT / "conf/model/nano.yaml"),
            "--config", str(ROOT / "conf/attention/mla.yaml"),
            "--model.arch.seq_len", str(TINY_SEQ_LEN),
            "--data.data_dir", str(tiny_shards),
            "--data.batch_size", "2",
            "--data.num_workers", "0",
            "--trainer.max_steps", "1",
            "--trainer.limit_val_batches", "0",
            "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false",
        ]
    )  # fmt: skip
    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("lrkv-lab").experiment_id])
    tags = run.data.tags
    assert tags["attention_kernel"] == "sdpa:math"
    assert tags["attention_kernel_reason"] == "flash-attn not installed; chosen by SDPA's dispatch"


@pytest.mark.parametrize("forced", ["auto", "math"])
def test_inside_torch_compile_the_record_says_so(monkeypatch: pytest.MonkeyPatch, forced: str) -> None:
    """One graph (fullgraph: recording breaks nothing), the same values, and a forced math still runs math."""
    monkeypatch.setenv(kernel.BACKEND_ENV, forced)
    q, k, v = qkv("gqa", torch.float32)
    compiled = torch.compile(kernel.attend, fullgraph=True, backend="aot_eager")
    out: list[Tensor] = []
    seen, recorded = ran(lambda: out.append(compiled(q, k, v)))
    assert recorded == set() and seen == {"sdpa:math" if forced == "math" else "sdpa:flash"}
    assert kernel.summary()[0] == "sdpa:compiled"
    assert kernel.last_reason.endswith("torch.compile fixes the SDPA backend when it traces the graph")
    # Eager calls recording other kernels, and forget(), never make the compiled code recompile
    kernel.attend(*qkv("mla", torch.float32))
    assert kernel.summary()[0] == "sdpa:compiled+sdpa:math"
    kernel.forget()
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled(q, k, v)
        kernel.attend(*qkv("mla", torch.float32))
        compiled(q, k, v)
    monkeypatch.setenv(kernel.BACKEND_ENV, "auto")
    torch.testing.assert_close(out[0], kernel.attend(q, k, v))
