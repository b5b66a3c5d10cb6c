"""The one place that chooses the attention kernel, separately from the attention variant (docs/attentions.md).

Every variant hands `attend` queries, keys and values in (B, heads, T, dim) layout; keys and values may have
fewer heads than queries (grouped KV heads, H % G == 0) and values may have a different head dim than
queries and keys (MLA). flash-attn (`pip install .[flash]`) runs when it is installed and usable: a CUDA
tensor on an Ampere or newer GPU, fp16/bf16 (directly, or fp32 under an fp16/bf16 autocast, which is what
SDPA would compute in too), equal q/k/v head dims of at most 256 (flash-attn 2's `flash_attn_func`). It
takes grouped KV heads natively. Everything else, MLA's unequal q/k and v head dims included, goes to
torch's scaled_dot_product_attention with `enable_gqa`; so K/V are never repeated in memory on either path.

"sdpa" alone would hide which of SDPA's own backends ran (flash, memory-efficient, cuDNN, math; on a CPU:
flash or math), and MLA's unequal head dims keep it off SDPA's flash backend while the other variants run it.
So each SDPA call first asks SDPA's own dispatcher, `torch._fused_sdp_choice` (the function
F.scaled_dot_product_attention itself calls, with its priority order and the enabled backends), which
backend these very arguments get: 1 to 4 us on a CPU, so it runs on every call, decode steps included.
`LRKV_SDPA_BACKEND=flash|efficient|cudnn|math` forces one backend (torch.nn.attention.sdpa_kernel around the
call, flash-attn skipped); `auto` (or unset) lets SDPA choose. A forced backend that cannot run these
arguments is a ConfigError naming SDPA's reasons.

`last_kernel` and `last_reason` record what the latest call ran and why: "flash_attn" (the flash-attn
package), "sdpa:flash", "sdpa:efficient", "sdpa:cudnn", "sdpa:math" or, inside torch.compile (where the
backend is fixed when the graph is traced), "sdpa:compiled". `kernels_seen` gathers every kernel (and its
reason) since the last `forget()`, so that training can log all of a step's (LanguageModel tags its MLflow
run with `attention_kernel` and `attention_kernel_reason` after the first training step).
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from lightning_modules.core.errors import ConfigError

try:  # optional extra: pip install .[flash] on CUDA machines
    from flash_attn import flash_attn_func  # type: ignore[import-not-found]
except ImportError:  # flash-attn cannot be built without CUDA
    flash_attn_func = None

FLASH_MAX_HEAD_DIM = 256
FLASH_MIN_CAPABILITY = (8, 0)  # flash-attn 2: Ampere, Ada, Hopper

BACKEND_ENV = "LRKV_SDPA_BACKEND"
# What LRKV_SDPA_BACKEND may name, and the SDPA backend each forces.
FORCEABLE: dict[str, SDPBackend] = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
RECORDED: dict[SDPBackend, str] = {
    **{backend: f"sdpa:{name}" for name, backend in FORCEABLE.items()},
    SDPBackend.OVERRIDEABLE: "sdpa:overrideable",  # a device extension's own kernel
}

# The kernel the latest call used ("flash_attn" or "sdpa:<backend>") and why, so that training and the
# benchmarks can say which one ran; kernels_seen: every kernel since forget(), with its latest reason.
COMPILED = "sdpa:compiled"
last_kernel: str = "none"
last_reason: str = "no call yet"
kernels_seen: dict[str, str] = {}
# Why the calls inside torch.compile'd code ran "sdpa:compiled" (empty: none since forget()). Kept apart from
# kernels_seen: compiled code only stores plain strings into globals, which Dynamo replays after the graph
# without guarding on them; reading or mutating kernels_seen there would make it guard on the dict's length and
# recompile every compiled block whenever an eager call records another kernel.
compiled_reason: str = ""


def forget() -> None:
    """Start a new record (LanguageModel calls it before the first training step)."""
    global last_kernel, last_reason, compiled_reason
    last_kernel, last_reason, compiled_reason = "none", "no call yet", ""
    kernels_seen.clear()


def summary() -> tuple[str, str]:
    """Every kernel since forget() as one string ("sdpa:flash", or "sdpa:flash+sdpa:math" when calls
    differed), and why: the reason, or each kernel's reason after its name."""
    seen = {**kernels_seen, **({COMPILED: compiled_reason} if compiled_reason else {})}
    if not seen:
        return last_kernel, last_reason
    if len(seen) == 1:
        return next(iter(seen.items()))
    names = sorted(seen)
    return "+".join(names), "; ".join(f"{name}: {seen[name]}" for name in names)


