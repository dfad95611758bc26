"""The strategy space: which choices exist for each variable and globally, and how many there are.

A point of the space is one row of `simulator.encoding.CandidateBatch`. This module decides which
rows are *allowed* (the constraints) and counts them; `proposals` and `moves` only ever write
allowed values, so every row the search evaluates decodes to a valid Strategy.

Knobs, per trainable variable:
- synchronizer: all-reduce (algorithm, compressor, fusion group), parameter server (one server per
  node, the server of each shard, local replication) or ZeRO-style sharded;
- partition: the axis and the number of shards (at most the axis length and MAX_SHARDS_LIMIT; a
  parameter-server variable along axis 0 and at most one shard per server).
Global knobs: consistency (BSP; SSP with a staleness bound and ASP only with `allow_async`) and the
layout (`MeshChoice`, `meshes.py`: data × tensor × pipeline × context degrees with tensor groups inside
a node, stage splits balanced by compute, micro-batches, schedule and virtual stages, recomputation,
sequence parallelism, precision, compile and async tensor parallelism, each within `dimensions.Rules`),
plus the ZeRO stage, hybrid shard group and fp8 all-gathers of the sharded variables.

Constraints: a sparse variable is held by parameter servers and partitioned along its rows (axis 0),
because only a server moves just the rows a step touches; lossy compression and non-BSP consistency
change the training math, so they are off unless the caller allows them, and so is a precision other
than the request's; compile is the request's too (whether the user's trainer compiles) unless the caller
allows the search to change it; under a global batch every candidate trains exactly that many samples per step;
memory feasibility is the simulator's verdict per candidate, so `space_size` counts candidates before
that check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from optimizer_service.search.dimensions import PRECISION_NAMES, RUNNERS, Rules, divisors, rules_for
from optimizer_service.search.meshes import MeshChoice, mesh_choices, mesh_notes, pipeline_micro_batches
from optimizer_service.search.stage_cuts import StageCuts
from simulator.context import SimContext, compile_context
from simulator.encoding import CompressorKind, ConsistencyKind
from stratagem.builders import ps_servers
from stratagem.ir import ModelGraph, ResourceSpec
from stratagem.parallel_rules import master_weights_refusal

ALGORITHMS = 4
"""auto, ring, tree, hierarchical (`simulator.encoding.Algorithm`)."""
SSP_STALENESS = (1, 2, 4, 8)
POWERSGD_RANKS = (1, 2, 4)
TOPK_RATIOS = (0.01, 0.1)
MAX_SHARDS_LIMIT = 8
"""The most shards the search gives one variable: enough to spread the largest tables over 8 servers
while other variables fill the rest; more shards cost per-shard latency and [N, V, K] array work."""


@dataclass(frozen=True)
class SearchOptions:
    """What the caller allows the search to change beyond the system-only knobs, and what it fixes.

    The `allow_` flags default to off because they change what is computed, not just where: a lossy
    compressor (fp16, bf16, PowerSGD, top-k) perturbs every gradient, SSP/ASP let workers read stale
    parameters, and another precision rounds every matmul differently, so convergence may need a
    different learning rate or more steps — a trade the user must choose, not one a throughput
    simulator can judge.
    """

    allow_compression: bool = False
    allow_async: bool = False
    allow_precision: bool = False
    precision: str = "fp32"
    """The numerics the user trains in (`Strategy.precision`); the only one offered unless `allow_precision`."""
    compile: bool = False
    """Whether the user's trainer compiles its blocks (`Strategy.compile`); every candidate carries it unless
    `allow_compile`."""
    allow_compile: bool = False
    """The search may change `compile`: compiling is a change to the user's training script (compile time,
    graph breaks in their model), not to its math, but still the user's to make."""
    global_batch: int | None = None
    """Samples per optimizer step over all replicas, part of the user's numerics: every candidate trains
    exactly this many, the graph read at the micro-batch. None: the graph's batch is a replica's step."""
    runner: str = "stratagem"
    """Who runs the answer (`dimensions.py`): `stratagem` (`stratagem.distribute`) or `engine` (the
    trainers a strategy exports to: torchtitan, Megatron-LM)."""

    @property
    def precision_value(self) -> int:
        return int(PRECISION_NAMES[self.precision])

    def as_record(self) -> dict[str, object]:
        """The options as the candidates' provenance records them."""
        return {
            "allow_compression": self.allow_compression,
            "allow_async": self.allow_async,
            "allow_precision": self.allow_precision,
            "precision": self.precision,
            "compile": self.compile,
            "allow_compile": self.allow_compile,
            "global_batch": self.global_batch,
            "runner": self.runner,
        }


