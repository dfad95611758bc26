"""Parameter-server executors: push gradients to the serving rank, update there, pull the new values.

Every rank keeps the whole model; the server of a variable (or shard) is the lowest rank on the
destination's node and also holds its master copy and optimizer state. One bucket per server and
setting flattens all the dense pieces it serves, so a push and a pull are one collective each.

- dense push: `reduce` to the server (or gather, when asynchronous), launched in backward;
- sparse push: only the touched rows travel, as indices + values, gathered at the server; the pull
  sends only the rows the update changed;
- local replication: the push is first reduced to the node's leader and only leaders talk to the
  server; the pull is broadcast to leaders, then inside each node;
- consistency: BSP applies the mean gradient once per step. SSP with staleness s is executed as its
  worst case, deterministically: pulls deliver the values of s updates ago, so every gradient is
  computed on parameters s steps old while the server's master stays current. ASP is executed as an
  asynchronous server would see one round of pushes: each worker's (or node's) gradient is applied
  as its own update, in rank order, so the k-th is k updates stale; pulls lag by `staleness`.
  Pushes and pulls are still collectives, so no rank ever runs ahead of another: the staleness is
  real in the arithmetic, not in the wall clock.
"""

from __future__ import annotations

from collections import deque

import torch
from torch import nn

from stratagem.ir import PSSynchronizer
from stratagem.runtime.comm import (
    Comm,
    FlatBuffer,
    Rows,
    Team,
    Work,
    broadcast_rows,
    coalesced_rows,
    gather_rows,
    sum_rows,
    unflatten,
    wait,
)
from stratagem.runtime.executor import AppliedGradient, Executor
from stratagem.runtime.plan import Piece
from stratagem.runtime.stats import StatsRecorder
from stratagem.runtime.updates import MasterUpdater


def _updater(optimizer: torch.optim.Optimizer, pieces: list[Piece], *, flat: bool = False) -> MasterUpdater:
    return MasterUpdater(optimizer, [p.group_index for p in pieces], [p.value() for p in pieces], flat=flat)


class _Route:
    """Who talks to whom for one server: directly, or through node leaders (local replication)."""

    def __init__(self, comm: Comm, server: int, *, replicate: bool) -> None:
        self.comm = comm
        self.server = server
        self.replicate = replicate
        self.me = comm.rank
        self.is_server = comm.rank == server
        self.leader = comm.leader_of(comm.rank) if replicate else comm.rank

    @property
    def node(self) -> Team:
        return self.comm.node_team(self.me)

    @property
    def upper(self) -> Team:
        """The team that reaches the server: every rank, or the node leaders."""
        leaders = self.comm.leaders
        return leaders if self.replicate and leaders is not None else self.comm.world

    @property
    def in_upper(self) -> bool:
        return self.me in self.upper

    @property
    def node_size(self) -> int:
        return self.node.size if self.replicate else 1


