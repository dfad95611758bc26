"""Resolve a Strategy against a live model and optimizer, refusing what cannot run before any step.

The plan cuts every trainable parameter into pieces (one per shard, the whole tensor when it is not
partitioned), pairs each piece with its synchronizer and, for parameter servers, the rank that serves
it. Every check that can fail happens here, without touching the process group, so a bad strategy is
refused with the variable's name on every rank before a single collective is issued.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
from torch import nn

from stratagem.errors import InvalidStrategyError, Problem, UnsupportedStrategyError
from stratagem.ir import (
    AllReduceSynchronizer,
    PSSynchronizer,
    ShardedSynchronizer,
    Strategy,
    VariableConfig,
    device_address,
    shard_sizes,
)
from stratagem.runtime.multi_optimizer import component_optimizers

SyncConfig = AllReduceSynchronizer | PSSynchronizer | ShardedSynchronizer

# Optimizers whose update of one element depends only on that element's gradient and state, so an
# optimizer running on a shard or a flat slice computes exactly what the whole-tensor one would.
ELEMENTWISE_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
    torch.optim.Adamax,
    torch.optim.ASGD,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.RMSprop,
    torch.optim.Rprop,
    torch.optim.SparseAdam,
)


@dataclass(eq=False)
class Piece:
    """A parameter or one shard of it: the unit that is synchronized and updated."""

    name: str
    param: nn.Parameter
    shard: int
    shards: int
    axis: int
    start: int
    length: int
    group_index: int
    """Index of the user's optimizer param group holding the parameter (its hyper-parameters)."""

    @property
    def whole(self) -> bool:
        return self.shards == 1

    @property
    def label(self) -> str:
        return self.name if self.whole else f"{self.name}[shard {self.shard} of {self.shards}, axis {self.axis}]"

    @property
    def shape(self) -> torch.Size:
        return self.value().shape

    @property
    def numel(self) -> int:
        return self.value().numel()

    def value(self) -> torch.Tensor:
        """A view of the piece's current values (detached, writable in place)."""
        data = local_tensor(self.param.detach())
        return data if self.whole else data.narrow(self.axis, self.start, self.length)

    def grad(self) -> torch.Tensor:
        """A view of the piece's dense gradient; a missing gradient becomes zeros, a sparse one dense."""
        param = self.param
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        elif param.grad.is_sparse:
            param.grad = param.grad.to_dense()
        grad = local_tensor(param.grad)
        return grad if self.whole else grad.narrow(self.axis, self.start, self.length)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor-parallel (DTensor) parameter's shard on this rank, as a view; any other tensor as it is.

    Data-parallel synchronizers move and update what a rank stores, so they see the local shard: the
    ranks of a data-parallel group hold the same shard of every split parameter.
    """
    dtensor = sys.modules.get("torch.distributed.tensor")  # not imported: no tensor can be a DTensor (saves ~1 s)
    if dtensor is not None and isinstance(tensor, dtensor.DTensor):
        with torch.no_grad():
            return tensor.to_local()
    return tensor


def local_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(local_tensor(tensor).shape)


@dataclass
class Plan:
    world_size: int
    rank: int
    replicas: list[str]
    node_of_rank: list[str]
    """Node address of each rank's replica: what local replication and hierarchy group by."""
    allreduce: list[tuple[Piece, AllReduceSynchronizer]] = field(default_factory=list)
    sparse_allreduce: list[Piece] = field(default_factory=list)
    """Whole sparse-gradient parameters all-reduced as rows (indices and values)."""
    ps: list[tuple[Piece, PSSynchronizer, int]] = field(default_factory=list)
    """Dense pieces served by a parameter server, with the server's rank."""
    sparse_ps: list[tuple[Piece, PSSynchronizer, int]] = field(default_factory=list)
    sharded: list[tuple[Piece, ShardedSynchronizer]] = field(default_factory=list)
    replicated: list[Piece] = field(default_factory=list)
    """All-reduced shards of parameters whose other shards are updated elsewhere: every rank updates them."""
    local: list[nn.Parameter] = field(default_factory=list)
    """Parameters every rank updates with the user's own optimizer (all shards all-reduced)."""

    @property
    def needs_node_groups(self) -> bool:
        hierarchical = any(sync.algorithm == "hierarchical" for _, sync in self.allreduce)
        replicated_ps = any(sync.local_replication for _, sync, _ in self.ps + self.sparse_ps)
        return hierarchical or replicated_ps


def sparse_parameter_names(model: nn.Module) -> set[str]:
    """Parameters whose gradients autograd produces as sparse tensors (embeddings with sparse=True)."""
    names = set()
    for module_name, module in model.named_modules():
        if isinstance(module, nn.Embedding | nn.EmbeddingBag) and module.sparse:
            names.add(f"{module_name}.weight" if module_name else "weight")
    return names


