"""The executors of a resolved data-parallel plan, composed behind one DistributedOptimizer.

Plain data parallelism (`distribute`) and the data-parallel part of a tensor or pipeline mesh
(`hybrid`) synchronize the same way, so they share this one composition. Executors settle and apply
at each step in list order, which must be the same on every rank because collectives match by issue
order: all-reduce buckets first (already in flight since backward, settling them only waits), then
ZeRO buckets (in flight too; their all-gathers are the only new traffic), then parameter servers last
(their pulls wait on server arithmetic and nothing is queued behind them). The user's optimizer
runs after all of them: it needs every averaged gradient, and the parameters it updates are disjoint
from those the executors update.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from stratagem.runtime.allreduce import apply_allreduce
from stratagem.runtime.clipping import GradClipper
from stratagem.runtime.comm import Comm
from stratagem.runtime.executor import Executor, GradReadiness
from stratagem.runtime.optimizer import DistributedOptimizer
from stratagem.runtime.plan import Plan
from stratagem.runtime.ps import apply_ps
from stratagem.runtime.sharded import ShardTeams, apply_sharded
from stratagem.runtime.stats import StatsRecorder
from stratagem.runtime.updates import ReplicatedShards

if TYPE_CHECKING:
    from stratagem.runtime.precision import LossScaler


def apply_synchronization(
    plan: Plan,
    optimizer: torch.optim.Optimizer,
    *,
    comm: Comm,
    device: torch.device,
    launch_in_backward: bool = True,
    fully_sharded: list[nn.Parameter] | None = None,
    scaler: LossScaler | None = None,
    shard_teams: ShardTeams | None = None,
    clipper: GradClipper | None = None,
) -> DistributedOptimizer:
    """The user's optimizer wrapped so its step first synchronizes every variable as `plan` says.
        `launch_in_backward=False` launches every collective at the step instead (gradients that
        accumulate over micro-batches are not ready when backward first produces them). `fully_sharded`
        parameters (FSDP2's, synchronized by FSDP itself) are stepped by the user's optimizer; `shard_teams`
    are the hybrid shard groups of ZeRO-1/2 buckets; `clipper` clips each step to a global gradient norm."""
    executors: list[Executor] = []
    executors += apply_allreduce(plan.allreduce, plan.sparse_allreduce, comm=comm)
    executors += apply_sharded(plan.sharded, comm=comm, optimizer=optimizer, teams=shard_teams)
    executors += apply_ps(plan.ps, plan.sparse_ps, comm=comm, optimizer=optimizer)
    replicated = ReplicatedShards(optimizer, plan.replicated) if plan.replicated else None
    stats = StatsRecorder(device)
    readiness = GradReadiness(executors, stats)
    if not launch_in_backward:
        readiness.remove()
    return DistributedOptimizer(
        optimizer,
        readiness=readiness,
        replicated=replicated,
        local_params=plan.local + list(fully_sharded or []),
        stats=stats,
        scaler=scaler,
        clipper=clipper,
    )