def option_problems(options: SearchOptions) -> list[str]:
    """Why the options cannot be searched (field and reason), empty when they can."""
    problems = []
    if options.precision not in PRECISION_NAMES:
        problems.append(f"precision: {options.precision!r} is not one of {', '.join(PRECISION_NAMES)}")
    for name in ("compile", "allow_compile"):
        if not isinstance(getattr(options, name), bool):
            problems.append(f"{name}: must be true or false, got {getattr(options, name)!r}")
    batch = options.global_batch
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        problems.append(f"global_batch: must be a positive integer or null, got {batch!r}")
    if options.runner not in RUNNERS:
        problems.append(f"runner: {options.runner!r} is not one of {', '.join(RUNNERS)}")
    elif options.runner != "engine" and (refusal := master_weights_refusal(options.precision)) is not None:
        problems.append(f"precision: {refusal}")
    return problems


@dataclass(frozen=True)
class Compression:
    kind: CompressorKind
    param: float = 0.0

    def label(self) -> str:
        suffix = f"({self.param:g})" if self.param else ""
        return f"{self.kind.name.lower()}{suffix}"


@dataclass(frozen=True)
class ConsistencyChoice:
    kind: ConsistencyKind
    staleness: int = 0


class Space:
    """The allowed values of every knob for one (graph, cluster, options)."""

    def __init__(self, context: SimContext, options: SearchOptions | None = None) -> None:
        resources = context.resources
        self.context = context
        self.options = options or SearchOptions()
        self.num_variables = context.num_variables
        self.backward_order = context.order
        """Variables in the order their gradients become ready."""
        self.ready_rank = np.empty(self.num_variables, dtype=np.int64)
        self.ready_rank[self.backward_order] = np.arange(self.num_variables)
        self.server_names = ps_servers(resources)
        self.servers = np.array([context.device_index[s] for s in self.server_names], dtype=np.int16)
        """Device indices of the parameter servers, one per node (AutoDist's rule)."""
        self.num_servers = len(self.server_names)
        self.server_slot = np.full(context.num_devices + 1, self.num_servers, dtype=np.int64)
        """Device index -> server slot (S for devices that are not servers); index -1 (no server) maps to S."""
        self.server_slot[self.servers] = np.arange(self.num_servers)
        self.server_bandwidth = context.nic_bandwidth[context.device_node[self.servers]]
        self.max_shards = max(1, min(self.num_servers, MAX_SHARDS_LIMIT))
        """Most shards of a PS variable: one per server, at most MAX_SHARDS_LIMIT."""
        self.max_allreduce_shards = MAX_SHARDS_LIMIT
        """Most shards of an all-reduced variable (PartitionedAR): they need no servers."""
        self.local_replication_useful = any(len(node.compute_devices) > 1 for node in resources.nodes)
        self.rules: Rules = rules_for(
            context,
            runner=self.options.runner,
            precision=self.options.precision_value,
            allow_precision=self.options.allow_precision,
            compile=self.options.compile,
            allow_compile=self.options.allow_compile,
            global_batch=self.options.global_batch,
        )
        self.cuts = StageCuts(context, self.rules)
        self.meshes: list[MeshChoice] = mesh_choices(context, self.rules, self.cuts)
        """The layouts the search starts from; [0] is plain data parallel (where the global batch allows).
        The descent registers the layouts it reaches (`register`)."""
        self.mesh_index = {mesh: i for i, mesh in enumerate(self.meshes)}
        self.first_meshes = len(self.meshes)
        self.compressions = _compressions(self.options)
        self.compression_allowed = np.array(
            [[c in self.compressions_for(v) for v in range(self.num_variables)] for c in self.compressions], dtype=bool
        ).reshape(len(self.compressions), self.num_variables)
        """[compressions, V] whether each compressor shrinks each variable."""
        self.consistencies = _consistencies(self.options)
        self.shard_limit = self._shard_limits()
        self.placements: dict[tuple, np.ndarray] = {}
        """Memo of balanced server placements (`assign.balanced_servers`): proposals repeat them."""

    @property
    def precision(self) -> int:
        """The request's precision (`Precision`): every row carries it unless `allow_precision`."""
        return self.rules.precisions[0]

    @property
    def compile(self) -> bool:
        """The request's `compile`: every row carries it unless `allow_compile`."""
        return self.rules.compiles[0]

    @property
    def reference_samples(self) -> float | None:
        """Samples a candidate's score is the time for: the global batch where the request fixes it, else
        None (a data-parallel step's, `evaluate.normalized_step`)."""
        return float(self.rules.global_batch) if self.rules.global_batch is not None else None

    def register(self, mesh: MeshChoice) -> int:
        """The index of a layout in `meshes`, appending it the first time."""
        index = self.mesh_index.get(mesh)
        if index is None:
            index = self.mesh_index[mesh] = len(self.meshes)
            self.meshes.append(mesh)
        return index

    def _shard_limits(self) -> np.ndarray:
        """Most parameter-server shards per variable: the room kept per variable, capped by axis 0."""
        axis0 = self.context.var_shape[:, 0]
        return np.clip(np.minimum(axis0, self.max_shards), 1, None).astype(np.int32)

    def compressions_for(self, v: int) -> list[Compression]:
        """Compressors that shrink this variable: PowerSGD only for matrices where (m + n)·r < m·n."""
        rows, cols = float(self.context.var_rows[v]), float(self.context.var_cols[v])
        allowed = []
        for choice in self.compressions:
            if choice.kind == CompressorKind.POWERSGD and (rows + cols) * choice.param >= rows * cols:
                continue
            allowed.append(choice)
        return allowed


