"""A CUDA training step's saved tensors, traced on the CPU: the stand-in that lightning_modules/costs/memory.py
runs the decoder under when it plans for a GPU (Setup.device "cuda"). Why a stand-in and what it changes are in
the comment below; docs/costs.md, "Memory plan", lists the kernel each attention gets."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# ----- a CUDA step, traced on the CPU ---------------------------------------------------------------------
# FakeTensorMode cannot fake CUDA tensors through autograd on a CPU-only torch (it aborts), so a CUDA plan
# traces CPU fakes under CPU autocast and changes the three things a CUDA run does differently:
# 1. SDPA's kernel. On a CPU, unequal head dims (MLA) take SDPA's math path, which saves fp32 (B, H, T, T)
#    probabilities; CUDA picks by its own rules (sdpa_cuda_kernel) and the fused kernels save only q, k, v,
#    the output, the fp32 log-sum-exp and the philox seed and offset. The stand-in calls the CUDA op itself
#    (aten._scaled_dot_product_flash_attention / _efficient_attention): FakeTensorMode runs the op's meta
#    kernel and its real autograd node saves what the CUDA kernel's backward reads, exactly.
# 2. Autocast's fp32 list. CUDA autocast runs these ops in fp32 (ATen/autocast_mode.h, AT_FORALL_FP32 and
#    AT_FORALL_FP32_SET_OPT_DTYPE); CPU autocast does not, so the CPU trace would keep their bf16 inputs.
#    The decoder reaches two: rms_norm (the QK-norm and MLA's latent norms see bf16 projections) and pow
#    (ReLU^2: Tensor.square is pow(x, 2) underneath, where CUDA autocast catches it).
# 3. RMSNorm's kernel. On a CPU rms_norm is a composite of pow, mean, rsqrt and two products, whose backward
#    keeps the normalised input too; on CUDA it calls the fused aten._fused_rms_norm (ATen's
#    _fused_rms_norm_cuda), whose backward reads only the input, the fp32 rstd and the weight (_FusedRMSNorm).
# The header's lists as written there (square added: it is pow underneath), one string for compactness.
_HEADER_FP32 = (
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow square softplus "
    "layer_norm rms_norm group_norm cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss "
    "hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss "
    "multilabel_margin_loss soft_margin_loss triplet_margin_loss multi_margin_loss "
    "binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp"
)
_CUDA_FP32_OPS = tuple(_HEADER_FP32.split())
# these get dtype=fp32 instead of a cast (AT_FORALL_FP32_SET_OPT_DTYPE)
_CUDA_FP32_DTYPE_OPS = ("prod", "softmax", "log_softmax", "cumprod", "cumsum", "sum")


def _functions(names: tuple[str, ...]) -> set[Any]:
    found = {getattr(m, n) for m in (torch, torch.Tensor, F) for n in names if hasattr(m, n)}
    return found | ({torch.Tensor.__pow__, torch.Tensor.__rpow__} if "pow" in names else set())


_FP32_CAST = _functions(_CUDA_FP32_OPS)
_FP32_DTYPE = _functions(_CUDA_FP32_DTYPE_OPS)
_FP32_OPS = _FP32_CAST | _FP32_DTYPE
_LOW = (torch.float16, torch.bfloat16)
# SDPA's memory-efficient kernel and grouped heads: the installed torch documents GQA on CUDA for flash
# and math only (torch.nn.functional.scaled_dot_product_attention's docstring), so fp32 GQA/MQA takes math.
EFFICIENT_TAKES_GROUPED_HEADS = False


def sdpa_cuda_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: bool, causal: bool) -> str:
    """The SDPA backend a CUDA GPU of compute capability 8.0 to 12.1 runs for these (already cast) inputs
    under torch's default order, flash > memory-efficient > math (ATen's transformers/cuda/sdp_utils.cpp):
    flash needs fp16/bf16, no mask, equal q/k/v head dims <= 256 and a square causal mask; efficient needs
    q and k head dims equal and both head dims a multiple of the GEMM alignment (8 for fp16/bf16, 4 for
    fp32 on sm80+). Where torch prefers cuDNN (sm90 with cuDNN > 9.15), cuDNN takes what flash takes and
    saves the same bytes (its log-sum-exp is (B, H, T, 1)) but for its seeds, 8 bytes fewer."""
    grouped = q.shape[-3] != k.shape[-3]
    dq, dk, dv = q.shape[-1], k.shape[-1], v.shape[-1]
    half = q.dtype in _LOW
    if half and not masked and dq == dk == dv <= 256 and (not causal or q.shape[-2] == k.shape[-2]):
        return "flash"
    align = 8 if half else 4
    if dq == dk and dq % align == 0 and dv % align == 0 and (EFFICIENT_TAKES_GROUPED_HEADS or not grouped):
        return "efficient"
    return "math"


class _FusedRMSNorm(torch.autograd.Function):
    """aten._fused_rms_norm as a CUDA step runs it: saves the input, the rstd (fp32, the input's leading dims
    and 1 for each normalised one, as aten's own decomposition of the op returns it) and the weight."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, dims: int) -> torch.Tensor:
        rstd = x.new_empty((*x.shape[: x.ndim - dims], *([1] * dims)), dtype=torch.float32)
        ctx.save_for_backward(x, rstd, weight)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # never run by the plan
        x, _, weight = ctx.saved_tensors
        return torch.zeros_like(x), None if weight is None else torch.zeros_like(weight), None


class Step(TorchFunctionMode):
    """A traced step on `device`: on "cuda", inside the CPU trace, what a CUDA step does differently (the
    comment above); on "cpu", the trace as it runs. `kernels` collects the SDPA backend of every call.
    Inside __torch_function__ the mode is off, so the calls below run plainly."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.cuda = device == "cuda"
        self.kernels: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            if self.cuda:
                return self._attention(*args, **kwargs)
            out = func(*args, **kwargs)
            self.kernels.append(kernel_of(out))
            return out
        if self.cuda and func in (F.rms_norm, torch.rms_norm):
            return self._rms_norm(*args, **kwargs)
        if self.cuda and func in _FP32_OPS and torch.is_autocast_enabled("cpu"):  # CUDA's autocast here
            low = any(isinstance(a, torch.Tensor) and a.dtype in _LOW for a in (*args, *kwargs.values()))
            if low:
                with torch.autocast("cpu", enabled=False):
                    if func in _FP32_DTYPE:
                        return func(*args, **{"dtype": torch.float32, **kwargs})
                    return func(*_fp32(args), **_fp32(kwargs))
        return func(*args, **kwargs)

    def _rms_norm(
        self,
        x: torch.Tensor,
        normalized_shape: Any,
        weight: torch.Tensor | None = None,
        eps: float | None = None,
    ) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):  # rms_norm is on CUDA autocast's fp32 list
            x, weight = _fp32(x), _fp32(weight)
        return _FusedRMSNorm.apply(x, weight, len(normalized_shape))

    def _attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):  # CUDA autocast's cast of SDPA's inputs (none for bf16 ones)
            q, k, v = (t.to(torch.bfloat16) if t.dtype == torch.float32 else t for t in (q, k, v))
        kernel = sdpa_cuda_kernel(q, k, v, attn_mask is not None, is_causal)
        self.kernels.append(kernel)
        aten = torch.ops.aten
        with torch.autocast("cpu", enabled=False):  # autocast does not reach inside SDPA on CUDA either
            if kernel == "flash":  # padded to a multiple of 8 first, as SDPA does (ATen's attention.cpp)
                d = q.shape[-1]
                pad = -d % 8
                q, k, v = (F.pad(t, (0, pad)) if pad else t for t in (q, k, v))
                scale = scale if scale is not None else 1.0 / math.sqrt(d)
                out = aten._scaled_dot_product_flash_attention(
                    q, k, v, dropout_p, is_causal, False, scale=scale
                )[0]
                return out[..., :d] if pad else out
            if kernel == "efficient":
                return aten._scaled_dot_product_efficient_attention(
                    q, k, v, attn_mask, True, dropout_p, is_causal, scale=scale
                )[0]
            return aten._scaled_dot_product_attention_math(
                q, k, v, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
            )[0]


def kernel_of(out: torch.Tensor) -> str:
    """The SDPA backend that made `out`, read from its autograd node: a fused kernel's own node, or the
    math path's composite ops. (torch._fused_sdp_choice cannot say: under FakeTensorMode it answers math
    where the CPU dispatch takes flash.)"""
    node = type(out.grad_fn).__name__ if out.grad_fn is not None else ""
    return "flash" if "FlashAttention" in node else "efficient" if "EfficientAttention" in node else "math"


def _fp32(values: Any) -> Any:
    """Autocast's fp32 cast: fp16/bf16 tensors (also inside lists, tuples, dict values) become fp32."""
    if isinstance(values, torch.Tensor):
        return values.float() if values.dtype in _LOW else values
    if isinstance(values, (list, tuple)):
        return type(values)(_fp32(v) for v in values)
    if isinstance(values, dict):
        return {k: _fp32(v) for k, v in values.items()}
    return values