class DensePSBucket(Executor):
    kind = "ps"

    def __init__(
        self, pieces: list[Piece], *, server: int, sync: PSSynchronizer, comm: Comm, optimizer: torch.optim.Optimizer
    ) -> None:
        self.pieces = pieces
        self.route = _Route(comm, server, replicate=sync.local_replication)
        self.asynchronous = not sync.sync
        self.lag = sync.staleness
        self.shapes = [p.shape for p in pieces]
        self.updater = _updater(optimizer, pieces, flat=True) if self.route.is_server else None
        self.versions: deque[torch.Tensor] = deque([self._version()]) if self.updater else deque()
        self.pushed, self.pulled = FlatBuffer(), FlatBuffer()
        self._pending: tuple[torch.Tensor, Work, list[torch.Tensor] | None] | None = None
        self._pushes: list[torch.Tensor] = []

    @property
    def params(self) -> list[nn.Parameter]:
        return list({id(p.param): p.param for p in self.pieces}.values())

    def launch(self, stats: StatsRecorder) -> None:
        route = self.route
        flat = self.pushed.flatten([piece.grad() for piece in self.pieces])
        stats.add_bytes(self.kind, flat.numel() * flat.element_size())
        if route.replicate:
            self._pending = (flat, route.node.reduce(flat, route.leader, async_op=True), None)
        elif self.asynchronous:
            gathered, work = route.upper.gather(flat, route.server, route.me, async_op=True)
            self._pending = (flat, work, gathered)
        else:
            self._pending = (flat, route.upper.reduce(flat, route.server, async_op=True), None)

    def settle(self, stats: StatsRecorder) -> None:
        with stats.waiting(self.kind):
            self._pushes = self._collect()

    def applied_gradients(self) -> list[AppliedGradient]:
        return [
            AppliedGradient(piece.param, grad)
            for push in self._pushes
            for piece, grad in zip(self.pieces, unflatten(push, self.shapes), strict=True)
        ]

    def apply(self, stats: StatsRecorder) -> None:
        pushes, self._pushes = self._pushes, []
        if self.updater is not None:
            with stats.updating():
                for push in pushes:
                    self.updater.step(unflatten(push, self.shapes))
                if self.lag:
                    self.versions.append(self._version())
                    while len(self.versions) > self.lag + 1:
                        self.versions.popleft()
                elif self._cast_on_pull:
                    self.versions[0] = self._version()
        with stats.waiting(self.kind):
            values = self._pull()
        with torch.no_grad():
            for piece, value in zip(self.pieces, unflatten(values, self.shapes), strict=True):
                piece.value().copy_(value)

    @property
    def _cast_on_pull(self) -> bool:
        """fp32 masters of a 16-bit model: pulls send them in the model's dtype, a copy each step."""
        return self.updater is not None and self.updater.masters[0].dtype != self.pieces[0].value().dtype

    def _version(self) -> torch.Tensor:
        """The values pulls send: under BSP the masters' own buffer, updated in place (no copy on the
        server's critical path); with staleness, or cast to a 16-bit model's dtype, a copy, kept until
        `lag` newer ones exist."""
        assert self.updater is not None and self.updater.flat is not None
        if self._cast_on_pull:
            return self.updater.flat.to(self.pieces[0].value().dtype)
        return self.updater.flat.clone() if self.lag else self.updater.flat

    def _collect(self) -> list[torch.Tensor]:
        """The server's list of gradients to apply, in order; empty on other ranks."""
        if self._pending is None:
            raise RuntimeError("settle() before launch()")
        (flat, work, gathered), self._pending = self._pending, None
        route, world = self.route, self.route.comm.world_size
        wait(work)
        if route.replicate:
            if not route.in_upper:
                return []
            if self.asynchronous:
                gathered, _ = route.upper.gather(flat / route.node_size, route.server, route.me)
            else:
                wait(route.upper.reduce(flat, route.server))
        if not route.is_server:
            return []
        return list(gathered) if self.asynchronous and gathered is not None else [flat.div_(world)]

    def _pull(self) -> torch.Tensor:
        route = self.route
        if route.is_server:
            # A broadcast's root only reads its buffer; a server that also receives one would overwrite a kept version.
            values = self.versions[0] if route.leader == route.me else self.versions[0].clone()
        else:
            values = self.pulled.empty(sum(p.numel for p in self.pieces), self.pieces[0].param)
        if route.in_upper:
            wait(route.upper.broadcast(values, route.server))
        if route.replicate:
            wait(route.node.broadcast(values, route.leader))
        return values