def _compressions(options: SearchOptions) -> list[Compression]:
    choices = [Compression(CompressorKind.NONE)]
    if options.allow_compression:
        choices += [Compression(CompressorKind.FP16), Compression(CompressorKind.BF16)]
        choices += [Compression(CompressorKind.POWERSGD, float(r)) for r in POWERSGD_RANKS]
        choices += [Compression(CompressorKind.TOPK, r) for r in TOPK_RATIOS]
    return choices


def _consistencies(options: SearchOptions) -> list[ConsistencyChoice]:
    choices = [ConsistencyChoice(ConsistencyKind.BSP)]
    if options.allow_async:
        choices += [ConsistencyChoice(ConsistencyKind.SSP, s) for s in SSP_STALENESS]
        choices.append(ConsistencyChoice(ConsistencyKind.ASP))
    return choices


# --- counting --------------------------------------------------------------------------------------


class SpaceSize(BaseModel):
    """How big the space is, for the dashboard: log10 of the count and the size of each knob."""

    model_config = ConfigDict(extra="forbid")

    log10_candidates: float
    """log10 of the number of distinct candidates (before the memory check)."""
    knobs: dict[str, float] = Field(default_factory=dict)
    """Per knob, log10 of the choices it offers on its own, over every variable it applies to. Knobs
    overlap (only an all-reduced variable has an algorithm), so they add up to more than the total."""
    variables: int
    sparse_variables: int
    parameter_servers: int
    notes: list[str] = Field(default_factory=list)


def space_size(graph: ModelGraph, resources: ResourceSpec, options: SearchOptions | None = None) -> SpaceSize:
    """Count the space exactly, in log space (the counts overflow any integer type for real models)."""
    return size_of(Space(compile_context(graph, resources), options))


def size_of(space: Space) -> SpaceSize:
    counts = _VariableCounts(space)
    fusion = max(0, space.num_variables - 1) * math.log10(2)
    globals_ = math.log10(len(space.consistencies)) + math.log10(space.first_meshes)
    knobs = {
        "synchronizer": float(np.where(counts.sparse, 0.0, math.log10(3)).sum()),
        "ps_placement": float(counts.placements.sum()),
        "local_replication": float(counts.replication * space.num_variables),
        "partition": float(np.log10(np.maximum(counts.ar_partitions, space.shard_limit)).sum()),
        "algorithm": float(np.where(counts.sparse, 0.0, math.log10(ALGORITHMS)).sum()),
        "compressor": float(np.where(counts.sparse, 0.0, np.log10(counts.compressors)).sum()),
        "fusion": fusion,
        "consistency": math.log10(len(space.consistencies)),
        "mesh": math.log10(space.first_meshes),
        **_layout_knobs(space.rules),
    }
    notes = [
        "a parameter-server variable's shards are each placed on any server",
        "fusion counts contiguous groups in backward order over all variables (an upper bound)",
        "candidates that do not fit in memory are counted; the simulator rejects them per candidate",
    ]
    if space.first_meshes == 1:
        notes.append(
            "mesh: pure data parallelism only (nothing to split, or one device per node and no place to cut stages)"
        )
    notes += mesh_notes(space.context, space.rules)
    notes.append(
        "mesh counts the layouts the search starts from; layouts, the legal layouts the descent walks "
        "(degrees, micro-batches, schedule, recomputation, sequence parallelism, precision, compile, async "
        "tensor parallelism); zero, the ZeRO stages (fp8 all-gathers as a fourth where fp8 is offered) and "
        "hybrid shard groups"
    )
    return SpaceSize(
        log10_candidates=round(float(counts.per_variable.sum()) + fusion + globals_, 3),
        knobs={name: round(value, 3) for name, value in knobs.items()},
        variables=space.num_variables,
        sparse_variables=int(counts.sparse.sum()),
        parameter_servers=space.num_servers,
        notes=notes,
    )


