"""A training step's time on one GPU from first principles, and the MFU it implies: the targets
benchmarks/gpu.py prints and BENCHMARKS.md ("GPU") derives.

The step is benchmarks/gpu.py's (and a one-device fit's): the decoder under bf16 autocast, fp32 cross-entropy,
backward, gradient clipping, Muon for the block matrices and AdamW for the rest. Its work is counted, not
guessed: one decoder block's forward and backward, and the embedding, head and loss, are run under torch's
FakeTensorMode at the run's shapes, as a CUDA step runs them (costs/cuda_step.py's stand-in: SDPA's fused
kernels, the fused RMSNorm, CUDA autocast's fp32 ops), and every aten op is tallied:
- matrix products (mm, addmm, bmm, baddbmm): their FLOPs, as torch.utils.flop_counter counts them;
- SDPA's fused attention kernels, forward and backward: their FLOPs likewise (over the full T^2);
- every other op that moves data: the bytes it reads and writes. Eager, each is a kernel of its own that
  reads all its inputs from HBM and writes all its outputs. Compiled (each block torch.compile'd,
  lightning_modules/distributed/compile.py), a tensor is taken to cross HBM only where it must exist in
  memory: a matrix product's or attention kernel's input or output, a tensor saved for the backward, a
  parameter, the block's input and output; each such tensor is read or written once per pass (forward,
  backward) however many fused ops use it. That is perfect fusion between the matrix products: a bound
  Inductor approaches, not a count of its kernels. The embedding, head and loss are eager in both (only
  the blocks are compiled).
The optimiser is counted by formula (its ops run outside the traced step): bytes per parameter for clipping,
AdamW and Muon's momentum and update, and Newton-Schulz's matrix products per Muon matrix.

Time = the matrix products' FLOPs / (GEMM_EFFICIENCY x peak) + the attention kernels' FLOPs, halved for the
causal mask they skip, / (ATTENTION_EFFICIENCY x peak) + bytes / (HBM_EFFICIENCY x HBM bandwidth): each kernel
is either compute- or memory-bound, one at a time, with kernel launches hidden behind the device's work.
MFU = the step's FLOPs in counts.py's convention (the one `train/mfu` and benchmarks/gpu.py's `mfu` use) /
(peak x time).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from lightning_modules.core.fragments import fragment
from lightning_modules.costs.counts import train_flops_per_token
from lightning_modules.costs.cuda_step import Step
from lightning_modules.costs.fits import recipe_batch
from lightning_modules.model.attention import AttentionConfig, Resolved, as_resolved, load_configs
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.transformer import Transformer
from lightning_modules.optim.setup import OptimizerConfig, param_groups


@dataclass(frozen=True)
class Device:
    """One GPU's data-sheet rates: dense bf16 FLOP/s and HBM bytes/s."""

    name: str  # as torch.cuda.get_device_name reports it
    peak_flops: float
    hbm_bytes_per_s: float


# NVIDIA's H100 and H200 Tensor Core GPU data sheets (SXM): 989.4 dense bf16 TFLOP/s for both (the figure
# lightning_modules/training/throughput.py divides by), 3.35 TB/s of HBM3 and 4.8 TB/s of HBM3e.
H100 = Device("NVIDIA H100 80GB HBM3", 989.4e12, 3.35e12)
H200 = Device("NVIDIA H200", 989.4e12, 4.8e12)
DEVICES = {d.name: d for d in (H100, H200)}

# What a kernel reaches of the data sheet's rate (the assumptions; BENCHMARKS.md, "GPU", gives their sources):
# large bf16 GEMMs run at about 80 % of the dense peak on an H100 SXM (scripts/gpu/ceiling.py measures the
# device's own); FlashAttention-2, SDPA's flash kernel, at about 35 % forward and backward at head dim 128 and
# sequence 2K (300-360 TFLOP/s forward in FlashAttention-3's paper, arXiv 2407.08608; its backward is
# slower); and a streaming kernel at about 90 % of the HBM rate (the ceiling step's device copy measures it).
GEMM_EFFICIENCY = 0.80
ATTENTION_EFFICIENCY = 0.35
HBM_EFFICIENCY = 0.90
NS_STEPS = 5  # Newton-Schulz iterations per Muon matrix (lightning_modules/optim/muon.py's default)
# Optimiser bytes per parameter, fp32 state: clipping reads every gradient and scales it in place (4 + 8);
# AdamW reads the parameter, gradient and two moments and writes three of them (28); Muon reads the gradient
# and momentum and writes the momentum (12), reads the bf16 orthogonalised update and reads and writes the
# parameter (2 + 8).
CLIP_BYTES, ADAMW_BYTES, MUON_BYTES = 12, 28, 22

