"""Per-rank memory plan of one training step: parameters, gradients, optimiser state, activations and the
largest transient, from the config alone, without allocating anything.

What each term is (bytes per rank):
- parameters: the fp32 master weights this rank holds: all of them, or under FSDP its dim-0 shard of each
  parameter, padded to ceil(rows / shard ranks) as FSDP2 stores it (lightning_modules/distributed/parallel.py).
- gradients: fp32, the same shapes as the parameters. DDP also keeps its reducer's buckets, a second copy.
- optimiser state (lightning_modules/optim/muon.py): Muon's momentum (one fp32 copy) for the block
  matrices; AdamW's two moments for the embedding, the head and the gains (everything under "adamw").
- activations: what autograd saves in the forward for the backward. Not a formula: the decoder's own forward
  is run once per part (one block, and a one-block model for the embedding, final norm, head and loss) under
  torch's FakeTensorMode at the run's shapes, dtypes and autocast, and every saved tensor that is not a
  parameter is counted once per storage. So each attention and training path is counted as the code runs
  it, at 6.3b as at nano, in a second. The trace runs on CPU fakes; for a CUDA step (Setup.device, the
  default) it runs what CUDA runs instead: SDPA's fused kernels, the fused RMSNorm, CUDA autocast's fp32
  ops ("a CUDA step" below, docs/costs.md). With activation checkpointing a block keeps only its input; its
  saved tensors come back one block at a time in the backward (part of the block transient).
- transient (the largest short-lived allocation): one chunk of the loss (lightning_modules/model/loss.py: a
  chunk's fp32 logits with a temporary or their gradient, and under bf16 autocast on one device the head
  weight's bf16 copy; the loss keeps its two gradients, counted with the activations), a block's
  backward (about 4x its largest saved tensor, plus its recomputed activations under checkpointing, plus
  under FSDP the block's unsharded fp32 gradients and, from the second block's backward on, the previous
  block's reduce-scatter input), under FSDP the gathered weights (the root's head and norm stay gathered
  from forward to backward; the running block's weights and the next block's all-gather output, which
  FSDP2 copies into the parameters when that block starts and then frees), and the optimiser step (a
  Muon matrix gathered whole in fp32 under FSDP, its Newton-Schulz iterates in bf16).

The peak is parameters + optimiser state + the largest of three moments of the step: the loss and the
start of the backward (all activations + the loss's chunk or a block's backward + gathered weights), the end of the backward (all gradients
+ a block's backward + gathered weights) and the optimiser step (all gradients + its transient). At small
sizes its CPU plan (device="cpu") is checked against the peak the CPU allocator reaches (benchmarks/memory_plan.py,
tests/costs/test_memory.py): within 15 %, single process and each of 2 FSDP ranks. What it leaves out: the CUDA
context and allocator fragmentation (leave ~5-10 % headroom on a GPU), NCCL buffers, the data loader.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lightning_modules.core.errors import ConfigError
from lightning_modules.costs.cuda_step import Step
from lightning_modules.model import loss
from lightning_modules.model.attention import AttentionConfig, Resolved, as_resolved
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.transformer import Transformer
from lightning_modules.optim.setup import OptimizerConfig, param_groups

STRATEGIES = ("single", "ddp", "fsdp", "hybrid")
PRECISIONS = ("32-true", "bf16-mixed")
OPTIMIZERS = ("muon", "adamw")
DEVICES = ("cuda", "cpu")  # what the step runs on: the saved tensors differ (see "a CUDA step" below)
FP32 = 4
BF16 = 2


@dataclass(frozen=True)
class Setup:
    """How a run is spread and batched. world: ranks in all; nodes: for "hybrid" (shards within a node).
    micro_batch: sequences per rank per forward. device: "cuda" plans the GPU step (its SDPA kernels and its
    autocast), "cpu" the CPU step that benchmarks/memory_plan.py measures."""

    strategy: str = "single"
    world: int = 1
    nodes: int = 1
    micro_batch: int = 1
    precision: str = "bf16-mixed"
    activation_checkpointing: bool = False
    optimizer: str = "muon"
    reshard_after_forward: bool = True
    device: str = "cuda"

    def __post_init__(self) -> None:
        for name, allowed in (
            ("strategy", STRATEGIES),
            ("precision", PRECISIONS),
            ("optimizer", OPTIMIZERS),
            ("device", DEVICES),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"memory plan: {name}={getattr(self, name)!r}; allowed: {', '.join(allowed)}"
                )
        if self.world < 1 or self.micro_batch < 1 or self.nodes < 1:
            raise ConfigError("memory plan: world, nodes and micro_batch must be >= 1")
        if self.strategy == "single" and self.world != 1:
            raise ConfigError(f"memory plan: strategy 'single' runs on one rank, got world={self.world}")
        if self.strategy == "hybrid" and self.world % self.nodes:
            raise ConfigError(f"memory plan: world {self.world} is not a multiple of {self.nodes} nodes")

    @property
    def shard_ranks(self) -> int:
        """Ranks a parameter is split over: all (fsdp), those of a node (hybrid), none (single, ddp)."""
        return {"fsdp": self.world, "hybrid": self.world // self.nodes}.get(self.strategy, 1)

    @property
    def sharded(self) -> bool:
        return self.strategy in ("fsdp", "hybrid")


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per rank. `transient` is the largest short-lived term and `transient_kind` says which one;
    `peak` is the plan's peak of a step (module docstring); `attention_kernel` is the SDPA backend the
    plan's attention runs on `device` (flash, efficient or math)."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int
    transient: int
    transient_kind: str
    peak: int
    peak_at: str
    terms: dict[str, int]
    device: str = "cuda"
    attention_kernel: str = "flash"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ----- the decoder's shapes, on the meta device ------------------------------------------------------------
def _meta_model(model: ModelConfig, attention: Resolved) -> torch.nn.Module:
    with torch.device("meta"):
        return Transformer(model, attention)


def _local_numel(shape: torch.Size, shard: int) -> int:
    """Elements of one rank's dim-0 shard, padded as FSDP2 pads it (ceil(rows / shard) rows)."""
    if shard == 1 or len(shape) == 0:
        return math.prod(shape)
    return math.ceil(shape[0] / shard) * math.prod(shape[1:])