def _layout_knobs(rules: Rules) -> dict[str, float]:
    """log10 of the legal layouts, and of each new dimension's own choices."""
    layouts = 0
    groups = 0
    for tensor in rules.tensor:
        for context in rules.context:
            for pipeline in divisors(rules.devices // (tensor * context)):
                if pipeline > rules.max_pipeline(tensor, context):
                    break
                data = rules.devices // (tensor * context * pipeline)
                micro = _micro_options(rules, data, pipeline)
                per = sum(len(rules.schedules(pipeline, m)) for m in micro)
                split = _split_knobs(rules, tensor)
                precision = sum(rules.precision_ok(p, tensor) for p in rules.precisions)
                layouts += per * len(rules.recompute_modes(pipeline)) * split * precision
                groups = max(groups, len(rules.shard_groups(data, tensor, pipeline, context)))
    return {
        "layouts": math.log10(max(layouts, 1)),
        "context": math.log10(len(rules.context)),
        "recompute": math.log10(len(rules.recompute)),
        "precision": math.log10(len(rules.precisions)),
        "compile": math.log10(len(rules.compiles)),
        "zero": math.log10((3 + int(rules.fp8_gather)) * (1 + groups)),
    }


def _split_knobs(rules: Rules, tensor: int) -> int:
    """Sequence parallelism × compile × async tensor parallelism on a tensor degree: the legal triples."""
    out = 0
    for compile in rules.compiles:
        out += 1
        if tensor > 1 and rules.sequence_parallel:
            out += 1 + int(rules.async_tp_ok(tensor, sequence_parallel=True, compile=compile))
    return out


def _micro_options(rules: Rules, data: int, pipeline: int) -> list[int]:
    """Micro-batch counts a replica may run per step on this layout."""
    if rules.global_batch is not None:
        if rules.global_batch % data:
            return []
        per_replica = rules.global_batch // data
        return [per_replica // size for size in divisors(per_replica)] if pipeline > 1 or rules.accumulate else [1]
    if pipeline > 1:
        return pipeline_micro_batches(rules.graph_batch, pipeline)
    return divisors(rules.graph_batch) if rules.accumulate else [1]


class _VariableCounts:
    """log10 of each variable's choices: parameter server (any shard count, each shard on any server,
    replicated or not), all-reduce (algorithm × compressor × partition) or sharded; sparse: servers only."""

    def __init__(self, space: Space) -> None:
        context = space.context
        self.sparse = context.var_sparse
        servers, limit = space.num_servers, space.shard_limit.astype(np.float64)
        self.replication = math.log10(2) if space.local_replication_useful else 0.0
        # log10 of sum_{k=1..L} S^k, written to stay finite for large S and L
        if servers > 1:
            ratio = 1.0 / servers
            self.placements = limit * math.log10(servers) + np.log10((1 - ratio**limit) / (1 - ratio))
        else:
            self.placements = np.log10(limit)
        self.compressors = space.compression_allowed.sum(axis=0).astype(np.float64)
        lengths = np.minimum(context.var_shape, space.max_allreduce_shards)
        self.ar_partitions = 1 + np.maximum(lengths - 1, 0).sum(axis=1)
        ps = self.placements + self.replication
        allreduce = np.log10(ALGORITHMS * self.compressors * self.ar_partitions)
        dense = np.logaddexp(np.logaddexp(ps * LN10, allreduce * LN10), 0.0) / LN10
        self.per_variable = np.where(self.sparse, ps, dense)


LN10 = math.log(10)