aten = torch.ops.aten
_GEMMS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm}
_ATTENTION = {
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_cudnn_attention,
    aten._scaled_dot_product_cudnn_attention_backward,
}
# Ops that allocate or describe but move no data.
_FREE = {
    aten.empty,
    aten.empty_like,
    aten.empty_strided,
    aten.new_empty,
    aten.new_empty_strided,
    aten._fused_sdp_choice,
    aten.detach,
    aten.lift_fresh,
    aten.sym_size,
    aten.sym_stride,
    aten.sym_numel,
    aten.is_same_size,
}


def _nbytes(t: torch.Tensor) -> int:
    """What reading `t` moves: its elements, or its storage where a broadcast view repeats it."""
    return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


@dataclass
class Work:
    """One traced part's work: FLOPs of its matrix products and attention kernels, and its memory-bound
    bytes eager and fused."""

    gemm_flops: float = 0.0
    attention_flops: float = 0.0
    eager_bytes: int = 0
    fused_bytes: int = 0

    def __sub__(self, other: Work) -> Work:
        return Work(
            *(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True))
        )


class _Tally(TorchDispatchMode):
    """Each aten op of one pass: its category and the storages it reads and writes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, list[torch.Tensor], list[torch.Tensor]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if func.namespace != "aten" or packet in _FREE or func.is_view:
            return out
        kind = "gemm" if packet in _GEMMS else "attention" if packet in _ATTENTION else "memory"
        self.ops.append((kind, _tensors((args, kwargs)), _tensors(out)))
        return out


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _work(passes: list[_Tally], flops: dict[str, float], materialized: set[int]) -> Work:
    """The memory-bound bytes of the tallied passes, eager and fused, with the FLOPs counted beside them."""
    work = Work(gemm_flops=flops["gemm"], attention_flops=flops["attention"])
    boundary = set(materialized)
    for tally in passes:
        for kind, inputs, outputs in tally.ops:
            if kind != "memory":
                boundary.update(_key(t) for t in (*inputs, *outputs))
    for tally in passes:  # fused: a boundary tensor once per pass and direction
        read: set[int] = set()
        written: set[int] = set()
        for kind, inputs, outputs in tally.ops:
            if kind != "memory":
                continue
            work.eager_bytes += sum(_nbytes(t) for t in (*inputs, *outputs))
            for seen, tensors in ((read, inputs), (written, outputs)):
                for t in tensors:
                    if _key(t) in boundary and _key(t) not in seen:
                        seen.add(_key(t))
                        work.fused_bytes += _nbytes(t)
    return work


def _flops_by_kind(counter: FlopCounterMode) -> dict[str, float]:
    counts = counter.get_flop_counts()["Global"]
    attention = sum(v for op, v in counts.items() if op in _ATTENTION)
    return {"gemm": sum(counts.values()) - attention, "attention": attention}


_TRACED: dict[tuple[str, str, int], tuple[Work, Work]] = {}


def traced(model: ModelConfig, attention: Resolved, micro_batch: int) -> tuple[Work, Work]:
    """traced_work, once per model, attention and micro-batch (configs are not hashable: keyed by repr)."""
    key = (repr(model), repr(attention.config), micro_batch)
    if key not in _TRACED:
        _TRACED[key] = traced_work(model, attention, micro_batch)
    return _TRACED[key]


def traced_work(model: ModelConfig, attention: Resolved, micro_batch: int) -> tuple[Work, Work]:
    """(one decoder block's work, the embedding's, head's and loss's), forward and backward of one
    micro-batch, traced as a CUDA bf16-mixed step (module docstring)."""
    one_layer = dataclasses.replace(model, n_layer=1)
    B, T = micro_batch, model.seq_len
    with FakeTensorMode(allow_non_fake_inputs=False):
        net = Transformer(one_layer, attention)
        params = {_key(p) for p in net.parameters()}
        tokens = torch.zeros(B, T + 1, dtype=torch.long)
        x = torch.zeros(B, T, model.d_model, requires_grad=True)
        # Every tensor the tallies saw stays referenced until the end: a storage is known by its address,
        # which a freed one would hand on to the next.
        kept: list[Any] = []

        def run(part: Any) -> tuple[Work, dict[str, float]]:
            forward, backward, counter = _Tally(), _Tally(), FlopCounterMode(display=False)
            saved: list[torch.Tensor] = []

            def pack(t: torch.Tensor) -> torch.Tensor:
                saved.append(t)
                return t

            with Step("cuda"), counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                with forward, torch.autocast("cpu", dtype=torch.bfloat16):
                    out = part()
                with backward:
                    out.backward(torch.ones_like(out))
            kept.extend([forward, backward, saved, out])
            flops = _flops_by_kind(counter)
            boundary = params | {_key(t) for t in (*saved, x, out)}
            return _work([forward, backward], flops, boundary), flops

        block, _ = run(lambda: net.blocks[0](x, net.rope))
        whole, _ = run(
            lambda: F.cross_entropy(
                net(tokens[:, :-1]).flatten(0, 1).float(), tokens[:, 1:].flatten(), reduction="sum"
            )
        )
    return block, whole - block


def optimizer_work(model: ModelConfig, attention: Resolved) -> tuple[float, int]:
    """(Newton-Schulz FLOPs, optimiser bytes) of one step, one device (the constants above)."""
    with torch.device("meta"):
        net = Transformer(model, attention)
    groups, blocks = param_groups(net, OptimizerConfig(name="muon"))
    flops, moved = 0.0, 0
    for group in groups:
        for p in group["params"]:
            moved += (CLIP_BYTES + (MUON_BYTES if group["use_muon"] else ADAMW_BYTES)) * p.numel()
            if not group["use_muon"]:
                continue
            cols = p.shape[-1]
            for rows in blocks.get(p, (p.shape[0],)) * (p.shape[0] if p.ndim == 3 else 1):
                m, n = min(rows, cols), max(rows, cols)
                flops += NS_STEPS * (4 * m * m * n + 2 * m**3)  # X X^T, (X X^T)^2, then B X: per iteration
    return flops, moved


@dataclass(frozen=True)
class StepEstimate:
    """One step's estimated time by part (seconds) and the MFU it implies."""

    size: str
    attention: str
    micro_batch: int
    compiled: bool
    device: str
    model_flops: float  # counts.py's training FLOPs of the step: MFU's numerator
    gemm_flops: float  # matrix products as run, the optimiser's Newton-Schulz included
    attention_flops: float  # attention kernels, full T^2
    memory_bytes: float  # memory-bound bytes: elementwise and reductions, the loss, the optimiser
    gemm_s: float
    attention_s: float
    memory_s: float

    @property
    def step_s(self) -> float:
        return self.gemm_s + self.attention_s + self.memory_s

    @property
    def mfu(self) -> float:
        return self.model_flops / (DEVICES[self.device].peak_flops * self.step_s)

    def arithmetic(self) -> str:
        """The estimate as one line of arithmetic (BENCHMARKS.md prints these)."""
        mode = "compiled" if self.compiled else "eager"
        return (
            f"{self.size} {self.attention} {mode}, micro-batch {self.micro_batch}: "
            f"GEMMs {self.gemm_flops / 1e12:.1f} TFLOP in {self.gemm_s * 1e3:.1f} ms + attention "
            f"{self.attention_flops / 1e12:.1f} TFLOP in {self.attention_s * 1e3:.1f} ms + "
            f"{self.memory_bytes / 1e9:.1f} GB in {self.memory_s * 1e3:.1f} ms = {self.step_s * 1e3:.1f} ms; "
            f"MFU {self.model_flops / 1e12:.1f} TFLOP / {self.step_s * 1e3:.1f} ms = {self.mfu:.1%}"
        )


