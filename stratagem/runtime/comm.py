"""Teams of ranks and the collectives the executors use, in the process group's own rank numbering.

torch.distributed names ranks globally while a strategy names them by position in `replicas`; a Team
translates, and short-circuits collectives among one rank so that single-rank nodes cost nothing.
Sparse rows (indices + values of different lengths per rank) travel padded to the longest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

Work = dist.Work | None


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One new contiguous 1-D tensor holding every tensor, in order (what a fused collective sends)."""
    return torch.cat([t.reshape(-1) for t in tensors])


class FlatBuffer:
    """A bucket's flat tensor, kept from step to step (as DDP keeps its buckets).

    A fresh flat tensor every step is freed at the step's end, and under glibc's default settings (a
    rank the user's own launcher started) that memory goes back to the kernel, so the next step faulted
    every page in again: about 10,000 faults a step for BERT's 21 MB all-reduce bucket on two gloo ranks
    of a 2-core VM, an AllReduce step 1.45-1.49 times the undistributed one against 1.25 with the buffer
    kept (`benchmarks/trial_page_faults.py`). A buffer is only ever read within the step that filled it.
    """

    def __init__(self) -> None:
        self._tensor: torch.Tensor | None = None

    def empty(self, numel: int, like: torch.Tensor) -> torch.Tensor:
        """`numel` entries of `like`'s dtype and device, reused while those stay the same."""
        kept = self._tensor
        if kept is None or kept.numel() != numel or kept.dtype != like.dtype or kept.device != like.device:
            kept = self._tensor = torch.empty(numel, dtype=like.dtype, device=like.device)
        return kept

    def flatten(self, tensors: list[torch.Tensor], *, numel: int | None = None) -> torch.Tensor:
        """`flatten(tensors)`, written into the kept buffer, padded with zeros to `numel` entries if given."""
        total = sum(t.numel() for t in tensors)
        out = self.empty(total if numel is None else numel, tensors[0])
        torch.cat([t.reshape(-1) for t in tensors], out=out[:total])
        out[total:].zero_()
        return out


