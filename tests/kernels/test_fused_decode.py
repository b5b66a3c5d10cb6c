"""The fused Triton decode kernels (lightning_modules/kernels/) against their plain-torch twins, run through
Triton's interpreter on the CPU (TRITON_INTERPRET=1): the kernels alone on random caches with several blocks
and splits, at shapes that exercise every padding (6 heads, rank 46, a latent not a power of 2, two head
groups) in bf16; then whole generations through the model, past seq_len; then the switch and the fallback.

The interpreter's tl.dot misreads bf16 inputs, so there the products take fp32 inputs (kernels/support.py,
dot_dtype): these tests check the kernels' indexing, masking and softmax on bf16 caches exactly, and
kernels/aot.py what a GPU compile of the bf16 products needs."""

from __future__ import annotations

import math
import os

import pytest
import torch

from lightning_modules.kernels import support
from lightning_modules.model.attention import lrkv_cached as lrkv_decode
from lightning_modules.model.layers import RotaryEmbedding
from tests.model.helpers import build, decode_all, tokens

if not support.triton_installed():  # make test installs it (the [triton] extra); elsewhere it is optional
    if os.environ.get("CI"):
        pytest.fail("triton is not installed: the fused-kernel tests would be skipped in CI", pytrace=False)
    pytest.skip("triton not installed (pip install .[triton])", allow_module_level=True)


@pytest.fixture(autouse=True)
def fused_on_this_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels on the CPU through the interpreter (tests/conftest.py sets TRITON_INTERPRET=1 there before
    triton is imported), or compiled on a GPU."""
    if not torch.cuda.is_available() and not support.interpreting():
        pytest.fail(
            "TRITON_INTERPRET is not set on a machine without a GPU (tests/conftest.py)", pytrace=False
        )
    monkeypatch.setenv(support.MODE_ENV, "1")
    monkeypatch.setattr(support, "disabled", {})


def _lrkv_cache(B: int, S: int, H: int, dh: int, r: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Held views of a cache allocated longer than S, so the kernel reads through the buffers' strides."""
    g = torch.Generator().manual_seed(S)
    full = S + 7
    bufs = {
        "k_rot": torch.randn(B, full, dh, generator=g),
        "sigma": torch.rand(B, full, H, generator=g) + 0.5,
        "l_k": torch.randn(B, full, H, r, generator=g),
        "v_s": torch.randn(B, full, dh, generator=g),
        "l_v": torch.randn(B, H, full, r, generator=g),
    }
    return {n: b.to(dtype).narrow(2 if n == "l_v" else 1, 0, S) for n, b in bufs.items()}


@pytest.mark.parametrize("with_sigma", [True, False], ids=["qk-norm", "no-qk-norm"])
@pytest.mark.parametrize("S", [1, 37, 150])
def test_lrkv_kernel_equals_the_plain_torch_scores_and_mixtures(S: int, with_sigma: bool) -> None:
    from lightning_modules.kernels import lrkv_decode as kernel  # needs triton: after the skip above

    B, H, dh, r = 2, 3, 16, 5  # H, r not powers of 2: the kernel pads them
    held = _lrkv_cache(B, S, H, dh, r, torch.float32)
    sigma = held["sigma"] if with_sigma else None
    q = torch.randn(B, 1, H, dh)
    c = torch.randn(H, dh, r)
    rope = RotaryEmbedding(dh, 64)  # S = 150 runs past its table, as a long generation does
    maps = lrkv_decode.query_maps(q, c)
    basis = lrkv_decode.rope_basis(rope, S, torch.float32)
    scores = lrkv_decode.latent_scores(q, maps, held["k_rot"], held["l_k"], sigma, basis) / math.sqrt(dh)
    a = scores.softmax(-1)  # (B, H, 1, S)
    want_v = torch.matmul(a, held["v_s"].unsqueeze(1))[:, :, 0]
    want_lv = torch.matmul(a, held["l_v"])[:, :, 0]
    got_v, got_lv = kernel.decode_step(
        q[:, 0], maps[:, 0], held["k_rot"], sigma, held["l_k"], held["v_s"], held["l_v"],
        rope.inv_freq(), 1.0 / math.sqrt(dh), block=16, programs=8,
    )  # fmt: skip
    torch.testing.assert_close(got_v, want_v, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_lv, want_lv, rtol=1e-5, atol=1e-5)


