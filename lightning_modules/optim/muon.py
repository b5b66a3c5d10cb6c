"""Muon for the block matrices and AdamW for the rest, in one optimiser (docs/paper-errata.md, "Recipe").

One optimiser rather than two keeps Lightning's automatic optimisation: gradient clipping, accumulation
and one LR schedule over every group (each group keeps its own base LR).

Muon orthogonalises logical matrices, not storage.

torch.optim.Muon (torch 2.13) orthogonalises each 2-D parameter as a whole. Our attention layers fuse
projections for speed ([W_q | W_k | W_v] in one weight) and LRKV keeps its per-head factors B_h as one
(H, d_h, r) tensor; orthogonalising the fused storage would change the update with the storage layout, and
would differ between variants for reasons that have nothing to do with attention. This optimiser runs
exactly torch.optim.Muon's update (same momentum, Nesterov, Newton-Schulz iteration and coefficients, LR
adjustment, decoupled weight decay), but on each logical block: row blocks of a fused weight
(Attention.muon_blocks) and each matrix of a 3-D parameter. With no blocks it equals torch.optim.Muon
(tests/optim/test_muon.py). Groups with use_muon=False run torch's own AdamW functional, unchanged, fused
by default (`adamw_path`).

Under FSDP2 (docs/architecture.md, "Scale") parameters, gradients and momenta are DTensors sharded on dim 0,
and each rank holds a slice of rows. Orthogonalising a slice on its own (what torch.optim.Muon does with a
DTensor) is a different update, about 13 % off the unsharded one on 2 ranks. Here every logical matrix is
orthogonalised whole, and each rank applies the rows of the result that it owns; momentum, weight decay
and AdamW stay elementwise on the local shards. The matrices are split over the ranks (lightning_modules/optim/distributed.py): each rank
gathers and orthogonalises only the matrices it owns, and the results come back to the ranks holding their
rows, so Newton-Schulz costs each rank about 1/world of the total; under DDP (`replicated=True`) each rank
orthogonalises its share and the results are all-gathered. `distribute_newton_schulz=False` keeps
the earlier path (every rank gathers and orthogonalises every matrix; benchmarks/muon_step.py compares the
two). tests/optim/test_fsdp_muon.py shows the sharded step equals the unsharded one, bitwise, on both paths.
`ns_flops` counts the Newton-Schulz FLOPs this rank has run.

Newton-Schulz is batched over equal-shaped matrices (`batched_newton_schulz`, the default): the logical
matrices of a step are grouped by shape and device, stacked, and each group runs one batched iteration
(per-matrix Frobenius norms, the tall-matrix transpose applied to the whole group), so a step makes one
Newton-Schulz call per shape rather than one per matrix; LRKV's (H, d_h, r) factors would otherwise add
2H calls per layer. `orthogonalise` (one call per matrix) stays as the reference the batched path is tested
against (tests/optim/test_muon_batched.py); on CPU the two are bitwise equal. `ns_calls` counts the
Newton-Schulz calls this rank has made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.optim import Optimizer
from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, _adjust_lr, _zeropower_via_newtonschulz
from torch.optim.adamw import adamw

from lightning_modules.optim.distributed import Plan, ReplicatedPlan, mesh_key, ns_flops

ADAMW_PATHS = ("fused", "foreach", "single")  # MuonAdamW's adamw_path


def orthogonalise(
    update: Tensor, rows: tuple[int, ...] | None, ns: tuple[float, float, float], steps: int, eps: float
) -> Tensor:
    """Newton-Schulz per logical matrix, one call each: each (rows_i, cols) block of a 2-D update, or each
    matrix of a 3-D update, is orthogonalised alone; the result has update's shape. The reference for
    `orthogonalise_batched` (and the path taken with batched_newton_schulz=False)."""
    if update.ndim == 3:
        return torch.stack([_zeropower_via_newtonschulz(m, ns, steps, eps) for m in update])
    if rows is None:
        return _zeropower_via_newtonschulz(update, ns, steps, eps)
    return torch.cat(
        [_zeropower_via_newtonschulz(block, ns, steps, eps) for block in update.split(list(rows))]
    )


def newton_schulz_batched(stack: Tensor, ns: tuple[float, float, float], steps: int, eps: float) -> Tensor:
    """torch's _zeropower_via_newtonschulz on each matrix of a (B, m, n) stack, in one call per operation.

    The same operations in the same order on each matrix: bf16, transposed when tall (m > n; every matrix of
    the stack has the same shape, so the rule holds for the whole stack), divided by its own Frobenius norm,
    then `steps` quintic iterations with baddbmm in place of addmm. Returns a (B, m, n) bf16 tensor."""
    a, b, c = ns
    x = stack.bfloat16()
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    # out of place: when stack is already bf16, x is stack itself, which the caller may still need
    x = x / torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        gram_update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, gram_update, x, beta=a)
    return x.mT if tall else x


def pieces(shape: torch.Size, rows: tuple[int, ...] | None) -> list[tuple[int, int, torch.Size]]:
    """A parameter's logical matrices as runs of equal-shaped ones: (first row of the run in the parameter's
    rows viewed as (-1, cols), matrices in the run, matrix shape). A run is a contiguous (k, m, n) view, so
    it is copied into (and out of) a stack with one call however many matrices it holds."""
    if len(shape) == 3:
        return [(0, shape[0], torch.Size(shape[1:]))]
    out: list[tuple[int, int, torch.Size]] = []
    start = 0
    for r in rows or (shape[0],):
        if out and out[-1][2][0] == r:
            out[-1] = (out[-1][0], out[-1][1] + 1, out[-1][2])
        else:
            out.append((start, 1, torch.Size((r, shape[1]))))
        start += r
    return out


def orthogonalise_batched(
    specs: Sequence[tuple[torch.Size, tuple[int, ...] | None, torch.device]],
    updates: Iterable[Tensor],
    ns: tuple[float, float, float],
    steps: int,
    eps: float,
    max_elements: int,
) -> tuple[list[Tensor], int]:
    """`orthogonalise` on many updates at once: (shape, row blocks, device) of each, and the updates
    themselves, produced one at a time (a generator keeps one update alive, not all of them). Every logical
    matrix is copied, as bf16, into the stack of its (shape, device), and each stack is orthogonalised by
    `newton_schulz_batched`, at most max_elements elements per call (the call's transient buffers are a few
    times that). The source dtype is not part of the key: each run is rounded to bf16 as it is copied in,
    which is what torch's .bfloat16() does to each matrix, so the values are those of the reference.
    Returns each update orthogonalised (bf16, its shape; views into the stacks where it is one run) and
    the number of Newton-Schulz calls made."""
    where: list[list[tuple[tuple, int, int, int]]] = []  # per update: (key, index in stack, run, first row)
    sizes: dict[tuple, int] = {}
    for shape, rows, device in specs:
        runs = []
        for start, k, matrix in pieces(shape, rows):
            key = (matrix, device)
            runs.append((key, sizes.get(key, 0), k, start))
            sizes[key] = sizes.get(key, 0) + k
        where.append(runs)
    stacks = {key: torch.empty((n, *key[0]), dtype=torch.bfloat16, device=key[1]) for key, n in sizes.items()}
    for runs, update in zip(where, updates, strict=True):
        flat = update.reshape(-1, update.shape[-1])
        for key, j, k, start in runs:
            m, n = key[0]
            stacks[key][j : j + k].copy_(flat[start : start + k * m].view(k, m, n))
    calls = 0
    for (matrix, _), stack in stacks.items():
        chunk = max(1, max_elements // matrix.numel())
        for lo in range(0, stack.shape[0], chunk):
            # in place: the chunk's input is no longer needed once its result exists
            stack[lo : lo + chunk].copy_(newton_schulz_batched(stack[lo : lo + chunk], ns, steps, eps))
            calls += 1
    out = []
    for (shape, _, _), runs in zip(specs, where, strict=True):
        parts = [stacks[key][j : j + k] for key, j, k, _ in runs]
        if len(parts) == 1:
            out.append(parts[0].view(shape))
        else:  # row blocks of unequal shapes, from several stacks
            out.append(torch.cat([t.reshape(-1, shape[-1]) for t in parts]).view(shape))
    return out, calls


def local_rows(p: DTensor, full: Tensor) -> tuple[Tensor, int]:
    """This rank's shard of `full` (a tensor of p's global shape) and the global index of its first row.

    The shard is cut by p's own placements, so it lines up with p.to_local() row for row (FSDP2 pads
    uneven shards; DTensor's Shard(0) chunks the same way)."""
    shard = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
    _, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return shard, offset[0]


