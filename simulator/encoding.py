"""The array encoding of a batch of candidate strategies: what the search builds, mutates and simulates.

Search evaluates tens of thousands of candidates, so a candidate is a row of numpy arrays rather than
a `Strategy` object. `encode` turns Strategies into a `CandidateBatch`, `to_strategy` turns a row back
into an executable `Strategy`, and `simulator.simulate_batch` reads the arrays directly. The layout
below is a contract with `optimizer_service/search/`; change it only by adding fields.

Indices refer to the `SimContext` the batch was built for (`simulator.compile_context(graph, resources)`):

- variables `v`: `context.variable_names`, the graph's *trainable* variables in graph order (V of them);
- layers `l`: `context.layer_names`, the graph's layers in forward order (L of them);
- devices `d`: `context.devices`, `resources.all_devices` (every GPU and CPU, node by node; D of them).
  Replicas and parameter servers both index this one table.

Per candidate, shape [N]:

| field | dtype | meaning |
|---|---|---|
| `data`, `tensor`, `pipeline` | int32 | mesh degrees; their product is the number of replicas |
| `micro_batches` | int32 | micro-batches per step: pipeline micro-batches, or gradient accumulation without a pipeline |
| `schedule` | int8 | `Schedule`: 1F1B (0) or GPipe (1); decides activations in flight |
| `consistency` | int8 | `ConsistencyKind`: BSP (0), SSP (1), ASP (2); applies to PS variables |
| `staleness` | int32 | SSP's bound in steps (0 for BSP, ignored for ASP) |
| `recompute` | bool | activation recomputation of the numbered blocks (`context.layer_recomputed`) |

Per candidate and device, shape [N, D]: `replicas` (bool) — the devices that run the model. Ranks are
assigned in device-table order (node by node), tensor innermost, then pipeline, then data:
`rank = (d · pipeline + p) · tensor + t`. A Strategy whose replicas are listed in another order is
simulated as if listed in table order.

Per candidate and layer, shape [N, L]: `layer_stage` (int8) — the pipeline stage of each layer,
non-decreasing along the forward order, `< pipeline` (all 0 without a pipeline).

Per candidate and variable, shape [N, V]:

| field | dtype | meaning |
|---|---|---|
| `kind` | int8 | `SyncKind`: ALLREDUCE (0), PS (1), SHARDED (2) |
| `group` | int32 | fusion group in `[0, V)`: all-reduce (or sharded) variables with the same group travel in one collective, launched when the last of them is ready. PS variables ignore it |
| `algorithm` | int8 | `Algorithm`: AUTO (0), RING (1), TREE (2), HIERARCHICAL (3); a fused group uses the algorithm of the member that launches it (its last-ready member) |
| `compressor` | int8 | `CompressorKind`: NONE (0), FP16 (1), BF16 (2), POWERSGD (3), TOPK (4) |
| `compressor_param` | float32 | PowerSGD's rank r, top-k's kept fraction; 0 otherwise |
| `shards` | int32 | partition shards along `partition_axis` (1 = not partitioned) |
| `partition_axis` | int8 | the axis partitioned (only matters when `shards > 1`) |
| `local_replication` | bool | PS: aggregate the node's gradients before pushing (one push per node) |

Per candidate, variable and shard, shape [N, V, K] with K = `max_shards`: `server` (int16) — the device
index (into `context.devices`) of the parameter server holding shard `k` of a PS variable. Entries with
`k >= shards[n, v]`, and all entries of non-PS variables, are -1. Shards are treated as equal slices.

Search may mutate any array in place (keeping `validate` happy); `copy`, `take`, `rows` (views) and
`concat` keep the layout, `concat` padding `server` with -1 when batches of different K are joined.
Row i of `simulate_batch`'s result depends only on row i, so re-simulating just the mutated rows
(`batch.take(changed)`) is how local search stays cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from stratagem.errors import InvalidStrategyError, Problem, UnsupportedStrategyError
from stratagem.ir import (
    Consistency,
    Mesh,
    PipelineConfig,
    Provenance,
    PSSynchronizer,
    ShardedSynchronizer,
    Strategy,
    VariableConfig,
)
from stratagem.ir.strategy import strategy_problems

if TYPE_CHECKING:
    from simulator.context import SimContext


class SyncKind(IntEnum):
    ALLREDUCE = 0
    PS = 1
    SHARDED = 2


class Algorithm(IntEnum):
    AUTO = 0
    RING = 1
    TREE = 2
    HIERARCHICAL = 3


class CompressorKind(IntEnum):
    NONE = 0
    FP16 = 1
    BF16 = 2
    POWERSGD = 3
    TOPK = 4


class ConsistencyKind(IntEnum):
    BSP = 0
    SSP = 1
    ASP = 2


class Schedule(IntEnum):
    ONE_F_ONE_B = 0
    GPIPE = 1


PER_CANDIDATE: dict[str, Any] = {
    "data": np.int32,
    "tensor": np.int32,
    "pipeline": np.int32,
    "micro_batches": np.int32,
    "schedule": np.int8,
    "consistency": np.int8,
    "staleness": np.int32,
    "recompute": np.bool_,
}
PER_VARIABLE: dict[str, Any] = {
    "kind": np.int8,
    "group": np.int32,
    "algorithm": np.int8,
    "compressor": np.int8,
    "compressor_param": np.float32,
    "shards": np.int32,
    "partition_axis": np.int8,
    "local_replication": np.bool_,
}
OTHER: dict[str, Any] = {"replicas": np.bool_, "layer_stage": np.int8, "server": np.int16}
DTYPES: dict[str, Any] = {**PER_CANDIDATE, **PER_VARIABLE, **OTHER}


@dataclass
class CandidateBatch:
    """N candidate strategies for one SimContext, as arrays (see the module docstring for each field)."""

    data: np.ndarray
    tensor: np.ndarray
    pipeline: np.ndarray
    micro_batches: np.ndarray
    schedule: np.ndarray
    consistency: np.ndarray
    staleness: np.ndarray
    recompute: np.ndarray
    replicas: np.ndarray
    layer_stage: np.ndarray
    kind: np.ndarray
    group: np.ndarray
    algorithm: np.ndarray
    compressor: np.ndarray
    compressor_param: np.ndarray
    shards: np.ndarray
    partition_axis: np.ndarray
    local_replication: np.ndarray
    server: np.ndarray

    def __len__(self) -> int:
        return int(self.data.shape[0])

    @property
    def max_shards(self) -> int:
        return int(self.server.shape[2])

    @classmethod
    def allocate(cls, context: SimContext, n: int, *, max_shards: int = 1) -> CandidateBatch:
        """N copies of plain data parallelism over every compute device: `auto` all-reduce with one
        fusion group per variable, no compression, BSP. A starting point search overwrites field by field."""
        V, L, D = context.num_variables, context.num_layers, context.num_devices
        replicas = np.zeros((n, D), dtype=np.bool_)
        replicas[:, context.compute_device_indices] = True
        return cls(
            data=np.full(n, len(context.compute_device_indices), np.int32),
            tensor=np.ones(n, np.int32),
            pipeline=np.ones(n, np.int32),
            micro_batches=np.ones(n, np.int32),
            schedule=np.zeros(n, np.int8),
            consistency=np.zeros(n, np.int8),
            staleness=np.zeros(n, np.int32),
            recompute=np.zeros(n, np.bool_),
            replicas=replicas,
            layer_stage=np.zeros((n, L), np.int8),
            kind=np.zeros((n, V), np.int8),
            group=np.tile(np.arange(V, dtype=np.int32), (n, 1)),
            algorithm=np.zeros((n, V), np.int8),
            compressor=np.zeros((n, V), np.int8),
            compressor_param=np.zeros((n, V), np.float32),
            shards=np.ones((n, V), np.int32),
            partition_axis=np.zeros((n, V), np.int8),
            local_replication=np.zeros((n, V), np.bool_),
            server=np.full((n, V, max_shards), -1, np.int16),
        )

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def copy(self) -> CandidateBatch:
        return CandidateBatch(**{name: array.copy() for name, array in self.arrays().items()})

    def rows(self, start: int, stop: int) -> CandidateBatch:
        """Candidates start..stop-1 as *views* of this batch's arrays (no copy; writes show through)."""
        return CandidateBatch(**{name: array[start:stop] for name, array in self.arrays().items()})

    def take(self, indices: np.ndarray | list[int]) -> CandidateBatch:
        """The candidates at `indices` (any order, repeats allowed), as a new batch."""
        index = np.asarray(indices, dtype=np.intp)
        return CandidateBatch(**{name: array[index] for name, array in self.arrays().items()})

    @staticmethod
    def concat(*batches: CandidateBatch) -> CandidateBatch:
        """Join batches of one context; `server` is padded with -1 to the largest K."""
        if not batches:
            raise ValueError("concat needs at least one batch")
        k = max(b.max_shards for b in batches)
        joined: dict[str, np.ndarray] = {}
        for name in DTYPES:
            parts = [getattr(b, name) for b in batches]
            if name == "server":
                parts = [_pad_shards(p, k) for p in parts]
            joined[name] = np.concatenate(parts, axis=0)
        return CandidateBatch(**joined)

    def with_max_shards(self, k: int) -> CandidateBatch:
        """The same batch with room for `k` shards per variable (grown with -1, or trimmed)."""
        out = self.copy()
        out.server = _pad_shards(self.server, k) if k >= self.max_shards else self.server[:, :, :k].copy()
        return out

    def validate(self, context: SimContext) -> None:
        """Raise InvalidStrategyError naming the first offending entries; simulate_batch trusts its input."""
        check(validation_problems(self, context), InvalidStrategyError)


