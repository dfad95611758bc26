"""`Layout.build`: a layout on a graph and a cluster, as the Strategy it describes.

In order: fill the degrees from the device count (`Layout.resolved`), check the layout against the
model and the cluster (every problem at once, with its arithmetic), then write the strategy: replicas
are all compute devices, the tensor plan is `stratagem.tensor_plan`'s for the tensor degree, the
pipeline chunks are `stratagem.stages`' cuts, and every trainable variable is all-reduced (zero 0) or
sharded at the layout's ZeRO level.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stratagem.architecture import architecture_of
from stratagem.bounded_cache import BoundedCache
from stratagem.builders.data_parallel import MIB, ddp_buckets
from stratagem.errors import InvalidLayoutError, Problem
from stratagem.ir import (
    AllReduceSynchronizer,
    Architecture,
    Mesh,
    ModelGraph,
    PipelineConfig,
    Provenance,
    ResourceSpec,
    ShardedSynchronizer,
    Strategy,
    TensorParallelLayer,
    VariableConfig,
)
from stratagem.layout import Layout
from stratagem.stages import cut_points, cut_stages
from stratagem.tensor_plan import Split, candidate_splits

LAYOUT_BUILDER = "Layout"
"""`provenance.builder` of a strategy `Layout.build` wrote."""
FUSION_CHUNK = 128
"""Variables per shard fusion group (ZeRO/FSDP), as AutoDist's AllReduce builder groups them."""
DDP_BUCKET_MB = 25
DDP_FIRST_BUCKET_MB = 1
"""PyTorch DDP's gradient buckets (`bucket_cap_mb` 25 MiB unless `Layout.bucket_mb` says; the first
bucket, the last layers' gradients, closes at `torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB,
so their all-reduce starts early): a zero-0 layout's all-reduce fusion groups."""


def build_strategy(
    layout: Layout,
    graph: ModelGraph,
    resources: ResourceSpec,
    *,
    check: bool = True,
    shared: SharedParts | None = None,
) -> Strategy:
    """`check=False` leaves the checks against the graph and cluster to the caller (the simulator makes
    them again when it encodes the strategy, so `predict` does not pay for them twice). `shared` lets
    strategies built together from one graph share what does not depend on the layout's degrees."""
    devices = resources.compute_devices
    resolved = layout.resolved(len(devices))
    arch = architecture_of(graph)
    problems = graph_problems(resolved, resources, arch)
    try:
        _, micro_batches, _ = resolved.batch(graph.batch_size)
    except InvalidLayoutError as error:
        problems += error.problems
    if problems:
        raise InvalidLayoutError(problems)
    tensor, pipeline, chunks = (
        resolved.tensor or 1,
        resolved.pipeline or 1,
        (resolved.pipeline or 1) * resolved.virtual_stages,
    )
    pipe = None
    if pipeline > 1 or micro_batches > 1:
        pipe = PipelineConfig(
            stages=cut_stages(graph, chunks, points=shared.points(graph) if shared is not None else None),
            micro_batches=micro_batches,
            schedule=resolved.schedule,
            virtual_stages=resolved.virtual_stages,
        )
    strategy = Strategy(
        graph_id=graph.id,
        resources_id=resources.id,
        replicas=devices,
        mesh=Mesh(data=resolved.data or 1, tensor=tensor, pipeline=pipeline, context=resolved.context or 1),
        pipeline=pipe,
        micro_batch_size=graph.batch_size,
        tensor_parallel=tensor_plan_for(graph, tensor),
        recompute=resolved.recompute,
        precision=resolved.precision,
        sequence_parallel=resolved.sequence_parallel,
        async_tensor_parallel=resolved.async_tensor_parallel,
        fp8_all_gather=resolved.fp8_all_gather,
        compile=resolved.compile,
        overlap_grad_reduce=resolved.overlap_grad_reduce,
        variables=_variables(graph, resolved, shared, pipe.stages if pipe is not None else None),
        provenance=Provenance(builder=LAYOUT_BUILDER, notes=[str(resolved)]),
    )
    return strategy.validate_for(graph, resources) if check else strategy


def graph_problems(layout: Layout, resources: ResourceSpec, arch: Architecture | None) -> list[Problem]:
    """Rules of a resolved layout against the model's shape and the cluster."""
    tensor, pipeline, context = layout.tensor or 1, layout.pipeline or 1, layout.context or 1
    chunks = pipeline * layout.virtual_stages
    problems: list[Problem] = []
    if tensor > 1:
        for node in resources.nodes:
            count = len(node.compute_devices)
            if count % tensor:
                problems.append(
                    Problem(
                        "tensor",
                        f"tensor({tensor}) does not divide the {count} devices of node {node.address}: "
                        "a tensor group must stay inside one node",
                    )
                )
                break
    if arch is None:
        if context > 1:
            problems.append(
                Problem(
                    "context", "context parallelism splits a transformer's sequence; the graph records no architecture"
                )
            )
        return problems
    if arch.heads % tensor:
        problems.append(Problem("tensor", f"tensor({tensor}) does not divide heads({arch.heads})"))
    if arch.kv_heads is not None and arch.kv_heads % tensor:
        problems.append(Problem("tensor", f"tensor({tensor}) does not divide kv_heads({arch.kv_heads})"))
    if arch.layers < chunks:
        problems.append(
            Problem(
                "pipeline",
                f"layers({arch.layers}) < pipeline({pipeline})*virtual_stages({layout.virtual_stages})={chunks}: "
                "every chunk needs a block",
            )
        )
    if context > 1:
        pieces = 2 * context if arch.causal else context
        if arch.seq % pieces:
            why = ": causal ring attention balances 2·context pieces of the sequence" if arch.causal else ""
            shown = f"2*context({context})" if arch.causal else f"context({context})"
            problems.append(Problem("context", f"seq({arch.seq}) is not a multiple of {shown}={pieces}{why}"))
    return problems


