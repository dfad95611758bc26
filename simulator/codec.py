"""Strategies to rows and back: `encode` fills a `CandidateBatch` from Strategy documents, `to_strategy`
writes one row as an executable Strategy (see `simulator.encoding` for the layout)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.encoding import (
    Algorithm,
    CandidateBatch,
    CompressorKind,
    ConsistencyKind,
    Precision,
    Schedule,
    SyncKind,
)
from stratagem.errors import InvalidStrategyError, Problem, UnsupportedStrategyError
from stratagem.ir import (
    Consistency,
    Mesh,
    ModelGraph,
    PipelineConfig,
    Provenance,
    PSSynchronizer,
    ResourceSpec,
    ShardedSynchronizer,
    Strategy,
    VariableConfig,
)
from stratagem.ir.strategy import strategy_problems
from stratagem.ir.strategy_fields import Recompute

if TYPE_CHECKING:
    from simulator.context import SimContext


# --- Strategy -> row ----------------------------------------------------------------------------

_ALGORITHMS = {
    "auto": Algorithm.AUTO,
    "ring": Algorithm.RING,
    "tree": Algorithm.TREE,
    "hierarchical": Algorithm.HIERARCHICAL,
}
_COMPRESSORS = {
    "none": CompressorKind.NONE,
    "fp16": CompressorKind.FP16,
    "bf16": CompressorKind.BF16,
    "powersgd": CompressorKind.POWERSGD,
    "topk": CompressorKind.TOPK,
}
_CONSISTENCIES = {"bsp": ConsistencyKind.BSP, "ssp": ConsistencyKind.SSP, "asp": ConsistencyKind.ASP}
PRECISION_CODES = {
    "fp32": Precision.FP32,
    "tf32": Precision.TF32,
    "amp-fp16": Precision.AMP_FP16,
    "amp-bf16": Precision.AMP_BF16,
    "bf16": Precision.BF16,
    "fp8": Precision.FP8,
    "fp16": Precision.FP16,
}
"""`Strategy.precision`'s names and the codes a row holds (the search offers the same names)."""
_PRECISION_NAMES = {value: name for name, value in PRECISION_CODES.items()}
_SCHEDULES = {
    "1f1b": Schedule.ONE_F_ONE_B,
    "gpipe": Schedule.GPIPE,
    "interleaved-1f1b": Schedule.INTERLEAVED,
    "zero-bubble": Schedule.ZERO_BUBBLE,
}
_SCHEDULE_NAMES = {value: name for name, value in _SCHEDULES.items()}


def encode(context: SimContext, strategies: list[Strategy], *, validate: bool = True) -> CandidateBatch:
    """Strategies to a batch. Raises InvalidStrategyError (path `strategies[i]...`) for a strategy that
    does not fit the graph or cluster, UnsupportedStrategyError for one the encoding cannot express."""
    max_shards = max([_ps_shards(s) for s in strategies] + [1])
    batch = CandidateBatch.allocate(context, len(strategies), max_shards=max_shards)
    for i, strategy in enumerate(strategies):
        if validate:
            check_all(context.graph, context.resources, [strategy], first=i)
        _encode_row(context, batch, i, strategy)
    return batch


def check_all(graph: ModelGraph, resources: ResourceSpec, strategies: list[Strategy], *, first: int = 0) -> None:
    """Raise InvalidStrategyError for the first strategy that does not fit the graph or cluster, its
    path `strategies[i]...` counting from `first`."""
    for i, strategy in enumerate(strategies, start=first):
        problems = strategy_problems(strategy, graph, resources)
        if problems:
            raise InvalidStrategyError([Problem(f"strategies[{i}].{p.path}", p.reason) for p in problems])


def _ps_shards(strategy: Strategy) -> int:
    return max([c.num_shards for c in strategy.variables if any(s.kind == "ps" for s in c.synchronizers)] + [1])