def estimate(
    model: ModelConfig,
    attention: AttentionConfig | Resolved,
    micro_batch: int,
    compiled: bool,
    device: Device = H100,
) -> StepEstimate:
    resolved = as_resolved(model, attention)
    block, ends = traced(model, resolved, micro_batch)
    ns_flops, optimizer_bytes = optimizer_work(model, resolved)
    L, tokens = model.n_layer, micro_batch * model.seq_len
    gemm = L * block.gemm_flops + ends.gemm_flops + ns_flops
    attn = L * block.attention_flops + ends.attention_flops
    moved = L * (block.fused_bytes if compiled else block.eager_bytes) + ends.eager_bytes + optimizer_bytes
    return StepEstimate(
        size=model.name,
        attention=resolved.config.label(),
        micro_batch=micro_batch,
        compiled=compiled,
        device=device.name,
        model_flops=train_flops_per_token(model, resolved, tokens) * tokens,
        gemm_flops=gemm,
        attention_flops=attn,
        memory_bytes=moved,
        gemm_s=gemm / (GEMM_EFFICIENCY * device.peak_flops),
        attention_s=attn / 2 / (ATTENTION_EFFICIENCY * device.peak_flops),  # the causal half is skipped
        memory_s=moved / (HBM_EFFICIENCY * device.hbm_bytes_per_s),
    )


@functools.cache
def target(
    size: str,
    compiled: bool,
    kind: str = "mha",
    micro_batch: int | None = None,
    seq_len: int | None = None,
    device_name: str | None = None,
) -> StepEstimate:
    """The first-principles estimate for a size (conf/model/<size>.yaml) and attention, at the recipe's
    micro-batch (conf/recipe/<size>.yaml) unless given, on the named device (H100 SXM's figures for a name
    not in DEVICES)."""
    model, attention = load_configs([fragment("model", size), fragment("attention", kind)])
    if seq_len:
        model = dataclasses.replace(model, seq_len=seq_len)
    device = DEVICES.get(device_name or "", H100)
    return estimate(model, attention, micro_batch or recipe_batch(size)[0], compiled, device)