def full_tensor(t: Tensor) -> Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def check_placements(p: Tensor) -> None:
    """Muon's gather-and-slice handles row sharding (FSDP, HSDP) only."""
    if isinstance(p, DTensor) and any(
        not (pl == Shard(0) or isinstance(pl, Replicate)) for pl in p.placements
    ):
        raise ValueError(f"Muon handles DTensors sharded on dim 0 only, got placements {p.placements}")


class MuonAdamW(Optimizer):
    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = (DEFAULT_A, DEFAULT_B, DEFAULT_C),
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        betas: tuple[float, float] = (0.9, 0.95),
        adam_eps: float = 1e-8,
        blocks: dict[Tensor, tuple[int, ...]] | None = None,
        distribute_newton_schulz: bool = True,
        batched_newton_schulz: bool = True,
        ns_batch_elements: int = 2**24,
        adamw_path: str = "fused",
        replicated: bool = False,
    ) -> None:
        """Every param group says `use_muon` (True: Muon; False: AdamW with betas, adam_eps).
        distribute_newton_schulz: under FSDP, each rank orthogonalises only its share of the matrices
        (module docstring); False: every rank orthogonalises every matrix.
        batched_newton_schulz: one batched Newton-Schulz call per matrix shape (module docstring); False:
        one call per matrix (the reference loop). ns_batch_elements: most matrix elements in one batched
        call, which bounds its transient buffers (bf16, a few times that: 2**24 is about 100 MiB).
        adamw_path: how torch's AdamW steps the AdamW groups. "fused" (the default, CPU and CUDA): one kernel
        for all of a group's tensors, no temporaries; "foreach": about 9 operations per group, each over all
        its tensors, with one temporary the group's size; "single": one tensor at a time (the reference the
        others are tested against, tests/optim/test_muon.py).
        replicated: every rank of the default process group holds the same parameters and gradients (DDP);
        with distribute_newton_schulz, each rank then orthogonalises only its share of the plain (not DTensor)
        Muon matrices and the results are all-gathered (lightning_modules/optim/distributed.py)."""
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_coefficients=ns_coefficients,
            eps=eps,
            ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn,
            betas=betas,
            adam_eps=adam_eps,
            use_muon=True,
        )
        super().__init__(params, defaults)
        self.blocks = blocks or {}
        self.distribute_newton_schulz = distribute_newton_schulz
        self.batched_newton_schulz = batched_newton_schulz
        self.ns_batch_elements = ns_batch_elements
        if adamw_path not in ADAMW_PATHS:
            raise ValueError(f"adamw_path={adamw_path!r}: one of {', '.join(ADAMW_PATHS)}")
        self.adamw_path = adamw_path
        self.replicated = replicated
        self._replicated_plans: dict[tuple, ReplicatedPlan] = {}
        self.ns_flops = 0  # Newton-Schulz FLOPs run on this rank so far
        self.ns_calls = 0  # Newton-Schulz calls made on this rank so far (a batched call counts once)
        self.transient_bytes = 0  # largest transient buffers of one distributed exchange so far
        self._plans: dict[tuple, Plan] = {}
        for group in self.param_groups:
            if not group["use_muon"]:
                continue
            for p in group["params"]:
                check_placements(p)
                if p.ndim not in (2, 3):
                    raise ValueError(
                        f"Muon takes 2-D matrices or 3-D stacks of matrices, got shape {tuple(p.shape)}"
                    )
                rows = self.blocks.get(p)
                if rows is not None and (p.ndim != 2 or sum(rows) != p.shape[0]):
                    raise ValueError(
                        f"blocks {rows} do not split the rows of a parameter of shape {tuple(p.shape)}"
                    )

    def block_shapes(self, p: Tensor) -> list[torch.Size]:
        """Shapes of the logical matrices of p (what the LR adjustment sees)."""
        if p.ndim == 3:
            return [p.shape[1:]] * p.shape[0]
        rows = self.blocks.get(p)
        return [torch.Size((r, p.shape[1])) for r in rows] if rows else [p.shape]

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if not group["use_muon"]:
                self._adamw_step(group)
                continue
            self._muon_step(group)
        return loss

    def _muon_step(self, group: dict) -> None:
        lr, momentum = group["lr"], group["momentum"]
        ns, steps, eps = group["ns_coefficients"], group["ns_steps"], group["eps"]
        params = []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            state["momentum_buffer"].lerp_(p.grad, 1 - momentum)
            params.append(p)

        def nesterov(p: Tensor) -> Tensor:
            buf = self.state[p]["momentum_buffer"]
            return p.grad.lerp(buf, momentum) if group["nesterov"] else buf

        sharded: dict[tuple, list[Tensor]] = {}
        for p in params:
            if isinstance(p, DTensor) and self.distribute_newton_schulz:
                sharded.setdefault(mesh_key(p), []).append(p)
        done: dict[Tensor, tuple[Tensor, int]] = {}  # p: (its rows of the result, global index of the first)
        for ps in sharded.values():
            plan = self._plan(ps, steps)
            results, transient = plan.exchange(
                [nesterov(p).to_local() for p in ps], self._orthogonaliser(ns, steps, eps)
            )
            self.ns_flops += plan.flops_per_rank[plan.me]
            self.transient_bytes = max(self.transient_bytes, transient)
            for j, (p, result) in enumerate(zip(ps, results, strict=True)):
                done[p] = (result, plan.rows[j][plan.me][0])
        whole = [p for p in params if p not in done and not isinstance(p, DTensor)]
        if whole and self._split_replicated():  # DDP: each rank orthogonalises its share of the matrices
            done.update(self._replicated_updates(whole, nesterov, ns, steps, eps))
        # one process, or the earlier FSDP path: every matrix here, whole
        rest = [p for p in params if p not in done]
        fulls = (full_tensor(nesterov(p)) for p in rest)  # lazily: one full fp32 update alive at a time
        updates: Iterable[Tensor]
        if self.batched_newton_schulz:
            specs = [(p.shape, self.blocks.get(p), p.device) for p in rest]
            updates, calls = orthogonalise_batched(specs, fulls, ns, steps, eps, self.ns_batch_elements)
            self.ns_calls += calls
        else:
            updates = (
                orthogonalise(u, self.blocks.get(p), ns, steps, eps) for p, u in zip(rest, fulls, strict=True)
            )
            self.ns_calls += sum(len(self.block_shapes(p)) for p in rest)
        # each parameter is applied as soon as its update exists (the loop keeps one alive at a time); the
        # parameters are independent, so the order does not change the values
        for p, update in zip(rest, updates, strict=True):
            self.ns_flops += sum(ns_flops(shape, steps) for shape in self.block_shapes(p))
            update, offset = local_rows(p, update) if isinstance(p, DTensor) else (update, 0)
            p.mul_(1 - lr * group["weight_decay"])
            self._apply(p, update, offset, lr, group["adjust_lr_fn"])
        for p, (update, offset) in done.items():
            p.mul_(1 - lr * group["weight_decay"])
            self._apply(p, update, offset, lr, group["adjust_lr_fn"])

    def _split_replicated(self) -> bool:
        return (
            self.replicated
            and self.distribute_newton_schulz
            and dist.is_available()
            and dist.is_initialized()
            and dist.get_world_size() > 1
        )

    def _replicated_updates(
        self,
        params: list[Tensor],
        nesterov: Callable[[Tensor], Tensor],
        ns: tuple[float, float, float],
        steps: int,
        eps: float,
    ) -> dict[Tensor, tuple[Tensor, int]]:
        """Under DDP: this rank's matrices orthogonalised, every rank's gathered (ReplicatedPlan); p: (its
        whole orthogonalised update, 0)."""
        key = ("replicated", steps, *(id(p) for p in params))
        if key not in self._replicated_plans:
            shapes, blocks = [p.shape for p in params], [self.blocks.get(p) for p in params]
            self._replicated_plans[key] = ReplicatedPlan(shapes, blocks, steps)
        plan = self._replicated_plans[key]
        mine: dict[int, list] = {}
        for m in plan.owned:
            mine.setdefault(m.param, []).append(m)

        def owned() -> Iterator[Tensor]:  # lazily: one parameter's fp32 update alive at a time
            for i, ms in mine.items():
                update = nesterov(params[i]).reshape(params[i].shape[0], -1)  # a 3-D stack: one row a matrix
                yield from (update[m.start : m.stop].view(m.shape) for m in ms)

        results: list[Tensor]
        if self.batched_newton_schulz:
            specs = [(m.shape, None, params[m.param].device) for m in plan.owned]
            results, calls = orthogonalise_batched(specs, owned(), ns, steps, eps, self.ns_batch_elements)
            self.ns_calls += calls
        else:
            results = [_zeropower_via_newtonschulz(m, ns, steps, eps) for m in owned()]
            self.ns_calls += len(results)
        updates, transient = plan.gather(results, params)
        self.ns_flops += plan.flops_per_rank[plan.me]
        self.transient_bytes = max(self.transient_bytes, transient)
        return {p: (u, 0) for p, u in zip(params, updates, strict=True)}

    def _orthogonaliser(
        self, ns: tuple[float, float, float], steps: int, eps: float
    ) -> Callable[[list[Tensor]], list[Tensor]]:
        """What the distributed split runs on the matrices a rank owns: batched, or the reference loop."""

        def run(matrices: list[Tensor]) -> list[Tensor]:
            if not self.batched_newton_schulz:
                self.ns_calls += len(matrices)
                return [_zeropower_via_newtonschulz(m, ns, steps, eps) for m in matrices]
            specs = [(m.shape, None, m.device) for m in matrices]
            out, calls = orthogonalise_batched(specs, matrices, ns, steps, eps, self.ns_batch_elements)
            self.ns_calls += calls
            return out

        return run

    def _plan(self, params: list[Tensor], steps: int) -> Plan:
        key = (steps, *(id(p) for p in params))
        if key not in self._plans:
            first = params[0]
            assert isinstance(first, DTensor)
            self._plans[key] = Plan(
                [p.shape for p in params],
                [self.blocks.get(p) for p in params],
                first.device_mesh,
                first.placements,
                steps,
            )
        return self._plans[key]

    def _adamw_step(self, group: dict) -> None:
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        fused = self.adamw_path == "fused"
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            # The fused kernel counts steps on the parameter's device; the other paths read them on the host.
            where = p.device if fused else torch.device("cpu")
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=where)  # a fill, not a copy
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif state["step"].device != where:  # a checkpoint written on another path: once, then in place
                state["step"] = state["step"].to(where)
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        beta1, beta2 = group["betas"]
        adamw(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],
            steps,
            foreach=self.adamw_path == "foreach",
            fused=fused,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["adam_eps"],
            maximize=False,
        )

    def _apply(self, p: Tensor, update: Tensor, offset: int, lr: float, adjust_lr_fn: str | None) -> None:
        """p -= adjusted lr x update, with update p's own rows of the orthogonalised tensor: all of them, or,
        for a sharded p, the rows it owns (global rows offset .. offset + its local rows)."""
        shapes = self.block_shapes(p)
        target = p.to_local() if isinstance(p, DTensor) else p  # a view: updating it updates the shard
        if len(set(shapes)) == 1:  # one LR for the whole parameter
            target.add_(update.to(p.dtype), alpha=-_adjust_lr(lr, adjust_lr_fn, shapes[0]))
            return
        start = 0
        for shape in shapes:  # row blocks of unequal shapes: each its own adjusted LR
            # global rows start .. start + shape[0] of the block, as local rows lo .. hi of this shard
            lo = max(start - offset, 0)
            hi = min(start + shape[0] - offset, target.shape[0])
            if lo < hi:
                target[lo:hi].add_(update[lo:hi].to(p.dtype), alpha=-_adjust_lr(lr, adjust_lr_fn, shape))
            start += shape[0]