def _encode_row(context: SimContext, b: CandidateBatch, i: int, strategy: Strategy) -> None:
    mesh = strategy.effective_mesh
    b.data[i], b.tensor[i], b.pipeline[i] = mesh.data, mesh.tensor, mesh.pipeline
    b.context_parallel[i] = mesh.context
    b.replicas[i] = False
    b.replicas[i, [context.device_index[d] for d in strategy.replicas]] = True
    b.consistency[i] = _CONSISTENCIES[strategy.consistency.kind]
    b.staleness[i] = strategy.consistency.staleness
    b.recompute[i] = strategy.recompute == "full"
    b.selective[i] = strategy.recompute == "selective"
    b.selective_op[i] = strategy.recompute == "selective-op"
    b.precision[i] = PRECISION_CODES[strategy.precision]
    b.sequence_parallel[i] = strategy.sequence_parallel
    b.micro_batch_size[i] = strategy.micro_batch_size or 0
    b.async_tp[i] = strategy.async_tensor_parallel
    b.fp8_gather[i] = strategy.fp8_all_gather
    b.compile[i] = strategy.compile
    if strategy.pipeline is not None:
        b.micro_batches[i] = strategy.pipeline.micro_batches
        b.schedule[i] = _SCHEDULES[strategy.pipeline.schedule]
        b.virtual_stages[i] = strategy.pipeline.virtual_stages
        for stage, names in enumerate(strategy.pipeline.stages):
            b.layer_stage[i, [context.layer_index[name] for name in names]] = stage
    groups = sorted({s.group for c in strategy.variables for s in c.synchronizers if s.kind != "ps"})
    compact = {g: k for k, g in enumerate(groups)}
    for config in strategy.variables:
        _encode_variable(context, b, i, config, compact)


def _encode_variable(
    context: SimContext, b: CandidateBatch, i: int, config: VariableConfig, compact: dict[int, int]
) -> None:
    v = context.variable_index[config.var_name]
    syncs = config.synchronizers
    kinds = {s.kind for s in syncs}
    if len(kinds) > 1:
        raise UnsupportedStrategyError(
            f"variable {config.var_name!r}: shards use different synchronizer kinds ({', '.join(sorted(kinds))}); "
            "the simulator needs one kind per variable"
        )
    first = syncs[0]
    b.shards[i, v] = config.num_shards
    b.partition_axis[i, v] = config.partition.axis if config.partition else 0
    if isinstance(first, PSSynchronizer):
        b.kind[i, v] = SyncKind.PS
        b.local_replication[i, v] = first.local_replication
        for k, sync in enumerate(syncs):
            b.server[i, v, k] = context.device_index[sync.reduction_destination]  # type: ignore[union-attr]
        return
    b.group[i, v] = compact[first.group]
    if isinstance(first, ShardedSynchronizer):
        b.kind[i, v] = SyncKind.SHARDED
        b.zero_stage[i, v] = first.stage
        b.shard_group[i] = first.shard_group or 0
        return
    b.kind[i, v] = SyncKind.ALLREDUCE
    b.algorithm[i, v] = _ALGORITHMS[first.algorithm]
    b.compressor[i, v] = _COMPRESSORS[first.compressor.kind]
    b.compressor_param[i, v] = first.compressor.rank or first.compressor.ratio or 0.0


# --- row -> Strategy ----------------------------------------------------------------------------