def test_lrkv_kernel_reads_a_bf16_cache_with_fp32_sums() -> None:
    from lightning_modules.kernels import lrkv_decode as kernel  # needs triton: after the skip above

    B, S, H, dh, r = 2, 90, 4, 32, 8
    held = _lrkv_cache(B, S, H, dh, r, torch.bfloat16)
    q, c = torch.randn(B, 1, H, dh), torch.randn(H, dh, r) * 0.3
    rope = RotaryEmbedding(dh, S)
    maps = lrkv_decode.query_maps(q, c)
    basis = lrkv_decode.rope_basis(rope, S, torch.float32)
    scores = lrkv_decode.latent_scores(q, maps, held["k_rot"], held["l_k"], held["sigma"], basis)
    a = (scores / math.sqrt(dh)).softmax(-1)
    want_v = torch.matmul(a, held["v_s"].float().unsqueeze(1))[:, :, 0]
    got_v, _ = kernel.decode_step(
        q[:, 0], maps[:, 0], held["k_rot"], held["sigma"], held["l_k"], held["v_s"], held["l_v"],
        rope.inv_freq(), 1.0 / math.sqrt(dh), block=32, programs=4,
    )  # fmt: skip
    # Products take bf16 inputs (q, M, cos and sin rounded to 8 bits), as flash-attn's do; sums are fp32.
    torch.testing.assert_close(got_v, want_v, rtol=0, atol=3e-2)