# ----- activations: what autograd saves, counted under FakeTensorMode -------------------------------------
def _saved_bytes(run: Any, parameters: list[torch.Tensor]) -> tuple[int, int]:
    """Bytes of the distinct non-parameter storages autograd saves while `run()` executes, and the largest
    (run under a Step, which makes it a CUDA or a CPU step)."""
    skip = {p.untyped_storage()._cdata for p in parameters}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in skip:
            seen[storage._cdata] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values()), max(seen.values(), default=0)


@dataclass(frozen=True)
class Activations:
    block: int  # saved by one decoder block
    block_largest: int  # its largest saved tensor
    ends: int  # saved by the embedding, final norm, head and loss
    block_input: int  # one block's input (what a checkpointed block keeps)
    attention_kernel: str = "flash"  # the block's SDPA backend(s), "+"-joined when its calls differ


_TRACED: dict[tuple[str, str, int, str, bool, str], Activations] = {}


def activations(model: ModelConfig, attention: AttentionConfig | Resolved, setup: Setup) -> Activations:
    """activations_traced, once per model, attention, micro-batch, precision, sharding and device (a table
    of plans asks for the same traces many times)."""
    resolved = as_resolved(model, attention)
    key = (
        repr(model),
        repr(resolved.config),
        setup.micro_batch,
        setup.precision,
        setup.sharded,
        setup.device,
    )
    if key not in _TRACED:
        _TRACED[key] = activations_traced(model, resolved, setup)
    return _TRACED[key]


