"""The optimizer `distribute` hands back: the user's optimizer, plus the synchronization it needs.

It shares the wrapped optimizer's param groups and state (so schedulers, `zero_grad` and
`state_dict` behave as usual) and its `step()` first settles every executor (waits on all-reduce
buckets and server pushes: every averaged gradient is then in place), clips the step's gradient to
its global norm when asked (`clipping.py`), runs server and shard updates, then lets the user's
optimizer update only the parameters every rank updates itself. Parameters updated elsewhere have
their gradient hidden from it for the call, which every torch optimizer reads as "skip this
parameter". Under `amp-fp16` a step whose gradients overflowed on any rank completes its
communication and updates nothing (`LossScaler`); it is not clipped either, and the ranks agree on
that before the norm's collective, so they issue the same collectives.
A 16-bit parameter (a `bf16` model's) is stepped through an fp32 master copy by a clone of the user's
optimizer (`updates.MasterUpdater`), so its optimizer state is fp32 and lives with the clone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from stratagem.runtime.clipping import GradClipper
from stratagem.runtime.executor import GradReadiness
from stratagem.runtime.multi_optimizer import closure_loss
from stratagem.runtime.stats import StatsRecorder, SyncStats
from stratagem.runtime.updates import (
    HALF_DTYPES,
    MasterUpdater,
    ReplicatedShards,
    scaling_updates,
    skipping_updates,
)

if TYPE_CHECKING:
    from stratagem.runtime.precision import LossScaler


class DistributedOptimizer(torch.optim.Optimizer):
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        readiness: GradReadiness,
        replicated: ReplicatedShards | None,
        local_params: list[nn.Parameter],
        stats: StatsRecorder,
        scaler: LossScaler | None = None,
        clipper: GradClipper | None = None,
    ) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        super().__init__(params, dict(optimizer.defaults))
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self.optimizer = optimizer
        self._readiness = readiness
        self._replicated = replicated
        self._full = [p for p in local_params if p.dtype not in HALF_DTYPES]
        self._local = {id(p) for p in self._full}
        self._half = [p for p in local_params if p.dtype in HALF_DTYPES]
        self._masters = _master_updater(optimizer, self._half) if self._half else None
        self._stats = stats
        self.scaler = scaler
        """amp-fp16's loss scale (its `scale` and `skipped` steps), None under any other precision."""
        self._clipper = clipper
        self._norm: torch.Tensor | None = None

    @property
    def max_grad_norm(self) -> float | None:
        """The global gradient norm each step is clipped to, None when steps are not clipped."""
        return self._clipper.max_norm if self._clipper is not None else None

    @property
    def last_grad_norm(self) -> float | None:
        """The last step's global gradient norm before clipping; None without clipping and after a step
        the loss scaler skipped. Reading it waits for the step's device work."""
        return float(self._norm) if self._norm is not None else None

    @property
    def sync_stats(self) -> SyncStats | None:
        """Timing of the last completed step (None before the first)."""
        return self._stats.last

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure_loss(closure)
        self._stats.begin_step()
        apply = self.scaler.ready() if self.scaler is not None else True
        with skipping_updates(not apply):
            self._readiness.settle_all()
            self._norm = None
            coefficient = self._clip(self._clipper) if apply and self._clipper is not None else None
            with scaling_updates(coefficient):
                self._readiness.apply_all()
                with self._stats.updating():
                    if apply and self._replicated is not None:
                        self._replicated.step()
                    if apply:
                        self._local_step()
        self._stats.end_step()
        return loss

    def _clip(self, clipper: GradClipper) -> torch.Tensor:
        """Clip this step's gradients to the global norm; the coefficient is for the master updates."""
        mastered = [(p, p.grad) for p in self._half if p.grad is not None]
        if self._replicated is not None:
            mastered += [(piece.param, piece.grad()) for piece in self._replicated.pieces]
        self._norm, coefficient = clipper.clip(self._full, mastered, self._readiness.executors, self._stats)
        return coefficient

    def _local_step(self) -> None:
        hidden = []
        for group in self.param_groups:
            for p in group["params"]:
                if id(p) not in self._local and p.grad is not None:
                    hidden.append((p, p.grad))
                    p.grad = None
        try:
            self.optimizer.step()
        finally:
            for p, grad in hidden:
                p.grad = grad
        if self._masters is not None:
            self._masters.step([p.grad for p in self._half])
            for p, master in zip(self._half, self._masters.masters, strict=True):
                p.copy_(master)

    def detach(self) -> None:
        """Remove the gradient hooks (the model trains locally again)."""
        self._readiness.remove()

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.optimizer!r})"


def _master_updater(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> MasterUpdater:
    """fp32 masters of 16-bit parameters, each stepped with its own param group's hyper-parameters."""
    group_of = {id(p): index for index, group in enumerate(optimizer.param_groups) for p in group["params"]}
    return MasterUpdater(optimizer, [group_of[id(p)] for p in params], list(params))
