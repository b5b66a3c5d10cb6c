"""The fused Triton decode kernels (lightning_modules/kernels/) against their plain-torch twins, run through
Triton's interpreter on the CPU (TRITON_INTERPRET=1): the kernels alone on random caches with several blocks
and splits, then whole generations through the model, past seq_len."""

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


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lrkv", "mla"])
def test_generation_through_the_kernel_equals_the_plain_torch_decode(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every single-token step of a generation runs the kernel (counted); its logits equal the plain path's."""
    module = __import__(f"lightning_modules.kernels.{kind}_decode", fromlist=["decode_step"])
    calls = []
    step = module.decode_step
    monkeypatch.setattr(module, "decode_step", lambda *a, **k: calls.append(1) or step(*a, **k))
    net = build(kind)
    toks = tokens(length=72)  # tiny seq_len is 64: the last steps run past it
    fused = decode_all(net, toks, [9])
    assert len(calls) == (72 - 9) * net.config.n_layer
    monkeypatch.setenv(support.MODE_ENV, "0")
    plain = decode_all(net, toks, [9])
    torch.testing.assert_close(fused, plain, rtol=0, atol=1e-4)