def _pad_shards(server: np.ndarray, k: int) -> np.ndarray:
    if server.shape[2] == k:
        return server
    pad = np.full((server.shape[0], server.shape[1], k - server.shape[2]), -1, dtype=server.dtype)
    return np.concatenate([server, pad], axis=2)


def check(problems: list[Problem], error_type: type[InvalidStrategyError]) -> None:
    if problems:
        raise error_type(problems)


def _first_bad(path: str, bad: np.ndarray, reason: str) -> list[Problem]:
    """One problem for the first True entry of `bad`, counting the rest."""
    count = int(bad.sum())
    if count == 0:
        return []
    where = ", ".join(str(int(i)) for i in np.argwhere(bad)[0])
    more = f" ({count - 1} more entries)" if count > 1 else ""
    return [Problem(f"batch.{path}[{where}]", reason + more)]


def validation_problems(batch: CandidateBatch, context: SimContext) -> list[Problem]:
    n, V, L, D = len(batch), context.num_variables, context.num_layers, context.num_devices
    expected = {name: (n,) for name in PER_CANDIDATE} | {name: (n, V) for name in PER_VARIABLE}
    expected |= {"replicas": (n, D), "layer_stage": (n, L)}
    problems = []
    for name, array in batch.arrays().items():
        shape = expected.get(name)
        if name == "server":
            if array.ndim != 3 or array.shape[:2] != (n, V) or array.shape[2] < 1:
                problems.append(Problem(f"batch.{name}", f"shape {array.shape}, expected ({n}, {V}, K>=1)"))
        elif array.shape != shape:
            problems.append(Problem(f"batch.{name}", f"shape {array.shape}, expected {shape}"))
    if problems:
        return problems
    return _value_problems(batch, context)


