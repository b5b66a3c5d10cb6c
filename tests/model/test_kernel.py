"""The kernel dispatch (lightning_modules/model/attention/kernel.py), on CPU: a stand-in for flash-attn's
flash_attn_func and a stand-in device check decide nothing themselves; they let the test see which calls
the dispatch would give to flash-attn, in which layout and dtype, and that K/V arrive with their own
(grouped) number of heads, never repeated."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_modules.model.attention import kernel
from lightning_modules.model.transformer import Transformer
from tests.helpers import KINDS, attn, tiny_model


class FakeFlash:
    """flash_attn_func's contract: (B, T, heads, dim) in, causal mask aligned bottom-right, G < H native."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Size, torch.Size, torch.Size, torch.dtype]] = []

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float | None) -> Tensor:
        self.calls.append((q.shape, k.shape, v.shape, q.dtype))
        assert q.dtype == k.dtype == v.dtype and q.dtype in (torch.float16, torch.bfloat16)
        Tq, Tk = q.shape[1], k.shape[1]
        mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=Tk - Tq) if causal else None
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=softmax_scale,
            enable_gqa=True,
        )  # fmt: skip
        return out.transpose(1, 2)


@pytest.fixture(autouse=True)
def sdpa_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kernel.BACKEND_ENV, raising=False)  # a forced backend would skip flash-attn


@pytest.fixture
def flash(monkeypatch: pytest.MonkeyPatch) -> FakeFlash:
    fake = FakeFlash()
    monkeypatch.setattr(kernel, "flash_attn_func", fake)
    monkeypatch.setattr(kernel, "flash_device", lambda t: True)
    return fake


def qkv(
    H: int = 4,
    G: int = 2,
    d: int = 16,
    d_v: int | None = None,
    T: int = 8,
    dtype: torch.dtype = torch.bfloat16,
) -> tuple[Tensor, Tensor, Tensor]:
    torch.manual_seed(0)
    return (
        torch.randn(2, H, T, d, dtype=dtype),
        torch.randn(2, G, T, d, dtype=dtype),
        torch.randn(2, G, T, d_v or d, dtype=dtype),
    )


def test_flash_not_installed_falls_back_to_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel, "flash_attn_func", None)
    kernel.attend(*qkv())
    assert (kernel.last_kernel, kernel.last_reason) == (
        "sdpa:flash",  # SDPA's CPU flash kernel (tests/model/test_sdpa_backend.py checks it is what ran)
        "flash-attn not installed; chosen by SDPA's dispatch",
    )


def test_installed_but_on_cpu_falls_back_to_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeFlash()
    monkeypatch.setattr(kernel, "flash_attn_func", fake)  # the real device check stays
    kernel.attend(*qkv())
    assert kernel.last_kernel == "sdpa:flash" and "not a CUDA GPU" in kernel.last_reason and not fake.calls


def test_flash_gets_grouped_heads_natively_and_matches_sdpa(flash: FakeFlash) -> None:
    q, k, v = qkv(H=4, G=2)
    out = kernel.attend(q, k, v, scale=0.3)
    assert kernel.last_kernel == "flash_attn"
    assert flash.calls == [((2, 8, 4, 16), (2, 8, 2, 16), (2, 8, 2, 16), torch.bfloat16)]  # K/V: 2 heads
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(out, expected)


def test_decode_chunk_after_a_cache_is_bottom_right_causal(flash: FakeFlash) -> None:
    q, k, v = qkv(T=8)
    out = kernel.attend(q[:, :, -3:], k, v)  # the last 3 positions, attending to all 8
    assert kernel.last_kernel == "flash_attn"
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, full[:, :, -3:])


@pytest.mark.parametrize(
    ("shapes", "dtype", "reason", "backend"),
    [
        ({"d": 16, "d_v": 8}, torch.bfloat16, "unequal head dims q/k 16, v 8", "sdpa:math"),  # MLA
        ({"d": 288}, torch.bfloat16, "head dim 288 > 256", "sdpa:flash"),  # SDPA's CPU flash: any head dim
        ({}, torch.float32, "dtype torch.float32", "sdpa:flash"),
    ],
)
def test_what_flash_cannot_run_goes_to_sdpa(
    flash: FakeFlash, shapes: dict, dtype: torch.dtype, reason: str, backend: str
) -> None:
    q, k, v = qkv(dtype=dtype, **shapes)
    out = kernel.attend(q, k, v)
    assert kernel.last_kernel == backend and reason in kernel.last_reason and not flash.calls
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))


def test_a_forced_sdpa_backend_skips_flash_attn(flash: FakeFlash, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernel.BACKEND_ENV, "math")
    kernel.attend(*qkv())
    assert (kernel.last_kernel, kernel.last_reason) == ("sdpa:math", "forced by LRKV_SDPA_BACKEND=math")
    assert not flash.calls


def test_fp32_under_bf16_autocast_runs_flash_in_bf16(flash: FakeFlash) -> None:
    q, k, v = qkv(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = kernel.attend(q, k, v)
    assert kernel.last_kernel == "flash_attn" and flash.calls[0][3] == torch.bfloat16
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize("kind", KINDS)
def test_every_variant_dispatches_through_attend(flash: FakeFlash, kind: str) -> None:
    """Under bf16 autocast, as in training: a variant whose q/k and v head dims are equal (mha, mqa, gqa, lrkv,
    gta) runs flash-attn with its own number of K/V heads; mla (q/k head dim d_h + d_R, v head dim d_h) runs
    SDPA. Same logits either way."""
    model = Transformer(tiny_model(), attn(kind))
    d_qk, d_v = model.resolved.variant.score_dims(model.config, model.resolved.knobs)
    tokens = torch.randint(0, 128, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens)
        assert kernel.last_kernel == ("flash_attn" if d_qk == d_v else "sdpa:math")
        kernel.flash_attn_func = None  # the same model through SDPA
        reference = model(tokens)
    torch.testing.assert_close(logits, reference)
    kv_heads = {"mha": 4, "lrkv": 4, "gqa": 2, "mqa": 1, "gta": 2}  # tiny_model's defaults
    if d_qk != d_v:
        assert not flash.calls
    else:
        assert len(flash.calls) == 2  # one per layer
        assert all(call[1][2] == kv_heads[kind] for call in flash.calls)
