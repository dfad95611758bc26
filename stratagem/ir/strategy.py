"""Strategy: the executable artifact, a superset of AutoDist's strategy protobuf.

Per variable (AutoDist's `node_config`) a synchronizer and an optional partition; globally the
replicas, the data/tensor/pipeline mesh and the consistency model. The content id covers what
executes: `predicted`, `measured` and `provenance` annotate a strategy without changing it, so the
same strategy keeps its id after a trial measures it.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Self

from pydantic import Field, model_validator

from stratagem.errors import InvalidStrategyError, Problem
from stratagem.ir.document import Document, as_value_error, check
from stratagem.ir.graph import ModelGraph
from stratagem.ir.limits import (
    MAX_LAYERS,
    MAX_REPLICAS,
    MAX_VARIABLES,
    Name,
    OptionalName,
)
from stratagem.ir.resources import ResourceSpec, device_address, parse_device
from stratagem.ir.strategy_fields import (
    Consistency,
    MeasuredPerformance,
    Mesh,
    Partition,
    PipelineConfig,
    Precision,
    PredictedPerformance,
    Provenance,
    PSSynchronizer,
    Recompute,
    ShardedSynchronizer,
    TensorParallelLayer,
    VariableConfig,
)


class Strategy(Document):
    _error_type: ClassVar = InvalidStrategyError
    _id_excluded: ClassVar[frozenset[str]] = frozenset({"id", "provenance", "predicted", "measured"})

    graph_id: OptionalName | None = None
    """Content id of the graph the strategy was made for."""
    resources_id: OptionalName | None = None
    replicas: list[Name] = Field(min_length=1, max_length=MAX_REPLICAS)
    """Devices that run the model; rank i runs on replicas[i]."""
    mesh: Mesh | None = None
    """Defaults to pure data parallel over the replicas."""
    pipeline: PipelineConfig | None = None
    tensor_parallel: list[TensorParallelLayer] = Field(default_factory=list, max_length=MAX_LAYERS)
    """Which modules the tensor-parallel group splits, and how; everything else is replicated in it."""
    micro_batch_size: int | None = Field(default=None, ge=1)
    """Samples in each micro-batch on one replica. None: the graph's batch is the replica's whole step,
    split evenly into the pipeline's micro-batches (what the search writes). Set (what a layout writes,
    its graph captured at the micro-batch): each micro-batch holds this many samples, a step runs
    `pipeline.micro_batches` of them on every replica, and the graph's recorded work scales by
    `micro_batch_size / graph.batch_size` per micro-batch."""
    recompute: Recompute = "none"
    """Activation recomputation of every numbered block (`blocks.3`, or `2` in an nn.Sequential).
    `full`: only a block's input is kept through the forward, and the block's forward runs again in
    backward (one more forward per step buys the memory of all but one block's activations).
    `selective`: only the attention core (scores, softmax, dropout: Korthikanti et al. 2022) is dropped and
    recomputed, the largest activations for the least compute.
    `selective-op`: per-op selective checkpointing of each block, torchtitan's `selective_ac_option = "op"`:
    the outputs of its fused attention and of every other matmul are kept, everything else (norms,
    activations, the other matmuls) runs again in backward."""
    precision: Precision = "fp32"
    """Numerics of the step. `fp32`; `tf32` (fp32 storage, TF32 tensor-core matmuls); `amp-fp16`,
    `amp-bf16` (fp32 master weights and optimizer state, half-precision compute and activations);
    `bf16` (everything in bf16); `fp8` (fp8 matmuls with per-tensor scaling, bf16 elsewhere); `fp16` (an fp16
    model, its gradients reduced in fp16, fp32 master weights and optimizer state, dynamic loss scaling:
    Megatron-LM's `--fp16`, DeepSpeed's `fp16.enabled`, the way to train in 16 bits on GPUs without bf16)."""
    sequence_parallel: bool = False
    """With tensor parallelism: norms and dropout work on 1/tensor of the sequence, and each block's
    all-reduces become reduce-scatter plus all-gather (Korthikanti et al. 2022)."""
    async_tensor_parallel: bool = False
    """With sequence parallelism: each all-gather before a column-parallel matmul and each
    reduce-scatter after a row-parallel one is cut into tensor-degree pieces that overlap the matmul
    they feed or drain (torchtitan's async TP: inductor's micro-pipeline pass over symmetric memory;
    Wang et al. 2023, "Overlap communication with dependent computation via decomposition")."""
    fp8_all_gather: bool = False
    """With `fp8` precision and ZeRO stage 3: FSDP all-gathers the fp8 Linear layers' weights already cast
    to float8 (1 byte each, half of bf16), as torchao's `enable_fsdp_float8_all_gather`."""
    compile: bool = False
    """Each numbered block runs under `torch.compile` (as torchtitan compiles its transformer blocks):
    every chain of element-wise and normalization ops between two matmuls becomes one fused kernel, which
    reads its inputs once and writes only what a later kernel or backward needs. Engines with hand-fused
    kernels for the same chains (Megatron-LM's fused scale-mask-softmax, bias-GeLU, bias-dropout-add and
    LayerNorm) compute the same way."""
    overlap_grad_reduce: bool = True
    """The engine reduces gradients during backward, each fusion group once its gradients are ready. False
    states an engine that reduces them after backward (DeepSpeed's stage 0), for `layout()` and the engine
    exports; the groups are what the simulator prices and the runtime runs, and `Layout.build` makes them
    one per pipeline chunk, each ready once its chunk's backward is done."""
    consistency: Consistency = Field(default_factory=Consistency)
    variables: list[VariableConfig] = Field(max_length=MAX_VARIABLES)
    predicted: PredictedPerformance | None = None
    measured: MeasuredPerformance | None = None
    provenance: Provenance = Field(default_factory=Provenance)

    @model_validator(mode="after")
    def _check_self(self) -> Self:
        as_value_error(strategy_self_problems(self))
        return self

    @property
    def micro_batches(self) -> int:
        return self.pipeline.micro_batches if self.pipeline is not None else 1

    def step_samples(self, graph_batch: int) -> int:
        """Samples one replica trains on per step, for a graph captured at `graph_batch`."""
        if self.micro_batch_size is None:
            return graph_batch
        return self.micro_batch_size * self.micro_batches

    @property
    def effective_mesh(self) -> Mesh:
        return self.mesh or Mesh(data=len(self.replicas))

    def config_of(self, var_name: str) -> VariableConfig:
        for config in self.variables:
            if config.var_name == var_name:
                return config
        raise KeyError(var_name)

    def validate_for(self, graph: ModelGraph, resources: ResourceSpec) -> Self:
        """Check the strategy against the graph and cluster it is meant for; raise with every problem."""
        check(strategy_problems(self, graph, resources), InvalidStrategyError)
        return self

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for config in self.variables:
            for sync in config.synchronizers:
                kinds[sync.kind] = kinds.get(sync.kind, 0) + 1
        parts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        return f"{len(self.replicas)} replicas, {self.effective_mesh.describe()}, {self.consistency.kind}, {parts}"

    def to_autodist(self, **kwargs: Any) -> str:
        """AutoDist's strategy protobuf text; pass `graph=` to write partitioners at each variable's full rank."""
        from stratagem.interop.autodist import strategy_to_autodist

        return strategy_to_autodist(self, **kwargs)

    @classmethod
    def from_autodist(cls, text: str, **kwargs: Any) -> Strategy:
        from stratagem.interop.autodist import strategy_from_autodist

        return strategy_from_autodist(text, **kwargs)

    def layout(self, graph: ModelGraph | None = None) -> Any:
        """The `stratagem.Layout` this strategy runs, where it has one (UnsupportedStrategyError says why
        not); `graph` (captured at the micro-batch) gives the batch sizes."""
        from stratagem.layout import layout_of

        return layout_of(self, graph)

    def to_torchtitan(self, graph: ModelGraph | None = None) -> str:
        """A torchtitan job config (TOML); `graph` gives the batch sizes and the layers per stage."""
        from stratagem.interop.engines import strategy_to

        return strategy_to("torchtitan", self, graph)

    def to_deepspeed(self, graph: ModelGraph | None = None) -> dict[str, Any]:
        """A DeepSpeed config (`ds_config` dict); `graph` gives the batch sizes."""
        from stratagem.interop.engines import strategy_to

        return strategy_to("deepspeed", self, graph)

    def to_megatron(self, graph: ModelGraph | None = None) -> list[str]:
        """Megatron-LM's parallelism, batch, recomputation and precision arguments."""
        from stratagem.interop.engines import strategy_to

        return strategy_to("megatron", self, graph)

    def to_accelerate(self, graph: ModelGraph | None = None) -> str:
        """An Accelerate config (YAML) with `fsdp_config` / `parallelism_config`."""
        from stratagem.interop.engines import strategy_to

        return strategy_to("accelerate", self, graph)


def strategy_self_problems(strategy: Strategy) -> list[Problem]:
    """Rules a strategy must satisfy on its own, before anyone looks at a graph."""
    problems: list[Problem] = []
    for i, device in enumerate(strategy.replicas):
        try:
            parse_device(device)
        except ValueError as error:
            problems.append(Problem(f"replicas[{i}]", str(error)))
    if len(set(strategy.replicas)) != len(strategy.replicas):
        problems.append(Problem("replicas", "a device is listed twice"))
    mesh = strategy.effective_mesh
    if mesh.size != len(strategy.replicas):
        problems.append(Problem("mesh", f"{mesh.describe()} != replicas({len(strategy.replicas)})"))
    if mesh.pipeline > 1 and strategy.pipeline is None:
        problems.append(Problem("pipeline", f"mesh.pipeline is {mesh.pipeline} but no pipeline stages are given"))
    if strategy.pipeline is not None:
        chunks = mesh.pipeline * strategy.pipeline.virtual_stages
        if len(strategy.pipeline.stages) != chunks:
            problems.append(
                Problem(
                    "pipeline.stages",
                    f"{len(strategy.pipeline.stages)} stages for mesh.pipeline({mesh.pipeline})"
                    f"*virtual_stages({strategy.pipeline.virtual_stages})={chunks}",
                )
            )
    if strategy.sequence_parallel and mesh.tensor == 1:
        problems.append(Problem("sequence_parallel", "needs tensor parallelism (mesh.tensor > 1)"))
    if strategy.async_tensor_parallel and not strategy.sequence_parallel:
        problems.append(
            Problem(
                "async_tensor_parallel",
                "needs sequence parallelism: it overlaps the all-gathers and reduce-scatters sequence "
                "parallelism makes of each block's all-reduces",
            )
        )
    if strategy.fp8_all_gather:
        if strategy.precision != "fp8":
            problems.append(
                Problem(
                    "fp8_all_gather", f"gathers fp8 weights, which need precision 'fp8' (not {strategy.precision!r})"
                )
            )
        if not any(
            isinstance(sync, ShardedSynchronizer) and sync.stage == 3
            for config in strategy.variables
            for sync in config.synchronizers
        ):
            problems.append(Problem("fp8_all_gather", "needs ZeRO stage 3 (FSDP) variables, whose weights it gathers"))
    problems.extend(_sharding_problems(strategy.variables, mesh))
    problems.extend(_tensor_parallel_self_problems(strategy.tensor_parallel, mesh))
    seen: dict[str, int] = {}
    for i, config in enumerate(strategy.variables):
        if config.var_name in seen:
            problems.append(
                Problem(
                    f"variables[{i}].var_name",
                    f"{config.var_name!r} is configured twice (also variables[{seen[config.var_name]}])",
                )
            )
        seen.setdefault(config.var_name, i)
        for j, sync in enumerate(config.synchronizers):
            where = f"variables[{i}]" + (
                f".shard_synchronizers[{j}]" if config.shard_synchronizers else ".synchronizer"
            )
            problems.extend(_consistency_problems(strategy.consistency, sync, where))
            if isinstance(sync, PSSynchronizer):
                try:
                    parse_device(sync.reduction_destination)
                except ValueError as error:
                    problems.append(Problem(f"{where}.reduction_destination", str(error)))
    return problems


def _sharding_problems(variables: list[VariableConfig], mesh: Mesh) -> list[Problem]:
    """Sharded variables share one sharding layout (FSDP shards over one mesh): a hybrid shard group
    is the same for all of them and divides the data-parallel degree."""
    groups: dict[int | None, str] = {}
    for i, config in enumerate(variables):
        for j, sync in enumerate(config.synchronizers):
            if isinstance(sync, ShardedSynchronizer):
                where = f"variables[{i}]" + (
                    f".shard_synchronizers[{j}]" if config.shard_synchronizers else ".synchronizer"
                )
                groups.setdefault(sync.shard_group, where)
    problems: list[Problem] = []
    if len(groups) > 1:
        shown = ", ".join(f"{group} at {where}" for group, where in groups.items())
        problems.append(
            Problem(
                "variables", f"sharded variables use different shard groups ({shown}); one sharding layout per strategy"
            )
        )
    for group, where in groups.items():
        if group is not None and mesh.data % group:
            problems.append(
                Problem(f"{where}.shard_group", f"shard_group({group}) does not divide mesh.data({mesh.data})")
            )
    return problems


def _tensor_parallel_self_problems(layers: list[TensorParallelLayer], mesh: Mesh) -> list[Problem]:
    """A split needs a tensor group; a module is split once, and never inside a module split by heads."""
    problems: list[Problem] = []
    if layers and mesh.tensor == 1:
        problems.append(Problem("tensor_parallel", f"{len(layers)} layer(s) split but mesh.tensor is 1"))
    names = [layer.name for layer in layers]
    attention = [layer.name for layer in layers if layer.style == "heads"]
    for i, layer in enumerate(layers):
        where = f"tensor_parallel[{i}]"
        if names.index(layer.name) != i:
            problems.append(
                Problem(
                    f"{where}.name", f"{layer.name!r} is split twice (also tensor_parallel[{names.index(layer.name)}])"
                )
            )
        inside = [a for a in attention if a != layer.name and _within(layer.name, a)]
        if inside:
            problems.append(
                Problem(
                    f"{where}.name", f"{layer.name!r} is inside {inside[0]!r}, which the heads style already splits"
                )
            )
        if layer.heads is not None and layer.heads % mesh.tensor:
            problems.append(
                Problem(f"{where}.heads", f"mesh.tensor({mesh.tensor}) does not divide heads({layer.heads})")
            )
    return problems


def _within(name: str, module: str) -> bool:
    """Whether a layer or module name lies inside `module` (`blocks.0.attn.q` and `blocks.0.attn/ops0` do)."""
    return name.startswith((module + ".", module + "/"))


def _consistency_problems(consistency: Consistency, sync: Any, where: str) -> list[Problem]:
    if not isinstance(sync, PSSynchronizer):
        return []
    expected = {"bsp": (True, 0), "ssp": (True, consistency.staleness)}.get(consistency.kind)
    if consistency.kind == "asp" and sync.sync:
        return [Problem(f"{where}.sync", "must be false under asp consistency")]
    if expected is not None and (sync.sync, sync.staleness) != expected:
        return [
            Problem(
                where,
                f"sync={sync.sync}, staleness={sync.staleness} contradicts {consistency.kind} consistency (expects sync={expected[0]}, staleness={expected[1]})",
            )
        ]
    return []


def strategy_problems(strategy: Strategy, graph: ModelGraph, resources: ResourceSpec) -> list[Problem]:
    """Rules that need the graph and the cluster: names exist, coverage is exact, partitions are real."""
    problems: list[Problem] = []
    if strategy.graph_id is not None and strategy.graph_id != graph.id:
        problems.append(Problem("graph_id", f"made for graph {strategy.graph_id[:12]}, not {str(graph.id)[:12]}"))
    if strategy.resources_id is not None and strategy.resources_id != resources.id:
        problems.append(
            Problem(
                "resources_id", f"made for resource spec {strategy.resources_id[:12]}, not {str(resources.id)[:12]}"
            )
        )
    devices = set(resources.all_devices)
    for i, device in enumerate(strategy.replicas):
        if device not in devices:
            problems.append(Problem(f"replicas[{i}]", f"device {device!r} is not in the resource spec"))
    variables = {v.name: v for v in graph.variables}
    covered: set[str] = set()
    for i, config in enumerate(strategy.variables):
        var = variables.get(config.var_name)
        if var is None:
            problems.append(Problem(f"variables[{i}].var_name", f"{config.var_name!r} is not a variable of the graph"))
            continue
        if not var.trainable:
            problems.append(
                Problem(f"variables[{i}].var_name", f"{config.var_name!r} is not trainable and needs no synchronizer")
            )
        covered.add(config.var_name)
        if config.partition is not None:
            axis, shards = config.partition.axis, config.partition.shards
            if axis >= len(var.shape):
                problems.append(
                    Problem(
                        f"variables[{i}].partition.axis",
                        f"axis {axis} does not exist: {var.name} has shape {var.shape}",
                    )
                )
            elif shards > var.shape[axis]:
                problems.append(
                    Problem(
                        f"variables[{i}].partition.shards",
                        f"{shards} shards exceed axis {axis} of length {var.shape[axis]}",
                    )
                )
        for j, sync in enumerate(config.synchronizers):
            if isinstance(sync, PSSynchronizer) and sync.reduction_destination not in devices:
                problems.append(
                    Problem(
                        f"variables[{i}].synchronizer"
                        if config.shard_synchronizers is None
                        else f"variables[{i}].shard_synchronizers[{j}]",
                        f"reduction destination {sync.reduction_destination!r} is not in the resource spec",
                    )
                )
    missing = [v.name for v in graph.variables if v.trainable and v.name not in covered]
    if missing:
        shown = ", ".join(repr(n) for n in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        problems.append(Problem("variables", f"no synchronizer for trainable variable(s) {shown}"))
    if strategy.pipeline is not None:
        problems.extend(_pipeline_problems(strategy.pipeline, graph))
    problems.extend(_tensor_parallel_problems(strategy, graph))
    return problems


# The weight axis each style splits: a Linear's weight is [out, in], an Embedding's [rows, dim].
_SPLIT_AXIS = {"colwise": 0, "rowwise": 1, "vocab": 0}
_SPLIT_KINDS = {"colwise": {"matmul"}, "rowwise": {"matmul"}, "vocab": {"embedding", "matmul"}}


def _tensor_parallel_problems(strategy: Strategy, graph: ModelGraph) -> list[Problem]:
    """Every split names a module of the graph, of a kind the style can split, along an axis the tensor
    degree divides; tensor groups stay inside one node (their all-reduces sit on the critical path)."""
    degree = strategy.effective_mesh.tensor
    problems = _tensor_groups_cross_nodes(strategy.replicas, degree)
    layers = {layer.name: layer for layer in graph.layers}
    variables = {v.name: v for v in graph.variables}
    for i, split in enumerate(strategy.tensor_parallel):
        where = f"tensor_parallel[{i}]"
        if split.style == "heads":
            inside = [layer for name, layer in layers.items() if _within(name, split.name)]
            if not inside:
                problems.append(
                    Problem(f"{where}.name", f"{split.name!r} is not a module of the graph (no layer inside it)")
                )
            elif not any(layer.kind in ("matmul", "attention") for layer in inside):
                problems.append(
                    Problem(f"{where}.name", f"{split.name!r} holds no projection or attention layer to split by heads")
                )
            continue
        layer = layers.get(split.name)
        if layer is None:
            problems.append(Problem(f"{where}.name", f"{split.name!r} is not a layer of the graph"))
            continue
        if layer.kind.value not in _SPLIT_KINDS[split.style]:
            problems.append(
                Problem(
                    f"{where}.style",
                    f"{split.style} cannot split {split.name!r}, a {layer.type} ({layer.kind.value}) layer",
                )
            )
            continue
        weights = [variables[n] for n in layer.variables if len(variables[n].shape) == 2]
        if not weights:
            problems.append(Problem(f"{where}.name", f"{split.name!r} has no 2-D weight to split"))
            continue
        axis = _SPLIT_AXIS[split.style]
        length = weights[0].shape[axis]
        if length % degree:
            problems.append(
                Problem(
                    f"{where}.style",
                    f"mesh.tensor({degree}) does not divide axis {axis} of {weights[0].name} {weights[0].shape}",
                )
            )
    return problems


def _tensor_groups_cross_nodes(replicas: list[str], degree: int) -> list[Problem]:
    """Tensor groups are `degree` consecutive replicas (tensor is the innermost mesh axis)."""
    if degree == 1:
        return []
    for start in range(0, len(replicas) - degree + 1, degree):
        group = replicas[start : start + degree]
        addresses = {device_address(d) for d in group}
        if len(addresses) > 1:
            return [
                Problem(
                    "replicas",
                    f"tensor group replicas[{start}:{start + degree}] spans nodes {sorted(addresses)}; "
                    "a tensor group must stay inside one node",
                )
            ]
    return []


def _pipeline_problems(pipeline: PipelineConfig, graph: ModelGraph) -> list[Problem]:
    order = [layer.name for layer in graph.layers]
    flat = [name for stage in pipeline.stages for name in stage]
    known = set(order)
    unknown = [n for n in flat if n not in known]
    if unknown:
        return [Problem("pipeline.stages", f"unknown layer(s) {unknown[:5]}")]
    if flat != order:
        return [Problem("pipeline.stages", "stages must cover every layer exactly once, in graph order")]
    if any(not stage for stage in pipeline.stages):
        return [Problem("pipeline.stages", "a stage is empty")]
    return []


def shard_sizes(length: int, shards: int) -> list[int]:
    """Sizes of `shards` near-equal pieces of `length` (the first ones one larger), as torch.chunk-free split."""
    base, extra = divmod(length, shards)
    return [base + (1 if i < extra else 0) for i in range(shards)]


def shard_numel(shape: list[int], partition: Partition | None) -> list[int]:
    if partition is None:
        return [math.prod(shape)]
    rest = math.prod(shape) // shape[partition.axis]
    return [size * rest for size in shard_sizes(shape[partition.axis], partition.shards)]