def _value_problems(b: CandidateBatch, context: SimContext) -> list[Problem]:
    D, V = context.num_devices, context.num_variables
    size = b.data.astype(np.int64) * b.tensor * b.pipeline
    problems = _first_bad("data", (b.data < 1) | (b.tensor < 1) | (b.pipeline < 1), "mesh degrees must be >= 1")
    problems += _first_bad("replicas", b.replicas.sum(axis=1) != size, "number of replicas != data*tensor*pipeline")
    problems += _first_bad("micro_batches", b.micro_batches < 1, "must be >= 1")
    problems += _first_bad("schedule", (b.schedule < 0) | (b.schedule > 1), "unknown schedule")
    problems += _first_bad("consistency", (b.consistency < 0) | (b.consistency > 2), "unknown consistency")
    problems += _first_bad(
        "staleness", (b.consistency == ConsistencyKind.SSP) & (b.staleness < 1), "ssp needs staleness >= 1"
    )
    problems += _first_bad(
        "layer_stage", (b.layer_stage < 0) | (b.layer_stage >= b.pipeline[:, None]), "stage outside [0, pipeline)"
    )
    problems += _first_bad(
        "layer_stage",
        np.diff(b.layer_stage.astype(np.int32), axis=1) < 0,
        "stages must not decrease along the forward order",
    )
    problems += _first_bad("kind", (b.kind < 0) | (b.kind > 2), "unknown synchronizer kind")
    problems += _first_bad("group", (b.group < 0) | (b.group >= V), f"fusion group outside [0, {V})")
    problems += _first_bad("algorithm", (b.algorithm < 0) | (b.algorithm > 3), "unknown algorithm")
    problems += _first_bad("compressor", (b.compressor < 0) | (b.compressor > 4), "unknown compressor")
    problems += _first_bad(
        "compressor_param",
        (b.compressor == CompressorKind.POWERSGD) & (b.compressor_param < 1),
        "powersgd needs rank >= 1",
    )
    topk = b.compressor == CompressorKind.TOPK
    problems += _first_bad(
        "compressor_param",
        topk & ((b.compressor_param <= 0) | (b.compressor_param > 1)),
        "topk needs a ratio in (0, 1]",
    )
    problems += _first_bad(
        "shards",
        (b.shards < 1) | (b.shards > context.var_axis_length(b.partition_axis)),
        "shards must be in [1, length of the axis]",
    )
    problems += _first_bad(
        "shards",
        (b.kind == SyncKind.PS) & (b.shards > b.max_shards),
        f"more shards than server has room for ({b.max_shards})",
    )
    is_ps = (b.kind == SyncKind.PS)[:, :, None]
    live = np.arange(b.max_shards)[None, None, :] < b.shards[:, :, None]
    problems += _first_bad(
        "server", is_ps & live & ((b.server < 0) | (b.server >= D)), f"PS shard without a server in [0, {D})"
    )
    return problems


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