def server_rank(destination: str, replicas: list[str]) -> int | None:
    """The lowest rank whose replica is on the destination's node: that process hosts the server."""
    address = device_address(destination)
    ranks = [i for i, device in enumerate(replicas) if device_address(device) == address]
    return min(ranks) if ranks else None


def resolve_plan(
    model: nn.Module, optimizer: torch.optim.Optimizer, strategy: Strategy, *, world_size: int, rank: int
) -> Plan:
    _check_layout(strategy, world_size=world_size, rank=rank)
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    _check_coverage(strategy, params, frozen)
    groups = _group_index(optimizer)
    sparse = sparse_parameter_names(model)
    plan = Plan(
        world_size=world_size,
        rank=rank,
        replicas=list(strategy.replicas),
        node_of_rank=[device_address(d) for d in strategy.replicas],
    )
    for i, config in enumerate(strategy.variables):
        param = params[config.var_name]
        if id(param) not in groups:
            raise UnsupportedStrategyError(
                f"variable {config.var_name!r}: the parameter is not in the optimizer, so no rank could update it"
            )
        _add_variable(plan, f"variables[{i}]", config, param, groups[id(param)], sparse=config.var_name in sparse)
    _check_optimizer(plan, optimizer)
    return plan


def _check_layout(strategy: Strategy, *, world_size: int, rank: int) -> None:
    if world_size != len(strategy.replicas):
        raise UnsupportedStrategyError(
            f"the strategy has {len(strategy.replicas)} replicas (rank i runs replicas[i]) but the process group has {world_size} ranks"
        )
    if not 0 <= rank < world_size:
        raise UnsupportedStrategyError(f"rank {rank} is outside the process group of {world_size} ranks")
    mesh = strategy.effective_mesh
    if mesh.tensor > 1 or mesh.pipeline > 1:
        raise UnsupportedStrategyError(
            f"mesh {mesh.describe()}: resolve_plan plans data parallelism only (tensor and pipeline parallelism are not supported yet "
            "at this level); distribute() runs them through stratagem.runtime.hybrid"
        )


def check_coverage(strategy: Strategy, model: nn.Module) -> None:
    """Every trainable parameter of `model` has a synchronizer and every configured variable is one of them."""
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    _check_coverage(strategy, params, frozen)