def activations_traced(
    model: ModelConfig, attention: AttentionConfig | Resolved, setup: Setup
) -> Activations:
    """Saved-for-backward bytes of one block and of the rest, at (micro_batch, seq_len), traced without
    allocating. Under FSDP with bf16-mixed the blocks and the root compute with bf16 weights (no autocast
    copies of the weights are saved); on one device autocast saves a bf16 copy of every weight it casts.
    On "cuda" the trace is a CUDA step's (Step: CUDA's SDPA kernels and autocast's fp32 ops)."""
    resolved = as_resolved(model, attention)
    one_layer = dataclasses.replace(model, n_layer=1)
    mixed = setup.precision == "bf16-mixed"
    B, T = setup.micro_batch, model.seq_len
    with FakeTensorMode(allow_non_fake_inputs=False):
        net = Transformer(one_layer, resolved)
        if (
            mixed and setup.sharded
        ):  # FSDP's param_dtype: everything but the embedding (lightning_modules/distributed/parallel.py)
            for part in (net.blocks, net.norm, net.head):
                for module in part.modules():  # re-registered: Module.to cannot swap fake parameters
                    for name, p in list(module.named_parameters(recurse=False)):
                        setattr(module, name, torch.nn.Parameter(p.detach().to(torch.bfloat16)))
        params = list(net.parameters())
        tokens = torch.zeros(B, T + 1, dtype=torch.long)
        x = torch.zeros(B, T, model.d_model, requires_grad=True)

        def whole() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
                net(tokens[:, :-1], targets=tokens[:, 1:])  # the training loss, as LanguageModel runs it

        def block() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
                net.blocks[0](x, net.rope)

        with Step(setup.device):
            whole_bytes, _ = _saved_bytes(whole, params)
        with Step(setup.device) as step:
            block_bytes, block_largest = _saved_bytes(block, params)
    kernel = "+".join(dict.fromkeys(step.kernels)) or "none"
    return Activations(
        block_bytes, block_largest, whole_bytes - block_bytes, B * T * model.d_model * FP32, kernel
    )


# ----- the plan -----------------------------------------------------------------------------------------
def plan(model: ModelConfig, attention: AttentionConfig | Resolved, setup: Setup) -> MemoryPlan:
    resolved = as_resolved(model, attention)  # once: the meta model and the traces take it as it is
    net = _meta_model(model, resolved)
    shard = setup.shard_ranks
    groups, _ = param_groups(net, OptimizerConfig(name=setup.optimizer))  # type: ignore[arg-type]
    local = {p: _local_numel(p.shape, shard) for p in net.parameters()}
    parameters = FP32 * sum(local.values())
    gradients = parameters * (2 if setup.strategy == "ddp" else 1)  # DDP: grads + reducer buckets
    optimizer = 0
    for group in groups:
        per = 1 if group["use_muon"] else 2  # momentum, or AdamW's two moments
        optimizer += per * FP32 * sum(local[p] for p in group["params"])

    act = activations(model, resolved, setup)
    L = model.n_layer
    kept_per_block = act.block_input if setup.activation_checkpointing else act.block
    activation_bytes = L * kept_per_block + act.ends

    B, T, V = setup.micro_batch, model.seq_len, model.padded_vocab_size
    # One chunk of the loss at a time (lightning_modules/model/loss.py), at the larger of two moments: its fp32
    # logits with logsumexp's fp32 temporary, or those logits with their gradient and the head weight's
    # gradient product, each also in bf16 under autocast (measured to the byte on the CPU). On one device
    # bf16 autocast also copies the head weight to bf16 for the loop (FSDP gathers it in bf16).
    mixed = setup.precision == "bf16-mixed"
    rows, d = min(B * T, loss.chunk_rows(V)), model.d_model
    copies = FP32 + (BF16 if mixed else 0)  # an fp32 tensor and, under autocast, its bf16 twin
    chunk = max(2 * FP32 * rows * V, copies * rows * V + copies * V * d)
    # and the final norm's output, the loss's input, alive (not saved) while it runs
    head_backward = chunk + (BF16 * V * d if mixed and not setup.sharded else 0) + FP32 * B * T * d
    # A block's backward holds, besides what it saved, about four tensors the size of its largest saved
    # one (the MLP hidden): the incoming gradient, ReLU^2's derivative temporaries, the outgoing gradient
    # (measured: the peak falls in PowBackward). Under FSDP it also holds the block's unsharded gradients;
    # FSDP2 keeps a block's reduce-scatter input until the next block's post-backward waits for it, so
    # every block's backward but the first also holds the previous block's (benchmarks/memory_plan.py
    # shows both in the live tensors at the peak).
    block_backward = 4 * act.block_largest + (act.block if setup.activation_checkpointing else 0)
    block_grads = FP32 * sum(p.numel() for p in net.blocks[0].parameters()) if setup.sharded else 0
    block_backward += block_grads
    gathered = _gathered_bytes(net, setup)
    step = _step_transient(net, groups, setup)
    transients = {
        "loss (one chunk's logits)": head_backward,
        "block backward"
        + (" (recomputed activations)" if setup.activation_checkpointing else ""): block_backward,
        "FSDP gathered weights (head, running block, next block's all-gather)": gathered,
        "optimiser step (" + ("gathered Muon matrix" if setup.sharded else "Muon matrix") + ")": step,
    }
    kind = max(transients, key=lambda k: transients[k])
    moments = {
        # the loss's chunks, then the last block's backward, run while (nearly) every activation is held
        "backward start": activation_bytes + max(head_backward, block_backward) + gathered,
        "backward end": gradients + block_backward + block_grads + gathered,  # + the pending reduce-scatter
        "optimiser step": gradients + step,
    }
    peak_at = max(moments, key=lambda k: moments[k])
    return MemoryPlan(
        parameters=parameters,
        gradients=gradients,
        optimizer=optimizer,
        activations=activation_bytes,
        transient=transients[kind],
        transient_kind=kind,
        peak=parameters + optimizer + moments[peak_at],
        peak_at=peak_at,
        terms={
            "activations_per_block": act.block,
            "activations_ends": act.ends,
            "head_backward": head_backward,
            "block_backward": block_backward,
            "gathered": gathered,
            "step": step,
        },
        device=setup.device,
        attention_kernel=act.attention_kernel,
    )