def encode(context: SimContext, strategies: list[Strategy], *, validate: bool = True) -> CandidateBatch:
    """Strategies to a batch. Raises InvalidStrategyError (path `strategies[i]...`) for a strategy that
    does not fit the graph or cluster, UnsupportedStrategyError for one the encoding cannot express."""
    max_shards = max([_ps_shards(s) for s in strategies] + [1])
    batch = CandidateBatch.allocate(context, len(strategies), max_shards=max_shards)
    for i, strategy in enumerate(strategies):
        if validate:
            problems = strategy_problems(strategy, context.graph, context.resources)
            if problems:
                raise InvalidStrategyError([Problem(f"strategies[{i}].{p.path}", p.reason) for p in problems])
        _encode_row(context, batch, i, strategy)
    return batch


def _refuse_unpriced(strategy: Strategy) -> None:
    """Knobs of the strategy document the encoding does not carry yet are refused, never ignored."""
    mesh, pipeline = strategy.effective_mesh, strategy.pipeline
    knobs = {
        f"precision {strategy.precision!r}": strategy.precision != "fp32",
        "selective recomputation": strategy.recompute == "selective",
        "sequence parallelism": strategy.sequence_parallel,
        "context parallelism": mesh.context > 1,
        f"the {pipeline.schedule if pipeline else ''} pipeline schedule": pipeline is not None
        and pipeline.schedule not in ("gpipe", "1f1b"),
        "ZeRO stage 1 or 3, or a shard group": any(
            isinstance(s, ShardedSynchronizer) and (s.stage != 2 or s.shard_group is not None)
            for c in strategy.variables
            for s in c.synchronizers
        ),
    }
    unpriced = [name for name, used in knobs.items() if used]
    if unpriced:
        raise UnsupportedStrategyError(f"the simulator does not price {', '.join(unpriced)} yet")


def _ps_shards(strategy: Strategy) -> int:
    return max([c.num_shards for c in strategy.variables if any(s.kind == "ps" for s in c.synchronizers)] + [1])


def _encode_row(context: SimContext, b: CandidateBatch, i: int, strategy: Strategy) -> None:
    mesh = strategy.effective_mesh
    b.data[i], b.tensor[i], b.pipeline[i] = mesh.data, mesh.tensor, mesh.pipeline
    b.replicas[i] = False
    b.replicas[i, [context.device_index[d] for d in strategy.replicas]] = True
    b.consistency[i] = _CONSISTENCIES[strategy.consistency.kind]
    b.staleness[i] = strategy.consistency.staleness
    _refuse_unpriced(strategy)
    b.recompute[i] = strategy.recompute == "full"
    if strategy.pipeline is not None:
        b.micro_batches[i] = strategy.pipeline.micro_batches
        b.schedule[i] = Schedule.GPIPE if strategy.pipeline.schedule == "gpipe" else Schedule.ONE_F_ONE_B
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
        stages: list[list[str]] = [[] for _ in range(int(batch.pipeline[i]))]
        for layer, name in enumerate(context.layer_names):
            stages[int(batch.layer_stage[i, layer])].append(name)
        schedule = "gpipe" if int(batch.schedule[i]) == Schedule.GPIPE else "1f1b"
        pipeline = PipelineConfig(stages=stages, micro_batches=int(batch.micro_batches[i]), schedule=schedule)
    variables = [_variable_config(context, batch, i, v, consistency) for v in range(context.num_variables)]
    return Strategy(
        graph_id=context.graph.id,
        resources_id=context.resources.id,
        replicas=replicas,
        mesh=Mesh(data=int(batch.data[i]), tensor=int(batch.tensor[i]), pipeline=int(batch.pipeline[i])),
        pipeline=pipeline,
        tensor_parallel=context.tensor_plan(int(batch.tensor[i])),
        recompute="full" if batch.recompute[i] else "none",
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
        return {
            "var_name": name,
            "synchronizer": {"kind": "sharded", "group": int(b.group[i, v])},
            "partition": partition,
        }
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