def unflatten(flat: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
    """Views of `flat` with the given shapes, the inverse of `flatten`."""
    sizes = [math.prod(s) for s in shapes]
    return [part.view(shape) for part, shape in zip(flat.split(sizes), shapes, strict=True)]


Rows = tuple[torch.Tensor, torch.Tensor]
"""A sparse gradient's touched rows: (row indices, their values)."""


@dataclass
class Team:
    """Some ranks of the runtime's process group (by group rank) and the process group connecting them."""

    members: list[int]
    global_ranks: list[int]
    group: dist.ProcessGroup | None

    @property
    def size(self) -> int:
        return len(self.members)

    def __contains__(self, rank: int) -> bool:
        return rank in self.members

    def _global(self, rank: int) -> int:
        return self.global_ranks[self.members.index(rank)]

    def reduce(self, tensor: torch.Tensor, dst: int, *, async_op: bool = False) -> Work:
        if self.size == 1:
            return None
        return dist.reduce(tensor, dst=self._global(dst), group=self.group, async_op=async_op)

    def broadcast(self, tensor: torch.Tensor, src: int, *, async_op: bool = False) -> Work:
        if self.size == 1:
            return None
        return dist.broadcast(tensor, src=self._global(src), group=self.group, async_op=async_op)

    def all_reduce(self, tensor: torch.Tensor, *, async_op: bool = False) -> Work:
        if self.size == 1:
            return None
        return dist.all_reduce(tensor, group=self.group, async_op=async_op)

    def gather(
        self, tensor: torch.Tensor, dst: int, me: int, *, async_op: bool = False
    ) -> tuple[list[torch.Tensor] | None, Work]:
        """Each member's tensor, in member order, at `dst` (None elsewhere)."""
        if self.size == 1:
            return [tensor], None
        out = [torch.empty_like(tensor) for _ in self.members] if me == dst else None
        work = dist.gather(tensor, out, dst=self._global(dst), group=self.group, async_op=async_op)
        return out, work

    def all_gather(self, tensor: torch.Tensor, *, async_op: bool = False) -> tuple[list[torch.Tensor], Work]:
        if self.size == 1:
            return [tensor], None
        out = [torch.empty_like(tensor) for _ in self.members]
        return out, dist.all_gather(out, tensor, group=self.group, async_op=async_op)

    def reduce_scatter(self, output: torch.Tensor, flat: torch.Tensor, *, async_op: bool = False) -> Work:
        if self.size == 1:
            output.copy_(flat)
            return None
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return fn(output, flat, group=self.group, async_op=async_op)

    def all_gather_flat(self, output: torch.Tensor, chunk: torch.Tensor) -> None:
        if self.size == 1:
            output.copy_(chunk)
            return
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        fn(output, chunk, group=self.group)


def wait(work: Work) -> None:
    if work is not None:
        work.wait()


class Comm:
    """The world team plus, when a strategy needs them, one team per node and a team of node leaders."""

    def __init__(
        self, group: dist.ProcessGroup | None, *, rank: int, node_of_rank: list[str], node_groups: bool
    ) -> None:
        world = dist.get_world_size(group)
        self.rank = rank
        self.world_size = world
        globals_ = [dist.get_global_rank(group, r) for r in range(world)] if group is not None else list(range(world))
        self.world = Team(list(range(world)), globals_, group)
        self.nodes: dict[str, list[int]] = {}
        for r, address in enumerate(node_of_rank):
            self.nodes.setdefault(address, []).append(r)
        self._node_of_rank = node_of_rank
        self._node_teams: dict[str, Team] = {}
        self.leaders: Team | None = None
        if node_groups:
            self._make_node_teams(globals_)

    def _make_node_teams(self, globals_: list[int]) -> None:
        # Every rank must create every group, in the same order, even the ones it is not in.
        for address, ranks in self.nodes.items():
            glob = [globals_[r] for r in ranks]
            self._node_teams[address] = Team(ranks, glob, dist.new_group(glob))
        leaders = [ranks[0] for ranks in self.nodes.values()]
        glob = [globals_[r] for r in leaders]
        self.leaders = Team(leaders, glob, dist.new_group(glob))

    def leader_of(self, rank: int) -> int:
        return self.nodes[self._node_of_rank[rank]][0]

    def node_team(self, rank: int) -> Team:
        return self._node_teams[self._node_of_rank[rank]]

    @property
    def is_leader(self) -> bool:
        return self.leader_of(self.rank) == self.rank


def coalesced_rows(
    grad: torch.Tensor | None, start: int, length: int, row_shape: torch.Size, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows [start, start + length) of a sparse gradient as (local row indices, summed values)."""
    if grad is None:
        return torch.empty(0, dtype=torch.long, device=like.device), like.new_zeros((0, *row_shape))
    if not grad.is_sparse:
        rows = grad.narrow(0, start, length)
        touched = rows.reshape(length, -1).ne(0).any(dim=1).nonzero().flatten()
        return touched, rows.index_select(0, touched)
    grad = grad.coalesce()
    idx, vals = grad.indices()[0], grad.values()
    if start == 0 and length == grad.shape[0]:  # the whole table: a mask would wait on the device to size its result
        return idx, vals
    keep = (idx >= start) & (idx < start + length)
    return idx[keep] - start, vals[keep]


def _padded(idx: torch.Tensor, vals: torch.Tensor, longest: int) -> tuple[torch.Tensor, torch.Tensor]:
    extra = longest - idx.numel()
    if extra == 0:
        return idx, vals
    return torch.cat([idx, idx.new_zeros(extra)]), torch.cat([vals, vals.new_zeros((extra, *vals.shape[1:]))])


def _counts(team: Team, ns: list[int], device: torch.device) -> list[list[int]]:
    """Every member's row counts, `[member][set]`, in one all-gather however many sets there are. A team
    of one knows them without reading the device (which would wait for every queued kernel)."""
    if team.size == 1:
        return [list(ns)]
    counts, work = team.all_gather(torch.tensor(ns, dtype=torch.long, device=device))
    wait(work)
    return [[int(n) for n in c.tolist()] for c in counts]


def gather_rows(
    team: Team, idx: torch.Tensor, vals: torch.Tensor, *, dst: int, me: int
) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Every member's rows at `dst`, in member order; only the rows each member touched travel."""
    counts = [member[0] for member in _counts(team, [idx.numel()], vals.device)]
    longest = max(counts)
    pidx, pvals = _padded(idx, vals, longest)
    all_idx, w1 = team.gather(pidx, dst, me)
    all_vals, w2 = team.gather(pvals, dst, me)
    wait(w1)
    wait(w2)
    if all_idx is None or all_vals is None:
        return None
    return [(i[:n], v[:n]) for i, v, n in zip(all_idx, all_vals, counts, strict=True)]


def all_gather_rows(team: Team, row_sets: list[Rows]) -> list[list[Rows]]:
    """Every member's rows of every set, `[set][member]`. The counts of all sets travel in one blocking
    all-gather, then every set's indices and values are in flight at once: a step waits on one round
    trip for all its sparse tables, not one per table (each blocking call also waits out the ranks'
    skew)."""
    if not row_sets:
        return []
    counts = _counts(team, [idx.numel() for idx, _ in row_sets], row_sets[0][1].device)
    pending = []
    for i, (idx, vals) in enumerate(row_sets):
        column = [member[i] for member in counts]
        pidx, pvals = _padded(idx, vals, max(column))
        all_idx, w1 = team.all_gather(pidx, async_op=True)
        all_vals, w2 = team.all_gather(pvals, async_op=True)
        pending.append((all_idx, w1, all_vals, w2, column))
    out = []
    for all_idx, w1, all_vals, w2, column in pending:
        wait(w1)
        wait(w2)
        out.append([(i[:n], v[:n]) for i, v, n in zip(all_idx, all_vals, column, strict=True)])
    return out


def broadcast_rows(
    team: Team, idx: torch.Tensor, vals: torch.Tensor, *, src: int, me: int, row_shape: torch.Size
) -> tuple[torch.Tensor, torch.Tensor]:
    """The source's rows on every member (the pull of a sparse update)."""
    count = torch.tensor([idx.numel() if me == src else 0], dtype=torch.long, device=vals.device)
    wait(team.broadcast(count, src))
    n = int(count.item())
    if me != src:
        idx = torch.empty(n, dtype=torch.long, device=vals.device)
        vals = vals.new_empty((n, *row_shape))
    if n:
        wait(team.broadcast(idx, src))
        wait(team.broadcast(vals, src))
    return idx, vals


def sum_rows(
    parts: list[tuple[torch.Tensor, torch.Tensor]], rows: int, row_shape: torch.Size
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add row sets together, coalescing repeated indices. Each set is coalesced already (as
    `coalesced_rows` returns it), so one set is its own sum."""
    if len(parts) == 1:
        return parts[0]
    idx = torch.cat([i for i, _ in parts])
    vals = torch.cat([v for _, v in parts])
    merged = torch.sparse_coo_tensor(idx.unsqueeze(0), vals, (rows, *row_shape), check_invariants=False).coalesce()
    return merged.indices()[0], merged.values()