@dataclass
class SharedParts:
    """What strategies built together from one graph share: the per-variable configs of each ZeRO level,
    shard group, bucket cap and reduction timing (pricing 64 layouts of a 70B model builds two lists, not
    64; the strategies then hold the same VariableConfig objects) and the places the graph can be cut."""

    variables: dict[tuple[int, int | None, int | None, bool, int], list[VariableConfig]] = field(default_factory=dict)
    cuts: list[int] | None = None

    def points(self, graph: ModelGraph) -> list[int]:
        if self.cuts is None:
            self.cuts = cut_points(graph)
        return self.cuts


def _variables(
    graph: ModelGraph, layout: Layout, shared: SharedParts | None, stages: list[list[str]] | None
) -> list[VariableConfig]:
    if shared is None:
        return synchronizers(graph, layout, stages)
    chunks = len(stages) if stages is not None and not layout.overlap_grad_reduce else 1
    key = (layout.zero, layout.shard_group, layout.bucket_mb, layout.overlap_grad_reduce, chunks)
    if key not in shared.variables:
        shared.variables[key] = synchronizers(graph, layout, stages)
    return list(shared.variables[key])


def synchronizers(graph: ModelGraph, layout: Layout, stages: list[list[str]] | None = None) -> list[VariableConfig]:
    """All-reduce for zero 0, fused into DDP's buckets (`ddp_buckets`), else ZeRO/FSDP sharding in groups
    of `FUSION_CHUNK` variables; without `overlap_grad_reduce`, one group per pipeline chunk."""
    configs = []
    variables = graph.trainable_variables
    if not layout.overlap_grad_reduce:
        groups = after_backward_groups(graph, stages)
    elif layout.zero == 0:
        groups = ddp_groups(graph, layout.bucket_mb or DDP_BUCKET_MB)
    else:
        groups = [index // FUSION_CHUNK for index in range(len(variables))]
    for variable, group in zip(variables, groups, strict=True):
        sync: AllReduceSynchronizer | ShardedSynchronizer = (
            AllReduceSynchronizer(group=group)
            if layout.zero == 0
            else ShardedSynchronizer(group=group, stage=layout.zero, shard_group=layout.shard_group)
        )
        # Built from values checked here, so pydantic's per-field validation (most of a large model's build) is skipped.
        configs.append(VariableConfig.model_construct(var_name=variable.name, synchronizer=sync))
    return configs


def after_backward_groups(graph: ModelGraph, stages: list[list[str]] | None) -> list[int]:
    """Each trainable variable's group when every pipeline chunk reduces its gradients in one collective
    once its backward is done: the chunk of its layer (`ModelGraph.variable_layers`), numbered from the
    last chunk, whose backward ends first."""
    if stages is None or len(stages) == 1:
        return [0] * len(graph.trainable_variables)
    chunk_of = {name: chunk for chunk, names in enumerate(stages) for name in names}
    layer_of = graph.variable_layers()
    last = len(stages) - 1
    return [last - chunk_of.get(layer_of.get(variable.name, ""), 0) for variable in graph.trainable_variables]


def ddp_groups(graph: ModelGraph, bucket_mb: int) -> list[int]:
    """Each trainable variable's DDP bucket (graph order), as `DistributedDataParallel` assigns them
    (`stratagem.builders.ddp_buckets`) over the order backward makes the gradients, the reverse of the
    graph's. Bucket 0 is reduced first."""
    ready = graph.trainable_variables[::-1]
    last = len(ready) - 1
    group = [0] * len(ready)
    buckets = ddp_buckets(ready, first_cap_bytes=DDP_FIRST_BUCKET_MB * MIB, cap_bytes=bucket_mb * MIB)
    for number, members in enumerate(buckets):
        for index in members:
            group[last - index] = number
    return group


CACHED_GRAPHS = 8
_SPLITS: BoundedCache[str | None, list[Split]] = BoundedCache(CACHED_GRAPHS)


def tensor_plan_for(graph: ModelGraph, degree: int) -> list[TensorParallelLayer]:
    """`stratagem.tensor_plan.tensor_plan`, with the graph's candidate splits worked out once per graph
    (pricing many layouts of one model plans it once)."""
    if degree <= 1:
        return []
    splits = _SPLITS.get(graph.id, lambda: candidate_splits(graph))
    return [split.layer for split in splits if split.length % degree == 0]
