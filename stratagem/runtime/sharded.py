"""ZeRO stages 1 and 2 as an executor: shard the optimizer state, update a 1/g slice, all-gather parameters.

The pieces of one group are laid end to end in a flat buffer padded to a multiple of the shard group
size g (the data-parallel degree, or `shard_group`); rank r of a shard group owns its r-th contiguous
chunk, keeps its master copy and the optimizer state for it (an optimizer of the user's class over
that one flat tensor), and is the only rank of its group that updates it.

- Stage 2: gradients are reduce-scattered over the shard group, launched in backward as soon as the
  group's last gradient is ready; each rank keeps only its chunk of the averaged gradient.
- Stage 1: gradients are all-reduced whole over the data-parallel group (every rank's `param.grad`
  holds the average after the step, unclipped, for logging), then each rank updates its chunk.
- Hybrid (`shard_group` g < data degree): the reduce-scattered chunk is all-reduced across the groups
  (the ranks holding the same chunk), as HSDP and ZeRO++'s hpZ do; the all-gather stays inside the group.

Autograd still materializes whole gradients and every rank holds whole parameters between steps, so
the memory saved is the optimizer state's (÷ g) in both stages; stage 2's sharded gradients and stage
3's sharded parameters are FSDP2's (`runtime/fsdp.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from stratagem.ir import ShardedSynchronizer
from stratagem.runtime.comm import Comm, FlatBuffer, Team, Work, unflatten, wait
from stratagem.runtime.executor import AppliedGradient, Executor
from stratagem.runtime.plan import Piece
from stratagem.runtime.stats import StatsRecorder
from stratagem.runtime.updates import MasterUpdater


@dataclass
class ShardTeams:
    """Hybrid sharding: this rank's shard group and the ranks holding the same chunk in the other groups."""

    shard: Team
    replicate: Team


class ZeroBucket(Executor):
    kind = "sharded"

    def __init__(
        self,
        pieces: list[Piece],
        *,
        comm: Comm,
        optimizer: torch.optim.Optimizer,
        stage: int = 2,
        teams: ShardTeams | None = None,
    ) -> None:
        self.pieces = pieces
        self.comm = comm
        self.stage = stage
        self.shard = teams.shard if teams is not None else comm.world
        self.replicate = teams.replicate if teams is not None else None
        self.index = self.shard.members.index(comm.rank)
        self.shapes = [p.shape for p in pieces]
        self.total = sum(p.numel for p in pieces)
        self.chunk = math.ceil(self.total / self.shard.size)
        start = self.index * self.chunk
        own = FlatBuffer().flatten([p.value() for p in pieces], numel=self.padded_numel)[start : start + self.chunk]
        self.updater = MasterUpdater(optimizer, [pieces[0].group_index], [own])
        self.padded, self.mine, self.gathered = FlatBuffer(), FlatBuffer(), FlatBuffer()
        self._segments = _segments(pieces, start, self.chunk)
        self._pending: tuple[torch.Tensor, torch.Tensor, Work] | None = None
        self._mine: torch.Tensor | None = None

    @property
    def padded_numel(self) -> int:
        return self.chunk * self.shard.size

    @property
    def params(self) -> list[nn.Parameter]:
        return list({id(p.param): p.param for p in self.pieces}.values())

    def launch(self, stats: StatsRecorder) -> None:
        flat = self.padded.flatten([piece.grad() for piece in self.pieces], numel=self.padded_numel)
        stats.add_bytes(self.kind, flat.numel() * flat.element_size())
        if self.stage == 1:
            self._pending = (flat, flat, self.comm.world.all_reduce(flat, async_op=True))
            return
        mine = self.mine.empty(self.chunk, flat)
        self._pending = (flat, mine, self.shard.reduce_scatter(mine, flat, async_op=True))

    def settle(self, stats: StatsRecorder) -> None:
        if self._pending is None:
            raise RuntimeError("settle() before launch()")
        (flat, mine, work), self._pending = self._pending, None
        with stats.waiting(self.kind):
            wait(work)
            if self.stage == 2 and self.replicate is not None:
                wait(self.replicate.all_reduce(mine))
        with stats.updating():
            if self.stage == 1:
                flat.div_(self.comm.world_size)
                with torch.no_grad():
                    for piece, grad in zip(self.pieces, unflatten(flat[: self.total], self.shapes), strict=True):
                        piece.grad().copy_(grad)
                mine = flat[self.index * self.chunk : (self.index + 1) * self.chunk]
            else:
                mine.div_(self.comm.world_size)
        self._mine = mine

    def applied_gradients(self) -> list[AppliedGradient]:
        if self._mine is None:
            return []
        owners = self.replicate.size if self.replicate is not None else 1
        mine = self._mine
        return [AppliedGradient(param, mine[first:end], owners) for param, first, end in self._segments]

    def apply(self, stats: StatsRecorder) -> None:
        if self._mine is None:
            raise RuntimeError("apply() before settle()")
        mine, self._mine = self._mine, None
        with stats.updating():
            self.updater.step([mine])
        master = self.updater.masters[0]
        dtype = self.pieces[0].value().dtype
        sent = master if master.dtype == dtype else master.to(dtype)
        gathered = self.gathered.empty(self.padded_numel, sent)
        stats.add_bytes(self.kind, sent.numel() * sent.element_size())
        with stats.waiting(self.kind):
            self.shard.all_gather_flat(gathered, sent)
        with torch.no_grad():
            for piece, value in zip(self.pieces, unflatten(gathered[: self.total], self.shapes), strict=True):
                piece.value().copy_(value)


def _segments(pieces: list[Piece], start: int, length: int) -> list[tuple[nn.Parameter, int, int]]:
    """Where each piece's elements fall in the chunk [start, start + length) of the flat buffer, as
    (parameter, first, end) offsets into the chunk; pieces outside it are left out."""
    out = []
    offset = 0
    for piece in pieces:
        first, end = max(offset, start), min(offset + piece.numel, start + length)
        if first < end:
            out.append((piece.param, first - start, end - start))
        offset += piece.numel
    return out


def apply_sharded(
    entries: list[tuple[Piece, ShardedSynchronizer]],
    *,
    comm: Comm,
    optimizer: torch.optim.Optimizer,
    teams: ShardTeams | None = None,
) -> list[Executor]:
    """One flat ZeRO bucket per (group, stage, optimizer param group, dtype, device), in strategy order."""
    buckets: dict[tuple[object, ...], list[Piece]] = {}
    stages: dict[tuple[object, ...], int] = {}
    for piece, sync in entries:
        key = (sync.group, sync.stage, piece.group_index, piece.param.dtype, piece.param.device)
        buckets.setdefault(key, []).append(piece)
        stages[key] = sync.stage
    return [
        ZeroBucket(pieces, comm=comm, optimizer=optimizer, stage=stages[key], teams=teams)
        for key, pieces in buckets.items()
    ]
