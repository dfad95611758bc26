"""ZeRO stage 3 as FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters, gradients and optimizer
state sharded over the data-parallel group, parameters all-gathered before each block's forward and
backward and freed after, gradients reduce-scattered (Zhao et al. 2023; torchtitan's `apply_fsdp`).

Which variables: those whose synchronizer is `sharded` with `stage: 3`. Every numbered block holding
one is its own FSDP unit (one all-gather per block, prefetched by FSDP2), then the root takes the rest;
every other parameter is passed as `ignored_params` and stays with the per-variable executors
(all-reduce, parameter server, ZeRO-1/2), so a strategy can mix them. With `shard_group` g the mesh is
2-D (replicate × shard): each group of g consecutive data-parallel ranks shards, and the shards'
gradients are all-reduced across groups (HSDP). FSDP2 replaces the parameters with sharded DTensor
ones, so the optimizer is pointed at them (`tensor_parallel.retarget_optimizer`); they are updated by
the user's optimizer on every rank, each on its own shard.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from stratagem.errors import UnsupportedStrategyError
from stratagem.ir import ShardedSynchronizer, Strategy
from stratagem.runtime.recompute import numbered_blocks


def fully_sharded_variables(strategy: Strategy) -> set[str]:
    """Names of the variables FSDP2 shards (stage 3), after refusing a stage-3 variable FSDP2 cannot hold
    beside other synchronizers: a partitioned one (FSDP2 shards dimension 0 itself)."""
    names: set[str] = set()
    for i, config in enumerate(strategy.variables):
        stages = [isinstance(s, ShardedSynchronizer) and s.stage == 3 for s in config.synchronizers]
        if not any(stages):
            continue
        if config.partition is not None and config.partition.shards > 1:
            raise UnsupportedStrategyError(
                f"variables[{i}] ({config.var_name}): ZeRO stage 3 is FSDP2, which shards the whole variable along "
                "dimension 0 itself; give it no partition"
            )
        names.add(config.var_name)
    return names


def shard_group_of(strategy: Strategy) -> int | None:
    """The strategy's one hybrid shard group size (the IR allows one per strategy), or None."""
    for config in strategy.variables:
        for sync in config.synchronizers:
            if isinstance(sync, ShardedSynchronizer) and sync.shard_group is not None:
                return sync.shard_group
    return None


def apply_fsdp(module: nn.Module, names: set[str], mesh: Any, *, mp_policy: Any) -> dict[int, nn.Parameter]:
    """Shard `names` of `module` with FSDP2 over `mesh` (1-D, or 2-D replicate × shard); return old
    parameter id -> new parameter."""
    from torch.distributed.fsdp import fully_shard

    before = dict(module.named_parameters())
    managed = {id(before[name]) for name in names if name in before}
    if not managed:
        return {}
    ignored = {p for p in before.values() if id(p) not in managed}
    for block in numbered_blocks(module):
        unit = module.get_submodule(block)
        if any(id(p) in managed for p in unit.parameters()):
            fully_shard(unit, mesh=mesh, mp_policy=mp_policy, ignored_params=ignored)
    fully_shard(module, mesh=mesh, mp_policy=mp_policy, ignored_params=ignored)
    after = dict(module.named_parameters())
    return {id(before[name]): after[name] for name in before if after[name] is not before[name]}