def _record_compiled(reason: str) -> None:
    """_record for a call being traced by torch.compile: stores only (see compiled_reason)."""
    global last_kernel, last_reason, compiled_reason
    last_kernel, last_reason, compiled_reason = COMPILED, reason, reason


def _record(kernel: str, reason: str) -> None:
    global last_kernel, last_reason
    last_kernel, last_reason = kernel, reason
    kernels_seen[kernel] = reason


def forced_backend() -> SDPBackend | None:
    """The backend LRKV_SDPA_BACKEND forces, or None for auto (unset, empty or "auto"). Read on every call
    (under torch.compile: when the graph is traced)."""
    return _parse_backend(os.environ.get(BACKEND_ENV, ""))


def _parse_backend(value: str) -> SDPBackend | None:
    name = value.strip().lower()
    if name in ("", "auto"):
        return None
    if name not in FORCEABLE:
        raise ConfigError(
            f"{BACKEND_ENV}={value!r} is not an SDPA backend; use one of auto, {', '.join(FORCEABLE)}"
        )
    return FORCEABLE[name]


def backend_name(backend: SDPBackend) -> str:
    return next((name for name, b in FORCEABLE.items() if b == backend), backend.name.lower())


def flash_device(t: Tensor) -> bool:
    """Whether t lives on a GPU that flash-attn 2 supports."""
    return t.is_cuda and torch.cuda.get_device_capability(t.device) >= FLASH_MIN_CAPABILITY