@pytest.mark.parametrize("S", [1, 70])
def test_mla_kernel_equals_sdpa_over_the_latent(S: int) -> None:
    from lightning_modules.kernels import mla_decode as kernel  # needs triton: after the skip above

    B, H, d_c, d_r = 2, 3, 24, 8
    g = torch.Generator().manual_seed(S)
    latent = torch.randn(B, S + 5, d_c + d_r, generator=g)[:, :S]
    q = torch.randn(B, H, d_c + d_r, generator=g)
    scale = 1.0 / math.sqrt(40)
    a = (torch.einsum("bhc,bsc->bhs", q, latent) * scale).softmax(-1)
    want = torch.einsum("bhs,bsc->bhc", a, latent[..., :d_c])
    got = kernel.decode_step(q, latent, d_c, scale, block=16, programs=3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("S", [150])
def test_lrkv_kernel_at_padded_shapes_on_a_bf16_cache(S: int) -> None:
    """6 heads, rank 46 (padded to 64) and d_h 64 as at 128m's ratios, bf16 cache read through its strides."""
    from lightning_modules.kernels import lrkv_decode as kernel  # needs triton: after the skip above

    B, H, dh, r = 2, 6, 64, 46
    held = _lrkv_cache(B, S, H, dh, r, torch.bfloat16)
    q, c = torch.randn(B, 1, H, dh), torch.randn(H, dh, r) * 0.2
    rope = RotaryEmbedding(dh, S)
    maps = lrkv_decode.query_maps(q, c)
    basis = lrkv_decode.rope_basis(rope, S, torch.float32)
    up = {n: t.float() for n, t in held.items()}  # the bf16 values, exactly, in fp32
    scores = lrkv_decode.latent_scores(q, maps, up["k_rot"], up["l_k"], up["sigma"], basis)
    a = (scores / math.sqrt(dh)).softmax(-1)
    want_v = torch.matmul(a, up["v_s"].unsqueeze(1))[:, :, 0]
    want_lv = torch.matmul(a, up["l_v"])[:, :, 0]
    got_v, got_lv = kernel.decode_step(
        q[:, 0], maps[:, 0], held["k_rot"], held["sigma"], held["l_k"], held["v_s"], held["l_v"],
        rope.inv_freq(), 1.0 / math.sqrt(dh), block=32, programs=20,
    )  # fmt: skip
    torch.testing.assert_close(got_v, want_v, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_lv, want_lv, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("H", "d_c", "d_r"),
    [(6, 40, 16), (20, 40, 16), (3, 520, 8)],
    ids=["6-heads-latent-40", "two-head-groups", "wide-latent-plan"],
)
def test_mla_kernel_at_padded_shapes_on_a_bf16_cache(H: int, d_c: int, d_r: int) -> None:
    """A latent that is not a power of 2, heads in two groups of 16 (20 heads), and a latent wide enough for
    the plan's 32-position blocks."""
    from lightning_modules.kernels import mla_decode as kernel  # needs triton: after the skip above

    B, S = 2, 75
    g = torch.Generator().manual_seed(H)
    latent = torch.randn(B, S + 5, d_c + d_r, generator=g).to(torch.bfloat16)[:, :S]
    q = torch.randn(B, H, d_c + d_r, generator=g) * 0.2
    scale = 1.0 / math.sqrt(d_c + d_r)
    up = latent.float()
    a = (torch.einsum("bhc,bsc->bhs", q, up) * scale).softmax(-1)
    want = torch.einsum("bhs,bsc->bhc", a, up[..., :d_c])
    got = kernel.decode_step(q, latent, d_c, scale, programs=5)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_mla_plan_keeps_wide_latents_in_small_blocks() -> None:
    from lightning_modules.kernels import mla_decode as kernel  # needs triton: after the skip above

    assert kernel.plan(6, 128) == {"HG": 16, "BLOCK_S": 64, "num_warps": 4, "num_stages": 2}
    assert kernel.plan(32, 1024) == {"HG": 16, "BLOCK_S": 32, "num_warps": 8, "num_stages": 2}


def _counting(monkeypatch: pytest.MonkeyPatch, kind: str) -> list[int]:
    """Count the kernel's calls (the model imports the module when it decodes)."""
    module = __import__(f"lightning_modules.kernels.{kind}_decode", fromlist=["decode_step"])
    calls: list[int] = []
    step = module.decode_step
    monkeypatch.setattr(module, "decode_step", lambda *a, **k: calls.append(1) or step(*a, **k))
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lrkv", "mla"])
def test_generation_through_the_kernel_is_as_close_to_fp32_as_the_plain_bf16_decode(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every single-token step of a bf16 model's generation (weights and cache in bf16, as on a GPU) runs the
    kernel (counted), past seq_len; its logits are no farther from the fp32 model's than the plain bf16
    decode's are (the kernel mixes in fp32, the plain path multiplies bf16 probabilities)."""
    toks = tokens(length=72)  # tiny seq_len is 64: the last steps run past it
    monkeypatch.setenv(support.MODE_ENV, "0")
    exact = decode_all(build(kind), toks, [9])
    plain = decode_all(build(kind).to(torch.bfloat16), toks, [9], cache_dtype=torch.bfloat16).float()
    monkeypatch.setenv(support.MODE_ENV, "1")
    calls = _counting(monkeypatch, kind)
    net = build(kind).to(torch.bfloat16)
    fused = decode_all(net, toks, [9], cache_dtype=torch.bfloat16).float()
    assert len(calls) == (72 - 9) * net.config.n_layer
    plain_error, fused_error = (plain - exact).abs(), (fused - exact).abs()
    assert fused_error.max() <= 1.25 * plain_error.max()
    assert fused_error.mean() <= 1.1 * plain_error.mean()


@pytest.mark.parametrize("kind", ["lrkv", "mla"])
def test_an_fp32_cache_takes_the_plain_path(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, kind)
    decode_all(build(kind), tokens(length=12), [9])
    assert calls == []


def test_the_switch_names_kernels_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    t = torch.zeros(1)
    monkeypatch.setenv(support.MODE_ENV, "mla")
    assert support.usable("mla", t, torch.bfloat16)
    assert not support.usable("lrkv", t, torch.bfloat16)
    assert not support.usable("mla", t, torch.float32)
    monkeypatch.setenv(support.MODE_ENV, "0")
    assert not support.usable("mla", t, torch.bfloat16)
    monkeypatch.setenv(support.MODE_ENV, "auto")  # CUDA only: never on a CPU tensor
    assert not support.usable("mla", t, torch.bfloat16)
    monkeypatch.setenv(support.MODE_ENV, "mla,flash")
    with pytest.raises(ValueError, match="unknown kernel \\['flash'\\]"):
        support.usable("mla", t, torch.bfloat16)


@pytest.mark.parametrize("kind", ["lrkv", "mla"])
def test_a_kernel_the_device_cannot_launch_falls_back_with_one_warning(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton's OutOfResources at launch: one warning naming the kernel and why, the plain path's logits, and
    the kernel not tried again in this process."""
    from triton.runtime.errors import OutOfResources

    module = __import__(f"lightning_modules.kernels.{kind}_decode", fromlist=["decode_step"])
    tries: list[int] = []

    def cannot_launch(*args: object, **kwargs: object) -> None:
        tries.append(1)
        raise OutOfResources(348160, 232448, "shared memory")

    monkeypatch.setattr(module, "decode_step", cannot_launch)
    net, toks = build(kind).to(torch.bfloat16), tokens(length=12)
    with pytest.warns(RuntimeWarning, match=f"fused {kind} decode kernel cannot run.*shared memory") as seen:
        fallen_back = decode_all(net, toks, [9], cache_dtype=torch.bfloat16)
    assert len(seen) == 1 and tries == [1]
    assert kind in support.disabled
    monkeypatch.setenv(support.MODE_ENV, "0")
    plain = decode_all(net, toks, [9], cache_dtype=torch.bfloat16)
    torch.testing.assert_close(fallen_back, plain, rtol=0, atol=0)