def to_strategy(context: SimContext, batch: CandidateBatch, index: int, *, builder: str | None = None) -> Strategy:
    """Row `index` as an executable Strategy (replicas in device-table order; with a tensor degree, the
    splits the simulator assumes, `context.tensor_plan`)."""
    i = index
    replicas = [context.devices[d] for d in np.flatnonzero(batch.replicas[i])]
    consistency_kind = ConsistencyKind(int(batch.consistency[i]))
    staleness = int(batch.staleness[i]) if consistency_kind == ConsistencyKind.SSP else 0
    consistency = Consistency(kind=consistency_kind.name.lower(), staleness=staleness)  # type: ignore[arg-type]
    pipeline = None
    if int(batch.pipeline[i]) > 1 or int(batch.micro_batches[i]) > 1:
        virtual = int(batch.virtual_stages[i])
        stages: list[list[str]] = [[] for _ in range(int(batch.pipeline[i]) * virtual)]
        for layer, name in enumerate(context.layer_names):
            stages[int(batch.layer_stage[i, layer])].append(name)
        pipeline = PipelineConfig(
            stages=stages,
            micro_batches=int(batch.micro_batches[i]),
            schedule=_SCHEDULE_NAMES[Schedule(int(batch.schedule[i]))],  # type: ignore[arg-type]
            virtual_stages=virtual,
        )
    variables: list[Any] = [_variable_config(context, batch, i, v, consistency) for v in range(context.num_variables)]
    return Strategy(
        graph_id=context.graph.id,
        resources_id=context.resources.id,
        replicas=replicas,
        mesh=Mesh(
            data=int(batch.data[i]),
            tensor=int(batch.tensor[i]),
            pipeline=int(batch.pipeline[i]),
            context=int(batch.context_parallel[i]),
        ),
        pipeline=pipeline,
        tensor_parallel=context.tensor_plan(int(batch.tensor[i])),
        recompute=_recompute_name(batch, i),
        precision=_PRECISION_NAMES[Precision(int(batch.precision[i]))],  # type: ignore[arg-type]
        sequence_parallel=bool(batch.sequence_parallel[i]),
        micro_batch_size=int(batch.micro_batch_size[i]) or None,
        async_tensor_parallel=bool(batch.async_tp[i]),
        fp8_all_gather=bool(batch.fp8_gather[i]),
        compile=bool(batch.compile[i]),
        consistency=consistency,
        variables=variables,
        provenance=Provenance(builder=builder),
    )


def _variable_config(
    context: SimContext, b: CandidateBatch, i: int, v: int, consistency: Consistency
) -> dict[str, Any]:
    """A plain dict: the Strategy validates all of them in one pass of pydantic's core, several times
    faster than building a BERT-sized strategy's thousands of sub-objects one by one."""
    shards = int(b.shards[i, v])
    partition = {"axis": int(b.partition_axis[i, v]), "shards": shards} if shards > 1 else None
    name = context.variable_names[v]
    kind = SyncKind(int(b.kind[i, v]))
    if kind == SyncKind.PS:
        ps = [
            {
                "kind": "ps",
                "reduction_destination": context.devices[int(b.server[i, v, k])],
                "local_replication": bool(b.local_replication[i, v]),
                "sync": consistency.kind != "asp",
                "staleness": consistency.staleness,
            }
            for k in range(shards)
        ]
        overrides = ps if shards > 1 and len({p["reduction_destination"] for p in ps}) > 1 else None
        return {"var_name": name, "synchronizer": ps[0], "partition": partition, "shard_synchronizers": overrides}
    if kind == SyncKind.SHARDED:
        sharded: dict[str, Any] = {"kind": "sharded", "group": int(b.group[i, v]), "stage": int(b.zero_stage[i, v])}
        if int(b.shard_group[i]) > 0:
            sharded["shard_group"] = int(b.shard_group[i])
        return {"var_name": name, "synchronizer": sharded, "partition": partition}
    synchronizer = {
        "kind": "allreduce",
        "algorithm": Algorithm(int(b.algorithm[i, v])).name.lower(),
        "group": int(b.group[i, v]),
        "compressor": _compressor(int(b.compressor[i, v]), float(b.compressor_param[i, v])),
    }
    return {"var_name": name, "synchronizer": synchronizer, "partition": partition}


def _compressor(kind: int, param: float) -> dict[str, Any]:
    if kind == CompressorKind.POWERSGD:
        return {"kind": "powersgd", "rank": max(1, round(param))}
    if kind == CompressorKind.TOPK:
        return {"kind": "topk", "ratio": float(min(1.0, max(param, math.ulp(0.0))))}
    return {"kind": CompressorKind(kind).name.lower()}


def _recompute_name(batch: CandidateBatch, i: int) -> Recompute:
    if batch.recompute[i]:
        return "full"
    if batch.selective[i]:
        return "selective"
    return "selective-op" if batch.selective_op[i] else "none"