def _check_coverage(strategy: Strategy, params: dict[str, nn.Parameter], frozen: set[str]) -> None:
    foreign = _foreign_strategy(strategy, params, frozen)
    if foreign is not None:
        raise InvalidStrategyError([foreign])
    problems: list[Problem] = []
    for i, config in enumerate(strategy.variables):
        where = f"variables[{i}]"
        if config.var_name in frozen:
            problems.append(
                Problem(
                    f"{where}.var_name",
                    f"{config.var_name!r} does not require grad in the model and needs no synchronizer",
                )
            )
        elif config.var_name not in params:
            problems.append(
                Problem(
                    f"{where}.var_name",
                    f"{config.var_name!r} is not a parameter of the model (model.named_parameters())",
                )
            )
        elif config.partition is not None:
            problems.extend(_partition_problems(where, config, local_shape(params[config.var_name])))
    configured = {c.var_name for c in strategy.variables}
    missing = [name for name in params if name not in configured]
    if missing:
        shown = ", ".join(repr(n) for n in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        problems.append(Problem("variables", f"no synchronizer for trainable parameter(s) {shown}"))
    if problems:
        raise InvalidStrategyError(problems)


def _foreign_strategy(strategy: Strategy, params: dict[str, nn.Parameter], frozen: set[str]) -> Problem | None:
    """A strategy none of whose variables the model has was made for another model: one sentence saying
    so reads better than a problem for every variable."""
    if not strategy.variables or any(c.var_name in params or c.var_name in frozen for c in strategy.variables):
        return None
    sample = ", ".join(repr(c.var_name) for c in strategy.variables[:3]) + (
        ", ..." if len(strategy.variables) > 3 else ""
    )
    graph = f" (graph {strategy.graph_id[:12]})" if strategy.graph_id else ""
    return Problem(
        "graph_id",
        f"this strategy was made for another model{graph}: none of its {len(strategy.variables)} "
        f"variables ({sample}) is a parameter of this one",
    )


def _partition_problems(where: str, config: VariableConfig, shape: tuple[int, ...]) -> list[Problem]:
    assert config.partition is not None  # checked by the caller
    axis, shards = config.partition.axis, config.partition.shards
    if axis >= len(shape):
        return [
            Problem(f"{where}.partition.axis", f"axis {axis} does not exist: {config.var_name} has shape {list(shape)}")
        ]
    if shards > shape[axis]:
        return [
            Problem(
                f"{where}.partition.shards",
                f"{shards} shards exceed axis {axis} of length {shape[axis]} in {config.var_name}",
            )
        ]
    return []


def _group_index(optimizer: torch.optim.Optimizer) -> dict[int, int]:
    return {id(p): gi for gi, group in enumerate(optimizer.param_groups) for p in group["params"]}


def _whole(name: str, param: nn.Parameter, group_index: int) -> Piece:
    shape = local_shape(param)
    return Piece(name, param, 0, 1, 0, 0, shape[0] if shape else 1, group_index)


def _pieces(config: VariableConfig, param: nn.Parameter, group_index: int) -> list[Piece]:
    if config.partition is None:
        return [_whole(config.var_name, param, group_index)]
    axis = config.partition.axis
    sizes = shard_sizes(local_shape(param)[axis], config.partition.shards)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [
        Piece(config.var_name, param, i, len(sizes), axis, start, size, group_index)
        for i, (start, size) in enumerate(zip(starts, sizes, strict=True))
    ]


def _add_variable(
    plan: Plan, where: str, config: VariableConfig, param: nn.Parameter, group_index: int, *, sparse: bool
) -> None:
    pieces = _pieces(config, param, group_index)
    syncs = config.synchronizers
    if sparse and _moves_rows(config, syncs):
        _add_sparse_variable(plan, where, config, pieces, syncs)
        return
    all_allreduce = all(isinstance(s, AllReduceSynchronizer) for s in syncs)
    for index, (piece, sync) in enumerate(zip(pieces, syncs, strict=True)):
        at = f"{where}.shard_synchronizers[{index}]" if config.shard_synchronizers else f"{where}.synchronizer"
        if isinstance(sync, AllReduceSynchronizer):
            if sync.algorithm == "hierarchical" and sync.compressor.kind != "none":
                raise UnsupportedStrategyError(
                    f"{at} ({piece.label}): hierarchical all-reduce with the {sync.compressor.kind} compressor is not supported yet"
                )
            plan.allreduce.append((piece, sync))
            if not all_allreduce:
                plan.replicated.append(piece)
        elif isinstance(sync, PSSynchronizer):
            plan.ps.append((piece, sync, _server(plan, at, piece, sync)))
        else:
            plan.sharded.append((piece, sync))
    if all_allreduce:
        plan.local.append(param)


def _moves_rows(config: VariableConfig, syncs: list[SyncConfig]) -> bool:
    """Sparse gradients travel as rows when every shard is a row range with a row-capable synchronizer."""
    if config.partition is not None and config.partition.axis != 0:
        return False
    if all(isinstance(s, PSSynchronizer) for s in syncs):
        return True
    plain = [
        isinstance(s, AllReduceSynchronizer) and s.compressor.kind == "none" and s.algorithm != "hierarchical"
        for s in syncs
    ]
    return all(plain)


def _add_sparse_variable(
    plan: Plan, where: str, config: VariableConfig, pieces: list[Piece], syncs: list[SyncConfig]
) -> None:
    if isinstance(syncs[0], AllReduceSynchronizer):
        plan.sparse_allreduce.append(_whole(config.var_name, pieces[0].param, pieces[0].group_index))
        plan.local.append(pieces[0].param)
        return
    for index, (piece, sync) in enumerate(zip(pieces, syncs, strict=True)):
        assert isinstance(sync, PSSynchronizer)  # _moves_rows guarantees it
        at = f"{where}.shard_synchronizers[{index}]" if config.shard_synchronizers else f"{where}.synchronizer"
        plan.sparse_ps.append((piece, sync, _server(plan, at, piece, sync)))


def _server(plan: Plan, at: str, piece: Piece, sync: PSSynchronizer) -> int:
    rank = server_rank(sync.reduction_destination, plan.replicas)
    if rank is None:
        raise UnsupportedStrategyError(
            f"{at} ({piece.label}): reduction destination {sync.reduction_destination!r} is on a node that runs no replica; "
            "the runtime hosts each server in the lowest rank of its node"
        )
    return rank


def _check_optimizer(plan: Plan, optimizer: torch.optim.Optimizer) -> None:
    if isinstance(optimizer, torch.optim.LBFGS):
        raise UnsupportedStrategyError(
            "optimizer LBFGS: it treats all parameters as one vector and cannot be distributed per variable"
        )
    sliced = [p for p, _, _ in plan.ps + plan.sparse_ps if not p.whole]
    sliced += [p for p, _ in plan.sharded] + plan.replicated
    if sliced and any(type(part) not in ELEMENTWISE_OPTIMIZERS for part in component_optimizers(optimizer)):
        raise UnsupportedStrategyError(
            f"variable {sliced[0].name!r}: {type(optimizer).__name__} is not known to update each element independently, "
            "so updating a shard or a ZeRO slice separately would not equal the whole-tensor update"
        )
