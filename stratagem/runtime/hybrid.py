"""Hybrid parallelism: a data × pipeline × context × tensor mesh over the replicas, then per-variable
synchronizers.

`distribute` hands a strategy whose mesh has a tensor, pipeline or context degree (or micro-batches) to
`distribute_mesh`. Ranks sit on the mesh as the strategy says, tensor innermost:
`rank = ((d · P + p) · C + c) · T + t` (`mesh_layout.py`), so a tensor group is T consecutive
replicas (one node) and the ranks synchronizing a parameter are every rank with the same (p, t):
data × context.

Order of composition, and why:
1. Check everything that can be refused (layout, coverage, the loss function a pipeline needs) before
   any collective, so every rank refuses alike.
2. Broadcast rank 0's whole model to every rank, while parameters are still plain tensors: the tensor
   splits then scatter identical weights, and every stage starts from what one process would. With a
   context degree the model's attention then gathers keys and values over its context group
   (`context_parallel.py`; no parameter changes).
3. Split the tensor-parallel modules (DTensor; with sequence parallelism, the norms too) on the whole
   model and point the optimizer at the new parameters — every rank of a tensor group must split the
   same modules in the same order. Then wrap the numbered blocks for recomputation (full or the
   attention core), around the split modules' own communication, then shard the ZeRO-3 variables with
   FSDP2 over the data-parallel and context mesh dimensions — torchtitan's order: TP, activation
   checkpointing, FSDP.
4. Cut this rank's pipeline chunks out of the split model (an nn.Sequential between its children; a
   model that returns its loss between its blocks, traced on the first step) — or, for micro-batches
   without stages on a model that is no nn.Sequential, wrap it to accumulate inside forward. The
   strategy's precision wraps the model's forward, or a pipeline's schedule.
5. Synchronize what the stage holds over its data × context group with the per-variable executors
   (all-reduce, parameter server, ZeRO-1/2) exactly as for pure data parallelism: each rank of the group
   holds the same shard of every split parameter, so the executors work on local shards. FSDP2's
   parameters are synchronized by FSDP2 and stepped by the user's optimizer.
With micro-batches a parameter's gradient accumulates over several backward passes, so the executors
launch at the optimizer step instead of inside backward. Clipping to a global gradient norm takes one
norm over the whole world, every stage and tensor shard (`clipping.Holders` says who holds what).

The device mesh is (replicate, shard, pipeline, context, tensor) (`mesh_layout.device_meshes`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from stratagem.errors import UnsupportedStrategyError
from stratagem.ir import ShardedSynchronizer, Strategy, device_address
from stratagem.parallel_rules import context_pipeline_refusal
from stratagem.runtime.clipping import GradClipper, Holders
from stratagem.runtime.comm import Comm
from stratagem.runtime.compile import apply_compile
from stratagem.runtime.compose import apply_synchronization
from stratagem.runtime.context_parallel import ContextGroup, apply_context_parallel, context_refusal
from stratagem.runtime.fsdp import apply_fsdp, fully_sharded_variables, shard_group_of
from stratagem.runtime.mesh_layout import MeshLayout, data_parallel_rank, device_meshes, shard_teams
from stratagem.runtime.optimizer import DistributedOptimizer
from stratagem.runtime.plan import check_coverage, resolve_plan
from stratagem.runtime.precision import LossScaler, StepNumerics, apply_precision_forward, fsdp_mixed_precision
from stratagem.runtime.recompute import apply_recomputation
from stratagem.runtime.sharded import ShardTeams

if TYPE_CHECKING:
    from stratagem.runtime.pipeline_parallel import LossFn

__all__ = ["MeshLayout", "data_parallel_rank", "distribute_mesh", "needs_mesh"]


def needs_mesh(strategy: Strategy) -> bool:
    """Whether the strategy needs more than the pure data-parallel runtime: splits, stages, context groups,
    micro-batches, recomputation, FSDP2 (ZeRO-3) or hybrid shard groups (which need the device mesh's sub-groups)."""
    mesh = strategy.effective_mesh
    micro = strategy.pipeline.micro_batches if strategy.pipeline is not None else 1
    sharding = any(
        isinstance(s, ShardedSynchronizer) and (s.stage == 3 or s.shard_group is not None)
        for c in strategy.variables
        for s in c.synchronizers
    )
    return (
        mesh.tensor > 1
        or mesh.pipeline > 1
        or mesh.context > 1
        or micro > 1
        or strategy.recompute != "none"
        or sharding
    )


def distribute_mesh(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    strategy: Strategy,
    *,
    rank: int,
    world_size: int,
    device: torch.device,
    loss_fn: LossFn | None,
    broadcast: Callable[[nn.Module, Comm], None],
    max_grad_norm: float | None = None,
) -> tuple[nn.Module, DistributedOptimizer]:
    """The hybrid half of `distribute`: `model` is already on `device`; `broadcast` copies rank 0's model;
    `max_grad_norm` (checked by `distribute`) clips each step to the whole model's gradient norm."""
    # DTensor and pipelining cost about 2 s of imports; only meshes need them.
    from stratagem.runtime.pipeline_parallel import (
        AccumulatedModel,
        PipelinedModel,
        TracedPipelinedModel,
        chunks_of,
        stage_children,
        stage_module,
        stage_parameters,
    )
    from stratagem.runtime.tensor_parallel import apply_tensor_parallel, retarget_optimizer

    layout = MeshLayout.of(strategy)
    accumulate_in_forward = _accumulates_in_forward(strategy, model)
    cuts = _block_cuts(strategy, model)
    fully_sharded = fully_sharded_variables(strategy)
    _check(
        strategy,
        model,
        world_size=world_size,
        loss_fn=loss_fn,
        needs_loss_fn=not accumulate_in_forward and cuts is None,
        fully_sharded=fully_sharded,
        traced=cuts is not None,
    )
    pipeline = strategy.pipeline
    _, p, _ = layout.coordinates(rank)
    mine = chunks_of(p, layout.pipeline, pipeline) if pipeline is not None else []
    by_children = pipeline is not None and not accumulate_in_forward and cuts is None
    chunks = stage_children(model, pipeline.stages) if by_children and pipeline is not None else None
    held = stage_parameters(model, pipeline.stages) if cuts is not None and pipeline is not None else None
    broadcast(
        model, Comm(None, rank=rank, node_of_rank=[device_address(d) for d in strategy.replicas], node_groups=False)
    )
    group_size = shard_group_of(strategy) or layout.data
    meshes = device_meshes(device, layout, group_size)
    mesh = meshes.mesh
    if layout.context > 1:
        group = ContextGroup(mesh["context"].get_group(), layout.context_index(rank), layout.context)
        apply_context_parallel(model, group)
    if layout.tensor > 1:
        replaced = apply_tensor_parallel(
            model, mesh["tensor"], strategy.tensor_parallel, sequence_parallel=strategy.sequence_parallel
        )
        retarget_optimizer(optimizer, replaced)
    if strategy.recompute != "none":
        apply_recomputation(model, strategy.recompute)
    if strategy.compile:
        apply_compile(model)

    def shard(unit: nn.Module) -> None:
        if fully_sharded:
            mp_policy = fsdp_mixed_precision(strategy)
            retarget_optimizer(optimizer, apply_fsdp(unit, fully_sharded, meshes.fsdp, mp_policy=mp_policy))

    if chunks is None:
        shard(model)
    scaler = LossScaler(device) if strategy.precision == "amp-fp16" else None
    numerics = StepNumerics(strategy.precision, device.type, scaler)
    runner: nn.Module = model
    module = model
    tied: dict[int, int] = {}
    if chunks is None and cuts is None:
        apply_precision_forward(model, strategy, device, scaler)
    if accumulate_in_forward and pipeline is not None:
        runner = AccumulatedModel(model, micro_batches=pipeline.micro_batches)
    if pipeline is not None and chunks is not None:
        held_chunks = [(index, stage_module(model, chunks[index])) for index in mine]
        for _, unit in held_chunks:  # each chunk is its own FSDP2 root, as torchtitan shards pipeline stages
            shard(unit)
        module = stage_module(model, [child for index in mine for child in chunks[index]])
        assert loss_fn is not None  # _check refused a pipeline without one
        runner = PipelinedModel(
            module,
            stage_index=mine[0],
            num_stages=len(pipeline.stages),
            config=pipeline,
            group=mesh["pipeline"].get_group(),
            device=device,
            loss_fn=loss_fn,
            chunks=held_chunks,
            numerics=numerics,
        )
    if pipeline is not None and cuts is not None and held is not None:
        by_rank = [
            {name: param for index in chunks_of(q, layout.pipeline, pipeline) for name, param in held[index].items()}
            for q in range(layout.pipeline)
        ]
        module = _holder(by_rank[p])
        tied = {id(by_rank[p][n]): sum(n in stage for stage in by_rank) for n in _tied(by_rank) if n in by_rank[p]}
        runner = TracedPipelinedModel(
            model,
            cuts=cuts,
            stage_index=p,
            num_stages=len(pipeline.stages),
            config=pipeline,
            group=mesh["pipeline"].get_group(),
            device=device,
            tied=_tied(by_rank),
            held=set(by_rank[p]),
            numerics=numerics,
        )
    fsdp_params = [param for name, param in module.named_parameters() if name in fully_sharded]
    synchronized = (
        _holder({name: param for name, param in module.named_parameters() if name not in fully_sharded})
        if fully_sharded
        else module
    )
    if scaler is not None:
        scaler.watch(synchronized.parameters(), sharded=fsdp_params)
    teams = shard_teams(meshes, layout, rank, group_size) if group_size < layout.data else None
    clipper = None
    if max_grad_norm is not None:
        holders = Holders(world_size // layout.pipeline, len(layout.data_group(rank)), tied)
        clipper = GradClipper(max_grad_norm, holders=holders, group=None, device=device)
    optimizer_out = _synchronize(
        synchronized,
        optimizer,
        strategy,
        layout,
        rank,
        meshes.data.get_group(),
        device,
        fully_sharded=fsdp_params,
        scaler=scaler,
        teams=teams,
        clipper=clipper,
    )
    return runner, optimizer_out


def _block_cuts(strategy: Strategy, model: nn.Module) -> list[str] | None:
    """Where stages of a model that is no nn.Sequential are cut (the `blocks` route of `parallel_rules.pipeline_route`),
    or None for the `children` route and for no pipeline. Refused here: what the traced stages cannot hold."""
    from stratagem.parallel_rules import BLOCK_LISTS, Refusal, block_cuts, class_path, pipeline_refusal

    if strategy.pipeline is None or strategy.effective_mesh.pipeline == 1:
        return None
    if pipeline_refusal(class_path(type(model)), returns_loss=False) is None:
        return None
    cuts = block_cuts(strategy.pipeline.stages)
    if isinstance(cuts, Refusal):
        raise UnsupportedStrategyError(f"pipeline: {cuts}")
    for cut in cuts:
        container = cut.rpartition(".")[0]
        if not isinstance(model.get_submodule(container) if _has_module(model, container) else None, nn.ModuleList):
            raise UnsupportedStrategyError(
                f"pipeline: {container!r} is not a ModuleList of the model's blocks "
                f"(stages of a {type(model).__name__} are cut between the blocks of a ModuleList named "
                f"{', '.join(BLOCK_LISTS)})"
            )
        if not _has_module(model, cut):
            raise UnsupportedStrategyError(f"pipeline: the model has no block {cut!r}")
    if strategy.pipeline.schedule in ("interleaved-1f1b", "zero-bubble"):
        raise UnsupportedStrategyError(
            f"pipeline: the {strategy.pipeline.schedule} schedule runs torch's multi-chunk schedules, which pass "
            f"activations only between adjacent chunks; a traced {type(model).__name__} sends its own inputs (the "
            "labels) from the first chunk to the last. Use gpipe or 1f1b for it, or an nn.Sequential model with loss_fn"
        )
    mesh = strategy.effective_mesh
    if mesh.tensor > 1 or strategy.recompute != "none":
        raise UnsupportedStrategyError(
            f"pipeline: stages cut between the blocks of a {type(model).__name__} are traced (torch.export), and a traced stage "
            "holds neither DTensor splits nor recomputation: use mesh.tensor 1 and recompute 'none' with them"
        )
    return cuts


def _has_module(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


def _tied(held: list[dict[str, nn.Parameter]]) -> list[str]:
    """Parameters held by several stages, in one order on every rank (each all-reduces them in turn)."""
    names = list(dict.fromkeys(name for stage in held for name in stage))
    return [name for name in names if sum(name in stage for stage in held) > 1]


def _holder(params: dict[str, nn.Parameter]) -> nn.Module:
    """A module holding `params` under their dotted names, for the data-parallel executors."""
    root = nn.Module()
    for name, param in params.items():
        owner = root
        *path, leaf = name.split(".")
        for part in path:
            if part not in owner._modules:
                owner.add_module(part, nn.Module())
            owner = owner._modules[part]  # type: ignore[assignment]
        owner.register_parameter(leaf, param)
    return root


def _accumulates_in_forward(strategy: Strategy, model: nn.Module) -> bool:
    """Micro-batches without stages on a model the runtime cannot cut: accumulated inside its forward
    (`AccumulatedModel`), which needs the model to return its loss (`parallel_rules.accumulation_refusal`)."""
    from stratagem.parallel_rules import class_path, pipeline_refusal

    return (
        strategy.pipeline is not None
        and strategy.effective_mesh.pipeline == 1
        and pipeline_refusal(class_path(type(model)), returns_loss=False) is not None
    )


def _check(
    strategy: Strategy,
    model: nn.Module,
    *,
    world_size: int,
    loss_fn: LossFn | None,
    needs_loss_fn: bool,
    fully_sharded: set[str],
    traced: bool = False,
) -> None:
    layout = MeshLayout.of(strategy)
    staged = context_pipeline_refusal(layout.context, layout.pipeline)
    if staged is not None:
        raise UnsupportedStrategyError(str(staged))
    if layout.context > 1:
        refusal = context_refusal(model)
        if refusal is not None:
            raise UnsupportedStrategyError(refusal)
    if world_size != len(strategy.replicas):
        raise UnsupportedStrategyError(
            f"the strategy has {len(strategy.replicas)} replicas (rank i runs replicas[i]) but the process group has {world_size} ranks"
        )
    if layout.tensor > 1 and not strategy.tensor_parallel:
        raise UnsupportedStrategyError(
            f"mesh.tensor is {layout.tensor} but tensor_parallel names no module to split; list the layers and their styles"
        )
    if strategy.pipeline is not None and needs_loss_fn and loss_fn is None:
        raise UnsupportedStrategyError(
            "a strategy with pipeline stages or micro-batches needs distribute(..., loss_fn=...): "
            "the last stage computes the loss of each micro-batch"
        )
    if fully_sharded and traced:
        raise UnsupportedStrategyError(
            "ZeRO stage 3 (FSDP2) in a pipeline cut between the blocks of a traced model is not run by this "
            "runtime: FSDP2 shards modules, and a traced stage is a graph the tracer built; use stage 1 or 2 "
            "there, or an nn.Sequential model with loss_fn"
        )
    check_coverage(strategy, model)


def _data_parallel_part(strategy: Strategy, module: nn.Module, group: list[int]) -> Strategy:
    """The strategy the data-parallel executors see: this stage's variables over this rank's data group."""
    present = {name for name, p in module.named_parameters() if p.requires_grad}
    return Strategy.parse(
        {
            "replicas": [strategy.replicas[r] for r in group],
            "consistency": strategy.consistency.model_dump(mode="json"),
            "variables": [c.model_dump(mode="json") for c in strategy.variables if c.var_name in present],
        }
    )


def _synchronize(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    strategy: Strategy,
    layout: MeshLayout,
    rank: int,
    group: torch.distributed.ProcessGroup,
    device: torch.device,
    *,
    fully_sharded: list[nn.Parameter],
    scaler: LossScaler | None,
    teams: ShardTeams | None,
    clipper: GradClipper | None,
) -> DistributedOptimizer:
    members = layout.data_group(rank)
    part = _data_parallel_part(strategy, module, members)
    me = members.index(rank)
    plan = resolve_plan(module, optimizer, part, world_size=len(members), rank=me)
    if plan.needs_node_groups:
        raise UnsupportedStrategyError(
            "hierarchical all-reduce and parameter-server local replication are not supported inside a tensor or pipeline mesh yet"
        )
    comm = Comm(group, rank=me, node_of_rank=plan.node_of_rank, node_groups=False)
    # Parameters of other stages stay in the user's optimizer without gradients, which it skips.
    return apply_synchronization(
        plan,
        optimizer,
        comm=comm,
        device=device,
        launch_in_backward=strategy.pipeline is None,
        fully_sharded=fully_sharded,
        scaler=scaler,
        shard_teams=teams,
        clipper=clipper,
    )
