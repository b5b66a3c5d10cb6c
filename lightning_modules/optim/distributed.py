"""Newton-Schulz split over ranks: each rank orthogonalises only the logical matrices it owns.

Under FSDP2 every Muon parameter is a DTensor sharded on dim 0 (Shard(0), or (Replicate(), Shard(0)) on a
hybrid mesh), so each rank holds some rows of every matrix. One step here is:

1. plan (once per set of shapes): cut every parameter into its logical matrices (row blocks of a fused
   weight, each matrix of a 3-D stack, else the whole matrix) and give each matrix to one rank, largest
   Newton-Schulz FLOPs first, always to the least loaded rank (greedy LPT: the busiest rank does at most
   4/3 of the optimum, and at the sizes we train it is within a few % of total / world);
2. gather: one all_to_all sends every rank's rows of a matrix to the matrix's owner. An owner takes the
   rows from the ranks of its own replica (same coordinate on the replicate mesh dimension), which hold
   each row exactly once;
3. each owner orthogonalises its matrices whole (the same function, on the same values, as one process;
   batched over equal shapes by lightning_modules/optim/muon.py, which is why it gets them all at once);
4. scatter: a second all_to_all sends each rank the rows of every result that it holds. Newton-Schulz
   returns bf16, so the results travel in bf16, which is exact.

So a sharded step equals the single-process step bitwise (tests/optim/test_fsdp_muon.py), Newton-Schulz FLOPs
per rank are about 1/world of the total, and the transient buffers of a step are this rank's rows of the
group (its shard, already the size of its momentum) plus the matrices it owns, never the whole model.

Under DDP every rank holds every parameter whole, with the same gradients, so there is nothing to gather:
ReplicatedPlan gives each rank its matrices by the same assignment, and one all-gather of the bf16 results
hands every rank all of them (tests/optim/test_ddp_muon.py: the step equals one process's, bitwise). The
transient buffers are then about 2 + 1/world times the Muon parameters in bf16 (the all-gather's input and
output, and the updates assembled from it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset


def ns_flops(shape: Sequence[int], steps: int) -> int:
    """FLOPs of torch's Newton-Schulz on one (m, n) matrix: with k = min(m, n), N = max(m, n), each step is
    X X^T (2k^2 N), b A + c A A (2k^3) and a X + B X (2k^2 N); checked against torch's flop counter in
    tests/optim/test_muon.py."""
    k, n = sorted(shape)
    return steps * (4 * k * k * n + 2 * k**3)


@dataclass(frozen=True)
class Matrix:
    """One logical matrix: rows start..stop (dim 0) of parameter `param`, orthogonalised as `shape`."""

    param: int
    start: int
    stop: int
    shape: torch.Size
    flops: int
    owner: int


def split_matrices(shapes: Sequence[torch.Size], blocks: Sequence[tuple[int, ...] | None]) -> list[tuple]:
    """(param, start, stop, matrix shape) for every logical matrix of the parameters, in parameter order."""
    out = []
    for i, (shape, rows) in enumerate(zip(shapes, blocks, strict=True)):
        if len(shape) == 3:
            out += [(i, h, h + 1, torch.Size(shape[1:])) for h in range(shape[0])]
        else:
            start = 0
            for r in rows or (shape[0],):
                out.append((i, start, start + r, torch.Size((r, shape[1]))))
                start += r
    return out


def assign(flops: Sequence[int], world: int) -> list[int]:
    """Owner of each item: largest first, each to the least loaded rank (lowest rank on ties), so every rank
    computes the same assignment without talking."""
    load = [0] * world
    owner = [0] * len(flops)
    for i in sorted(range(len(flops)), key=lambda i: (-flops[i], i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[i], load[rank] = rank, load[rank] + flops[i]
    return owner


class Plan:
    """Who owns which matrix and who holds which rows, for parameters that share one mesh."""

    def __init__(
        self,
        shapes: Sequence[torch.Size],
        blocks: Sequence[tuple[int, ...] | None],
        mesh: DeviceMesh,
        placements: Sequence,
        ns_steps: int,
    ) -> None:
        if mesh.ndim == 1:
            self.group = mesh.get_group()
        elif mesh.mesh.numel() == dist.get_world_size():
            self.group = dist.group.WORLD
        else:
            raise ValueError("distributed Muon: a multi-dimensional mesh must span every rank")
        self.world = dist.get_world_size(self.group)
        order = [dist.get_global_rank(self.group, i) for i in range(self.world)]
        coords = {int(r): c for c, r in _coordinates(mesh)}
        me = dist.get_rank()
        self.me = order.index(me)
        shard_dims = [d for d, p in enumerate(placements) if p == Shard(0)]
        # ranks (by index in the group) holding each row of each parameter: [(lo, hi)] per rank
        self.rows = [[_row_range(shape, mesh, coords[r], placements) for r in order] for shape in shapes]
        replica = [tuple(c for d, c in enumerate(coords[r]) if d not in shard_dims) for r in order]
        self.sources = [[s for s in range(self.world) if replica[s] == replica[o]] for o in range(self.world)]
        units = split_matrices(shapes, blocks)
        flops = [ns_flops(shape, ns_steps) for *_, shape in units]
        owners = assign(flops, self.world)
        self.matrices = [
            Matrix(p, a, b, shape, f, o) for (p, a, b, shape), f, o in zip(units, flops, owners, strict=True)
        ]
        self.owned = [m for m in self.matrices if m.owner == self.me]
        self.flops_per_rank = [sum(m.flops for m in self.matrices if m.owner == r) for r in range(self.world)]

    def overlap(self, m: Matrix, rank: int) -> tuple[int, int]:
        """Rows of m that `rank` holds, as global row indices (empty when lo >= hi)."""
        lo, hi = self.rows[m.param][rank]
        return max(m.start, lo), min(m.stop, hi)

    def exchange(
        self, local: Sequence[Tensor], orthogonalise: Callable[[list[Tensor]], list[Tensor]]
    ) -> tuple[list[Tensor], int]:
        """local: this rank's rows of every parameter's update; orthogonalise: the owned matrices, whole, to
        their orthogonalised matrices, in order. Returns this rank's rows of every
        orthogonalised update, and the bytes of the transient buffers this step allocated."""
        flat = [t.reshape(t.shape[0], -1) for t in local]
        dtype = flat[0].dtype if flat else torch.float32
        send_buf, recv_buf, recv_sizes = self._gather(flat, dtype)
        results = self._orthogonalise_owned(flat, recv_buf, recv_sizes, orthogonalise)
        send2_buf, recv2_buf, out = self._scatter(flat, results, send_buf)
        buffers = [send_buf, recv_buf, *results, send2_buf, recv2_buf, *out]
        transient = sum(b.numel() * b.element_size() for b in buffers)
        return [o.view(t.shape) for o, t in zip(out, local, strict=True)], transient

    # 1. gather: my rows of every matrix, to its owner (if I am one of the owner's sources)
    def _gather(self, flat: list[Tensor], dtype: torch.dtype) -> tuple[Tensor, Tensor, list[int]]:
        """One all_to_all of rows to owners: (send buffer, receive buffer, elements received per rank)."""
        send, send_sizes = self._rows_for_owners(flat, dtype)
        recv_sizes = [self._received_from(s, flat) for s in range(self.world)]
        send_buf = torch.cat(send) if send else flat[0].new_empty(0, dtype=dtype)
        recv_buf = send_buf.new_empty(sum(recv_sizes))
        dist.all_to_all_single(recv_buf, send_buf, recv_sizes, send_sizes, group=self.group)
        return send_buf, recv_buf, recv_sizes

    def _rows_for_owners(self, flat: list[Tensor], dtype: torch.dtype) -> tuple[list[Tensor], list[int]]:
        """My rows of each owner's matrices, flattened in owner then matrix order, and the count per owner."""
        send, send_sizes = [], []
        for o in range(self.world):
            size = 0
            if self.me in self.sources[o]:
                for m in self.matrices:
                    if m.owner == o:
                        lo, hi = self.overlap(m, self.me)
                        if lo < hi:
                            base = self.rows[m.param][self.me][0]
                            send.append(flat[m.param][lo - base : hi - base].to(dtype).reshape(-1))
                            size += send[-1].numel()
            send_sizes.append(size)
        return send, send_sizes

    def _received_from(self, s: int, flat: list[Tensor]) -> int:
        """Elements of my matrices that rank s sends me (none unless it is one of my sources)."""
        if s not in self.sources[self.me]:
            return 0
        size = 0
        for m in self.owned:
            lo, hi = self.overlap(m, s)
            size += max(0, hi - lo) * flat[m.param].shape[1]
        return size

    # 2. assemble and orthogonalise my matrices
    def _orthogonalise_owned(
        self,
        flat: list[Tensor],
        recv_buf: Tensor,
        recv_sizes: list[int],
        orthogonalise: Callable[[list[Tensor]], list[Tensor]],
    ) -> list[Tensor]:
        """Each matrix I own, its rows taken from its sources in row order, orthogonalised whole (all of
        them in one call, so that equal shapes can be batched)."""
        pieces = list(recv_buf.split(recv_sizes))
        cursor = [0] * self.world
        matrices: list[Tensor] = []
        for m in self.owned:
            rows = []
            for s in sorted(self.sources[self.me], key=lambda s: self.rows[m.param][s][0]):
                lo, hi = self.overlap(m, s)
                if lo < hi:
                    n = (hi - lo) * flat[m.param].shape[1]
                    rows.append(pieces[s][cursor[s] : cursor[s] + n])
                    cursor[s] += n
            # a matrix from one source is a view of the receive buffer: no fp32 copy of every owned matrix
            whole = rows[0] if len(rows) == 1 else torch.cat(rows)
            matrices.append(whole.view(m.shape))
        results = orthogonalise(matrices)
        return [r.reshape(m.stop - m.start, -1) for m, r in zip(self.owned, results, strict=True)]

    # 3. scatter: every rank's rows of my results, back to it
    def _scatter(
        self, flat: list[Tensor], results: list[Tensor], send_buf: Tensor
    ) -> tuple[Tensor, Tensor, list[Tensor]]:
        """One all_to_all of results to the ranks holding their rows: (send buffer, receive buffer, my rows
        of every orthogonalised parameter, still flat)."""
        out_dtype = results[0].dtype if results else torch.bfloat16
        send2, send2_sizes = self._rows_for_holders(results)
        recv2_sizes = [0] * self.world
        for m in self.matrices:
            lo, hi = self.overlap(m, self.me)
            recv2_sizes[m.owner] += max(0, hi - lo) * flat[m.param].shape[1]
        send2_buf = torch.cat(send2) if send2 else send_buf.new_empty(0, dtype=out_dtype)
        recv2_buf = send2_buf.new_empty(sum(recv2_sizes), dtype=out_dtype)
        dist.all_to_all_single(recv2_buf, send2_buf.to(out_dtype), recv2_sizes, send2_sizes, group=self.group)
        return send2_buf, recv2_buf, self._place(flat, recv2_buf, recv2_sizes, out_dtype)

    def _rows_for_holders(self, results: list[Tensor]) -> tuple[list[Tensor], list[int]]:
        """The rows of my results each rank holds, flattened in rank then matrix order, and the count per rank."""
        send2, send2_sizes = [], []
        for r in range(self.world):
            size = 0
            for m, res in zip(self.owned, results, strict=True):
                lo, hi = self.overlap(m, r)
                if lo < hi:
                    send2.append(res[lo - m.start : hi - m.start].reshape(-1))
                    size += send2[-1].numel()
            send2_sizes.append(size)
        return send2, send2_sizes

    def _place(
        self, flat: list[Tensor], recv2_buf: Tensor, recv2_sizes: list[int], out_dtype: torch.dtype
    ) -> list[Tensor]:
        """My rows of every parameter's result, copied from what each owner sent, in matrix order."""
        out = [t.new_empty(t.shape, dtype=out_dtype) for t in flat]
        pieces = list(recv2_buf.split(recv2_sizes))
        cursor = [0] * self.world
        for m in self.matrices:
            lo, hi = self.overlap(m, self.me)
            if lo < hi:
                n = (hi - lo) * flat[m.param].shape[1]
                base = self.rows[m.param][self.me][0]
                out[m.param][lo - base : hi - base] = pieces[m.owner][
                    cursor[m.owner] : cursor[m.owner] + n
                ].view(hi - lo, -1)
                cursor[m.owner] += n
        return out