def _gathered_bytes(net: torch.nn.Module, setup: Setup) -> int:
    """FSDP: the root's weights (final norm, head) gathered from forward to backward and, in the compute
    dtype, the running block's gathered weights plus the next block's all-gather output (prefetched; copied
    into the parameters and freed when that block starts). Without resharding every block stays gathered,
    with one all-gather output besides."""
    if not setup.sharded:
        return 0
    size = BF16 if setup.precision == "bf16-mixed" else FP32
    block = size * sum(p.numel() for p in net.blocks[0].parameters())
    root = size * (net.head.weight.numel() + net.norm.weight.numel())
    blocks = block * (len(net.blocks) + 1 if not setup.reshard_after_forward else 2)
    return root + blocks


def _step_transient(net: torch.nn.Module, groups: list[dict], setup: Setup) -> int:
    """The optimiser step's largest short-lived bytes. Muon per matrix parameter: the Nesterov update
    (local, fp32), under FSDP the whole gathered update (fp32), the Newton-Schulz iterates of its largest
    logical matrix (bf16: X, X X^T, and two more of each) and the orthogonalised whole (bf16). AdamW runs
    fused (MuonAdamW's default adamw_path): in place, no temporaries."""
    shard = setup.shard_ranks
    worst = 0
    for group in groups:
        for p in group["params"]:
            local = _local_numel(p.shape, shard)
            if group["use_muon"]:
                whole = p.numel()
                rows, cols = (p.shape[1], p.shape[2]) if p.ndim == 3 else (p.shape[0], p.shape[1])
                small = min(rows, cols)
                ns = BF16 * (2 * rows * cols + 3 * small * small)
                gathered = FP32 * whole if setup.sharded else 0
                worst = max(worst, FP32 * local + gathered + ns + BF16 * whole + FP32 * local)
    return worst


# ----- printing ------------------------------------------------------------------------------------------
def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def format_plan(
    model: ModelConfig, attention: AttentionConfig | Resolved, setup: Setup, result: MemoryPlan
) -> str:
    attention = as_resolved(model, attention).config
    where = setup.strategy + (f" x {setup.world}" if setup.world > 1 else "")
    if setup.strategy == "hybrid":
        where += f" ({setup.nodes} nodes)"
    lines = [
        f"memory per rank: {model.name} {attention.label()}, {where}, micro-batch {setup.micro_batch} x "
        f"{model.seq_len}, {setup.precision}, activation checkpointing {'on' if setup.activation_checkpointing else 'off'}, "
        f"{setup.optimizer}, on {setup.device} (attention: SDPA {result.attention_kernel})",
        f"  parameters       {gib(result.parameters):>12}",
        f"  gradients        {gib(result.gradients):>12}",
        f"  optimiser state  {gib(result.optimizer):>12}",
        f"  activations      {gib(result.activations):>12}",
        f"  largest transient{gib(result.transient):>12}  ({result.transient_kind})",
        f"  peak             {gib(result.peak):>12}  (at the {result.peak_at})",
    ]
    return "\n".join(lines)


def fits(result: MemoryPlan, device_gib: float, headroom: float = 0.9) -> bool:
    """Whether the plan's peak fits a device of `device_gib` GiB, keeping 10 % for the CUDA context and
    the allocator's fragmentation."""
    return result.peak <= headroom * device_gib * 2**30
