"""All-reduce executors: fusion groups as DDP-style buckets, hierarchical buckets, sparse rows.

A bucket holds the pieces of one fusion group that share a compressor (and dtype, and algorithm);
it is flattened and launched asynchronously the moment its last gradient is ready in backward. The
averaged gradient is written back into `param.grad`, where an optimizer finds it as usual.
"""

from __future__ import annotations

import torch
from torch import nn

from stratagem.ir import AllReduceSynchronizer
from stratagem.runtime.comm import Comm, FlatBuffer, Work, all_gather_rows, coalesced_rows, sum_rows, unflatten, wait
from stratagem.runtime.compression import Reducer, apply_compression
from stratagem.runtime.executor import Executor
from stratagem.runtime.plan import Piece
from stratagem.runtime.stats import StatsRecorder


def _unique_params(pieces: list[Piece]) -> list[nn.Parameter]:
    return list({id(p.param): p.param for p in pieces}.values())


class AllReduceBucket(Executor):
    kind = "allreduce"

    def __init__(self, pieces: list[Piece], reducer: Reducer) -> None:
        self.pieces = pieces
        self.reducer = reducer

    @property
    def params(self) -> list[nn.Parameter]:
        return _unique_params(self.pieces)

    def launch(self, stats: StatsRecorder) -> None:
        self.reducer.start([piece.grad() for piece in self.pieces])

    def settle(self, stats: StatsRecorder) -> None:
        with stats.waiting(self.kind):
            averaged = self.reducer.finish()
        stats.add_bytes(self.kind, self.reducer.wire_bytes)
        for piece, value in zip(self.pieces, averaged, strict=True):
            piece.grad().copy_(value)


class HierarchicalBucket(Executor):
    """Reduce inside each node to its leader, all-reduce among leaders, broadcast inside each node."""

    kind = "allreduce"

    def __init__(self, pieces: list[Piece], comm: Comm) -> None:
        self.pieces = pieces
        self.comm = comm
        self.buffer = FlatBuffer()
        self._pending: tuple[torch.Tensor, Work] | None = None

    @property
    def params(self) -> list[nn.Parameter]:
        return _unique_params(self.pieces)

    def launch(self, stats: StatsRecorder) -> None:
        flat = self.buffer.flatten([piece.grad() for piece in self.pieces])
        node = self.comm.node_team(self.comm.rank)
        self._pending = (flat, node.reduce(flat, self.comm.leader_of(self.comm.rank), async_op=True))
        stats.add_bytes(self.kind, flat.numel() * flat.element_size())

    def settle(self, stats: StatsRecorder) -> None:
        if self._pending is None:
            raise RuntimeError("settle() before launch()")
        (flat, work), self._pending = self._pending, None
        comm, leader = self.comm, self.comm.leader_of(self.comm.rank)
        with stats.waiting(self.kind):
            wait(work)
            if comm.is_leader and comm.leaders is not None:
                wait(comm.leaders.all_reduce(flat))
            wait(comm.node_team(comm.rank).broadcast(flat, leader))
        flat /= comm.world_size
        for piece, value in zip(self.pieces, unflatten(flat, [p.shape for p in self.pieces]), strict=True):
            piece.grad().copy_(value)


class SparseAllReduce(Executor):
    """The sparse-gradient parameters: only their touched rows (indices + values) are all-gathered and
    summed, all tables exchanging together (`comm.all_gather_rows`)."""

    kind = "allreduce"

    def __init__(self, pieces: list[Piece], comm: Comm) -> None:
        self.pieces = pieces
        self.comm = comm

    @property
    def params(self) -> list[nn.Parameter]:
        return [piece.param for piece in self.pieces]

    def settle(self, stats: StatsRecorder) -> None:
        own = []
        for piece in self.pieces:
            param = piece.param
            idx, vals = coalesced_rows(param.grad, 0, param.shape[0], param.shape[1:], param.detach())
            stats.add_bytes(self.kind, idx.numel() * idx.element_size() + vals.numel() * vals.element_size())
            own.append((idx, vals))
        with stats.waiting(self.kind):
            gathered = all_gather_rows(self.comm.world, own)
        for piece, parts in zip(self.pieces, gathered, strict=True):
            param = piece.param
            idx, vals = sum_rows(parts, param.shape[0], param.shape[1:])
            param.grad = torch.sparse_coo_tensor(
                idx.unsqueeze(0), vals / self.comm.world_size, param.shape, check_invariants=False
            )


def _bucket_key(piece: Piece, sync: AllReduceSynchronizer) -> tuple[object, ...]:
    return (
        sync.group,
        sync.compressor.model_dump_json(),
        sync.algorithm == "hierarchical",
        piece.param.dtype,
        piece.param.device,
    )


def apply_allreduce(
    entries: list[tuple[Piece, AllReduceSynchronizer]], sparse: list[Piece], *, comm: Comm, seed: int = 0
) -> list[Executor]:
    """Buckets by fusion group (split where compressor, dtype or algorithm differ), then sparse parameters."""
    buckets: dict[tuple[object, ...], list[tuple[Piece, AllReduceSynchronizer]]] = {}
    for piece, sync in entries:
        buckets.setdefault(_bucket_key(piece, sync), []).append((piece, sync))
    executors: list[Executor] = []
    for index, members in enumerate(buckets.values()):
        pieces = [piece for piece, _ in members]
        sync = members[0][1]
        if sync.algorithm == "hierarchical":
            executors.append(HierarchicalBucket(pieces, comm))
            continue
        what = f"all-reduce group {sync.group} ({', '.join(p.label for p in pieces[:3])}{', ...' if len(pieces) > 3 else ''})"
        reducer = apply_compression(
            sync.compressor, team=comm.world, what=what, seed=seed + index, probe_device=pieces[0].param.device
        )
        executors.append(AllReduceBucket(pieces, reducer))
    if sparse:
        executors.append(SparseAllReduce(sparse, comm))
    return executors