def compute_dtype(t: Tensor) -> torch.dtype:
    """The dtype attention runs in: t's own, or the autocast dtype when autocast would lower t's fp32."""
    if t.dtype == torch.float32 and torch.is_autocast_enabled(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return t.dtype


def flash_unusable_reason(q: Tensor, k: Tensor, v: Tensor) -> str | None:
    """None when flash-attn can run this call, else why not."""
    if flash_attn_func is None:
        return "flash-attn not installed"
    if not flash_device(q):
        return f"device {q.device} is not a CUDA GPU of compute capability >= 8.0"
    if compute_dtype(q) not in (torch.float16, torch.bfloat16):
        return f"dtype {compute_dtype(q)} (flash-attn needs fp16 or bf16)"
    if not q.shape[-1] == k.shape[-1] == v.shape[-1]:
        return f"unequal head dims q/k {q.shape[-1]}, v {v.shape[-1]}"
    if q.shape[-1] > FLASH_MAX_HEAD_DIM:
        return f"head dim {q.shape[-1]} > {FLASH_MAX_HEAD_DIM}"
    return None


def flash_usable(q: Tensor, k: Tensor, v: Tensor) -> bool:
    return flash_unusable_reason(q, k, v) is None


def attend(q: Tensor, k: Tensor, v: Tensor, causal: bool = True, scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale + causal mask) v.

    q: (B, H, Tq, d_qk); k: (B, G, Tk, d_qk); v: (B, G, Tk, d_v) with H % G == 0. Returns (B, H, Tq, d_v).
    With Tq < Tk (decoding after a prefill) the causal mask is aligned to the end: query i sees keys
    0 .. Tk - Tq + i.
    """
    Tq, Tk = q.shape[2], k.shape[2]
    forced = forced_backend()
    reason = (
        flash_unusable_reason(q, k, v)
        if forced is None
        else f"forced by {BACKEND_ENV}={backend_name(forced)}"
    )
    if reason is None:
        _record("flash_attn", "installed and usable")
        dtype = compute_dtype(q)  # flash-attn is not an autocast op: cast as autocast would for SDPA
        # flash-attn wants (B, T, heads, dim) and takes G < H natively; its causal mask is bottom-right
        # aligned (flash-attn >= 2.1), which is what decoding needs.
        out = flash_attn_func(
            q.transpose(1, 2).to(dtype),
            k.transpose(1, 2).to(dtype),
            v.transpose(1, 2).to(dtype),
            causal=causal,
            softmax_scale=scale,
        )
        return out.transpose(1, 2)
    if torch.is_autocast_enabled(q.device.type):
        # The same casts autocast would make inside SDPA, made here so that the backend is chosen (and
        # recorded) for the dtype that runs: SDPA's dispatcher alone does not see autocast's dtype.
        q, k, v = q.to(compute_dtype(q)), k.to(compute_dtype(k)), v.to(compute_dtype(v))
    grouped = q.shape[1] != k.shape[1]
    if Tq == 1 and grouped:
        # A decode step: the H / G query heads sharing a kv head become H / G query rows of that head, so SDPA
        # never expands K/V to H heads (on CPU at S = 4096: 2x faster for MQA, 8x for MLA's absorbed latent).
        # Head h reads kv head h // (H / G), so consecutive heads form a group: (B, H, 1, d) -> (B, G, H/G, d).
        B, H, _, d = q.shape
        G = k.shape[1]
        out = sdpa(q.reshape(B, G, H // G, d), k, v, forced, reason, scale=scale)
        return out.reshape(B, H, 1, v.shape[-1])
    if not causal or Tq == 1:
        return sdpa(q, k, v, forced, reason, scale=scale, enable_gqa=grouped)
    if Tq == Tk:
        return sdpa(q, k, v, forced, reason, is_causal=True, scale=scale, enable_gqa=grouped)
    # SDPA's is_causal is top-left aligned; build the bottom-right mask for a chunk after a cache.
    mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(diagonal=Tk - Tq)
    return sdpa(q, k, v, forced, reason, attn_mask=mask, scale=scale, enable_gqa=grouped)


def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    forced: SDPBackend | None,
    why: str,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """F.scaled_dot_product_attention, recording the backend it runs (`why`: why not flash-attn), with only
    `forced` enabled when one is forced."""
    only = sdpa_kernel([forced]) if forced is not None else contextlib.nullcontext()
    with only:
        if torch.compiler.is_compiling():  # the dispatcher cannot be asked while tracing
            _record_compiled(f"{why}; torch.compile fixes the SDPA backend when it traces the graph")
        else:
            backend = sdpa_backend(q, k, v, forced, attn_mask, is_causal, scale, enable_gqa)
            kernel = RECORDED.get(backend) or f"sdpa:{backend.name.lower()}"
            _record(kernel, why if forced is not None else f"{why}; chosen by SDPA's dispatch")
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )


def sdpa_backend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    forced: SDPBackend | None,
    attn_mask: Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> SDPBackend:
    """The backend F.scaled_dot_product_attention will run for these arguments under the backends enabled
    now: its own dispatcher's answer. A forced backend that cannot run them is a ConfigError with SDPA's
    reasons (SDPA warns them, then raises "No available kernel")."""
    args = (q, k, v, attn_mask, 0.0, is_causal)
    if forced is None:  # SDPA's math backend takes anything: the dispatcher always has an answer
        return SDPBackend(torch._fused_sdp_choice(*args, scale=scale, enable_gqa=enable_gqa))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # SDPA's reasons come as warnings; collect them, every time
        try:
            choice = SDPBackend(torch._fused_sdp_choice(*args, scale=scale, enable_gqa=enable_gqa))
            failure = "SDPA's dispatcher found no backend"
        except RuntimeError as exc:
            choice, failure = SDPBackend.ERROR, str(exc)
    if choice != SDPBackend.ERROR:
        return choice
    said = "; ".join(r for r in (_reason(str(w.message)) for w in caught) if r) or _reason(failure)
    if q.device.type == "cpu" and forced not in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
        said = "on a CPU SDPA has only its flash and math backends"  # SDPA's own words blame switches
    name = backend_name(forced)
    raise ConfigError(
        f"{BACKEND_ENV}={name}: SDPA's {name} backend cannot run this attention call (q {tuple(q.shape)}, "
        f"k {tuple(k.shape)}, v {tuple(v.shape)}, {q.dtype} on {q.device.type}): {said}. "
        f"Unset {BACKEND_ENV} (or set it to auto) to let SDPA choose, or force another backend"
    )


def _reason(message: str) -> str:
    """One of SDPA's reasons without its C++ location; empty for a heading ("... not used because:")."""
    text = message.split(" (Triggered internally at")[0].strip()
    return "" if text.endswith(":") else " ".join(text.split()).rstrip(".")


def masked_softmax(scores: Tensor, causal: bool = True) -> Tensor:
    """softmax over the last dim of (B, H, Tq, Tk) scores, in fp32 (or wider for wider scores), with the causal mask aligned to the end as
    in `attend` (query i sees keys 0 .. Tk - Tq + i)."""
    Tq, Tk = scores.shape[-2], scores.shape[-1]
    if causal and Tq > 1:
        mask = torch.ones(Tq, Tk, dtype=torch.bool, device=scores.device).tril(diagonal=Tk - Tq)
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))


def attention_probs(q: Tensor, k: Tensor, scale: float, causal: bool = True) -> Tensor:
    """softmax(q k^T * scale + causal mask) as an explicit (B, H, Tq, Tk) tensor, for decode paths that mix
    values themselves (LRKV's absorbed values, docs/attentions.md). q: (B, H, Tq, d); k: (B, H, Tk, d). The causal
    mask is aligned to the end, as in `attend`. The softmax runs in fp32 and returns q's dtype."""
    return masked_softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, causal).to(q.dtype)