class SparsePSShard(Executor):
    """A sparse-gradient variable (or row-range shard) on a server: rows in, changed rows out."""

    kind = "ps"

    def __init__(
        self, piece: Piece, *, server: int, sync: PSSynchronizer, comm: Comm, optimizer: torch.optim.Optimizer
    ) -> None:
        self.piece = piece
        self.route = _Route(comm, server, replicate=sync.local_replication)
        self.asynchronous = not sync.sync
        self.lag = sync.staleness
        self.row_shape = piece.param.shape[1:]
        self.updater = _updater(optimizer, [piece]) if self.route.is_server else None
        self.deltas: deque[Rows] = deque()
        self._pushes: list[Rows] = []

    @property
    def params(self) -> list[nn.Parameter]:
        return [self.piece.param]

    def settle(self, stats: StatsRecorder) -> None:
        piece = self.piece
        idx, vals = coalesced_rows(piece.param.grad, piece.start, piece.length, self.row_shape, piece.param.detach())
        stats.add_bytes(self.kind, idx.numel() * idx.element_size() + vals.numel() * vals.element_size())
        with stats.waiting(self.kind):
            self._pushes = self._collect(idx, vals)

    def applied_gradients(self) -> list[AppliedGradient]:
        return [AppliedGradient(self.piece.param, vals) for _, vals in self._pushes]

    def apply(self, stats: StatsRecorder) -> None:
        pushes, self._pushes = self._pushes, []
        piece = self.piece
        if self.updater is not None:
            with stats.updating():
                self.deltas.append(self._apply(pushes))
        value = piece.value()
        empty = (torch.zeros(0, dtype=torch.long, device=value.device), value.new_zeros((0, *self.row_shape)))
        send = self.deltas.popleft() if len(self.deltas) > self.lag else empty
        with stats.waiting(self.kind):
            idx, vals = self._pull(*send)
        if idx.numel():
            with torch.no_grad():
                piece.value().index_copy_(0, idx, vals)

    def _collect(self, idx: torch.Tensor, vals: torch.Tensor) -> list[Rows]:
        route, rows = self.route, self.piece.length
        if route.replicate:
            parts = gather_rows(route.node, idx, vals, dst=route.leader, me=route.me)
            if parts is None or not route.in_upper:
                return []
            idx, vals = sum_rows(parts, rows, self.row_shape)
            if self.asynchronous:
                vals = vals / route.node_size
        parts = gather_rows(route.upper, idx, vals, dst=route.server, me=route.me)
        if parts is None:
            return []
        if self.asynchronous:
            return parts
        idx, vals = sum_rows(parts, rows, self.row_shape)
        return [(idx, vals / route.comm.world_size)]

    def _apply(self, pushes: list[Rows]) -> Rows:
        """Step the master once per push; return the rows whose values changed and their new values."""
        assert self.updater is not None  # only the server applies
        master = self.updater.masters[0]
        touched = torch.cat([idx for idx, _ in pushes]) if pushes else master.new_zeros(0, dtype=torch.long)
        candidates = _rows_that_may_change(self.updater, master, touched)
        before = master.index_select(0, candidates)
        for idx, vals in pushes:
            grad = torch.sparse_coo_tensor(idx.unsqueeze(0), vals, master.shape, check_invariants=False)
            self.updater.step([grad])
        after = master.index_select(0, candidates)
        changed = candidates[after.ne(before).reshape(candidates.numel(), -1).any(dim=1)]
        return changed, master.index_select(0, changed).to(self.piece.value().dtype)

    def _pull(self, idx: torch.Tensor, vals: torch.Tensor) -> Rows:
        route = self.route
        if route.in_upper:
            idx, vals = broadcast_rows(route.upper, idx, vals, src=route.server, me=route.me, row_shape=self.row_shape)
        if route.replicate:
            idx, vals = broadcast_rows(route.node, idx, vals, src=route.leader, me=route.me, row_shape=self.row_shape)
        return idx, vals


# Optimizers that, given a sparse gradient, change only the rows it touches (their state may be dense).
_TOUCHED_ROWS_ONLY = (torch.optim.Adagrad, torch.optim.SparseAdam)


def _rows_that_may_change(updater: MasterUpdater, master: torch.Tensor, touched: torch.Tensor) -> torch.Tensor:
    """Rows a sparse update can change, so only those are compared and pulled, not the whole table.

    The touched rows, plus the rows held in sparse optimizer state (SGD's sparse momentum keeps
    moving rows touched earlier); every row when the optimizer keeps dense state we cannot reason about.
    """
    clone = next(iter(updater.clones.values()))
    rows = [touched]
    if type(clone) not in _TOUCHED_ROWS_ONLY:
        for value in clone.state.get(master, {}).values():
            if isinstance(value, torch.Tensor) and value.is_sparse:
                rows.append(value.coalesce().indices()[0])
            elif isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == master.shape[0]:
                return torch.arange(master.shape[0], device=master.device)
    return torch.unique(torch.cat(rows))


def apply_ps(
    dense: list[tuple[Piece, PSSynchronizer, int]],
    sparse: list[tuple[Piece, PSSynchronizer, int]],
    *,
    comm: Comm,
    optimizer: torch.optim.Optimizer,
) -> list[Executor]:
    """One bucket per (server, replication, consistency, dtype) for dense pieces; one executor per sparse piece."""
    buckets: dict[tuple[object, ...], list[tuple[Piece, PSSynchronizer, int]]] = {}
    for piece, sync, server in dense:
        key = (server, sync.local_replication, sync.sync, sync.staleness, piece.param.dtype, piece.param.device)
        buckets.setdefault(key, []).append((piece, sync, server))
    executors: list[Executor] = []
    for members in buckets.values():
        _, sync, server = members[0]
        executors.append(
            DensePSBucket([m[0] for m in members], server=server, sync=sync, comm=comm, optimizer=optimizer)
        )
    for piece, sync, server in sparse:
        executors.append(SparsePSShard(piece, server=server, sync=sync, comm=comm, optimizer=optimizer))
    return executors