class ReplicatedPlan:
    """Who owns which matrix when every rank holds every parameter whole, with the same gradients (DDP, after
    its gradient all-reduce): each rank orthogonalises the matrices it owns (assigned as under FSDP, largest
    Newton-Schulz FLOPs first to the least loaded rank) and one all-gather of the bf16 results gives every
    rank every matrix. Every rank then applies the same bits, so the replicas stay equal."""

    def __init__(
        self, shapes: Sequence[torch.Size], blocks: Sequence[tuple[int, ...] | None], ns_steps: int
    ) -> None:
        self.group = dist.group.WORLD
        self.world = dist.get_world_size(self.group)
        self.me = dist.get_rank(self.group)
        units = split_matrices(shapes, blocks)
        flops = [ns_flops(shape, ns_steps) for *_, shape in units]
        owners = assign(flops, self.world)
        self.matrices = [
            Matrix(p, a, b, shape, f, o) for (p, a, b, shape), f, o in zip(units, flops, owners, strict=True)
        ]
        self.owned = [m for m in self.matrices if m.owner == self.me]  # in parameter, then row order
        self.flops_per_rank = [sum(m.flops for m in self.matrices if m.owner == r) for r in range(self.world)]
        self.elements = [
            sum(m.shape.numel() for m in self.matrices if m.owner == r) for r in range(self.world)
        ]

    def gather(self, results: Sequence[Tensor], like: Sequence[Tensor]) -> tuple[list[Tensor], int]:
        """results: the owned matrices orthogonalised (bf16), in `owned` order; like: the parameters. Returns
        every parameter's orthogonalised update (bf16, its shape), and the bytes of the transient buffers.
        Each rank's results travel in one slot of the longest rank's length (the balance by FLOPs keeps the
        padding small)."""
        device = like[0].device
        slot = max(self.elements)
        send = torch.zeros(slot, dtype=torch.bfloat16, device=device)
        if results:
            send[: self.elements[self.me]].copy_(torch.cat([r.reshape(-1) for r in results]))
        recv = send.new_empty(self.world * slot)
        dist.all_gather(list(recv.chunk(self.world)), send, group=self.group)
        out = [torch.empty((t.shape[0], t[0].numel()), dtype=torch.bfloat16, device=device) for t in like]
        cursor = [r * slot for r in range(self.world)]
        for m in self.matrices:  # each owner's slot holds its matrices in `owned` order
            n = m.shape.numel()
            out[m.param][m.start : m.stop] = recv[cursor[m.owner] : cursor[m.owner] + n].view(
                m.stop - m.start, -1
            )
            cursor[m.owner] += n
        transient = sum(b.numel() * b.element_size() for b in [send, recv, *out])
        return [o.view(t.shape) for o, t in zip(out, like, strict=True)], transient


def _coordinates(mesh: DeviceMesh) -> list[tuple[tuple[int, ...], int]]:
    """(coordinate, global rank) of every rank of the mesh."""
    grid = mesh.mesh
    return [(tuple(int(i) for i in index), int(grid[index])) for index in _indices(grid.shape)]


def _indices(shape: Sequence[int]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for n in shape:
        out = [(*prefix, i) for prefix in out for i in range(n)]
    return out


def _row_range(
    shape: torch.Size, mesh: DeviceMesh, coordinate: tuple[int, ...], placements: Sequence
) -> tuple:
    """Global rows lo..hi that the rank at `coordinate` holds (DTensor's own chunking)."""
    local, offset = _compute_local_shape_and_global_offset(
        shape, mesh.mesh.shape, list(coordinate), placements
    )
    return offset[0], offset[0] + local[0]


def mesh_key(p: DTensor) -> tuple:
    """Parameters planned together: equal meshes (DeviceMesh compares by its ranks, shape and names; two
    modules can hold two equal mesh objects), same placements."""
    return (p.device_mesh, tuple(p.placements))
