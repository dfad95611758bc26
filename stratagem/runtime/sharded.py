"""ZeRO-style sharded executor: reduce-scatter gradients, update a 1/p slice, all-gather parameters.

The pieces of one group are laid end to end in a flat buffer padded to a multiple of the world size;
rank r owns the r-th contiguous chunk, keeps its master copy and the optimizer state for it (an
optimizer of the user's class over that one flat tensor), and is the only rank that updates it. The
reduce-scatter is launched in backward as soon as the group's last gradient is ready. Autograd still
materializes whole gradients and every rank still holds whole parameters, so this is ZeRO stage 1
in memory (optimizer state ÷ p) with the communication pattern of stages 2 and 3.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from stratagem.ir import ShardedSynchronizer
from stratagem.runtime.comm import Comm, FlatBuffer, Work, unflatten, wait
from stratagem.runtime.executor import Executor
from stratagem.runtime.plan import Piece
from stratagem.runtime.stats import StatsRecorder
from stratagem.runtime.updates import MasterUpdater


class ZeroBucket(Executor):
    kind = "sharded"

    def __init__(self, pieces: list[Piece], *, comm: Comm, optimizer: torch.optim.Optimizer) -> None:
        self.pieces = pieces
        self.comm = comm
        self.shapes = [p.shape for p in pieces]
        self.total = sum(p.numel for p in pieces)
        self.chunk = math.ceil(self.total / comm.world_size)
        start = comm.rank * self.chunk
        own = FlatBuffer().flatten([p.value() for p in pieces], numel=self.chunk * comm.world_size)[
            start : start + self.chunk
        ]
        self.updater = MasterUpdater(optimizer, [pieces[0].group_index], [own])
        self.padded, self.mine, self.gathered = FlatBuffer(), FlatBuffer(), FlatBuffer()
        self._pending: tuple[torch.Tensor, Work] | None = None

    @property
    def params(self) -> list[nn.Parameter]:
        return list({id(p.param): p.param for p in self.pieces}.values())

    def launch(self, stats: StatsRecorder) -> None:
        flat = self.padded.flatten([piece.grad() for piece in self.pieces], numel=self.chunk * self.comm.world_size)
        mine = self.mine.empty(self.chunk, flat)
        stats.add_bytes(self.kind, flat.numel() * flat.element_size())
        self._pending = (mine, self.comm.world.reduce_scatter(mine, flat, async_op=True))

    def finish(self, stats: StatsRecorder) -> None:
        if self._pending is None:
            raise RuntimeError("finish() before launch()")
        (mine, work), self._pending = self._pending, None
        with stats.waiting(self.kind):
            wait(work)
        with stats.updating():
            self.updater.step([mine.div_(self.comm.world_size)])
        master = self.updater.masters[0]
        gathered = self.gathered.empty(self.chunk * self.comm.world_size, master)
        stats.add_bytes(self.kind, master.numel() * master.element_size())
        with stats.waiting(self.kind):
            self.comm.world.all_gather_flat(gathered, master)
        with torch.no_grad():
            for piece, value in zip(self.pieces, unflatten(gathered[: self.total], self.shapes), strict=True):
                piece.value().copy_(value)


def apply_sharded(
    entries: list[tuple[Piece, ShardedSynchronizer]], *, comm: Comm, optimizer: torch.optim.Optimizer
) -> list[Executor]:
    """One flat ZeRO bucket per (group, optimizer param group, dtype, device), in strategy order."""
    buckets: dict[tuple[object, ...], list[Piece]] = {}
    for piece, sync in entries:
        key = (sync.group, piece.group_index, piece.param.dtype, piece.param.device)
        buckets.setdefault(key, []).append(piece)
    return [ZeroBucket(pieces, comm=comm, optimizer=optimizer) for pieces in buckets.values()]
