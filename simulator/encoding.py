"""The array encoding of a batch of candidate strategies: what the search builds, mutates and simulates.

Search evaluates tens of thousands of candidates, so a candidate is a row of numpy arrays rather than
a `Strategy` object. `simulator.codec.encode` turns Strategies into a `CandidateBatch`,
`simulator.codec.to_strategy` turns a row back into an executable `Strategy`, and
`simulator.simulate_batch` reads the arrays directly. The layout below is a contract with
`optimizer_service/search/`; change it only by adding fields.

Indices refer to the `SimContext` the batch was built for (`simulator.compile_context(graph, resources)`):

- variables `v`: `context.variable_names`, the graph's *trainable* variables in graph order (V of them);
- layers `l`: `context.layer_names`, the graph's layers in forward order (L of them);
- devices `d`: `context.devices`, `resources.all_devices` (every GPU and CPU, node by node; D of them).
  Replicas and parameter servers both index this one table.

Per candidate, shape [N]:

| field | dtype | meaning |
|---|---|---|
| `data`, `tensor`, `pipeline` | int32 | mesh degrees; with `context_parallel` their product is the number of replicas |
| `context_parallel` | int32 | context-parallel degree c: each sequence split into c pieces, attention as a ring (1 = none) |
| `micro_batches` | int32 | micro-batches per step: pipeline micro-batches, or gradient accumulation without a pipeline |
| `schedule` | int8 | `Schedule`: 1F1B (0), GPipe (1), interleaved 1F1B (2), zero-bubble (3) |
| `virtual_stages` | int32 | model chunks per pipeline rank (1, or ≥ 2 for interleaved 1F1B; zero-bubble takes 1 or 2) |
| `consistency` | int8 | `ConsistencyKind`: BSP (0), SSP (1), ASP (2); applies to PS variables |
| `staleness` | int32 | SSP's bound in steps (0 for BSP, ignored for ASP) |
| `recompute` | bool | full recomputation of the numbered blocks (`context.layer_recomputed`) |
| `selective` | bool | selective recomputation: the attention cores of the numbered blocks only (not with `recompute`) |
| `selective_op` | bool | per-op selective checkpointing of the numbered blocks (`layers.op_recomputed`; not with the other two) |
| `precision` | int8 | `Precision`: FP32 (0), TF32 (1), AMP_FP16 (2), AMP_BF16 (3), BF16 (4), FP8 (5) |
| `sequence_parallel` | bool | Megatron's sequence parallelism inside the tensor group (needs `tensor > 1`) |
| `compile` | bool | `torch.compile` of the blocks: element-wise chains run as fused kernels (`simulator.kernels`) |
| `shard_group` | int32 | hybrid sharding: sharded variables shard over groups of this many data-parallel ranks and all-reduce across groups (0 = over the whole data-parallel group) |
| `micro_batch_size` | int32 | samples per micro-batch (`Strategy.micro_batch_size`): the row is priced on the graph scaled to `micro_batch_size × micro_batches` samples per replica step (`simulator.step_graph`); 0 = the graph's batch is the replica's step |
| `async_tp` | bool | async tensor parallelism: sequence parallelism's collectives overlapped piece by piece with their matmuls (needs `sequence_parallel`) |
| `fp8_gather` | bool | ZeRO-3 gathers the fp8 Linears' weights in fp8 (needs FP8 precision) |

Per candidate and device, shape [N, D]: `replicas` (bool) — the devices that run the model. Ranks are
assigned in device-table order (node by node), tensor innermost, then context, then pipeline, then
data: `rank = ((d · pipeline + p) · context + c) · tensor + t`. A Strategy whose replicas are listed in
another order is simulated as if listed in table order.

Per candidate and layer, shape [N, L]: `layer_stage` (int8) — the pipeline chunk of each layer,
non-decreasing along the forward order, `< pipeline · virtual_stages` (all 0 without a pipeline); chunk
i runs on pipeline rank `i % pipeline`.

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
| `zero_stage` | int8 | sharded variables: ZeRO stage 1 (optimizer state), 2 (and gradients) or 3 (and parameters, FSDP) |

Per candidate, variable and shard, shape [N, V, K] with K = `max_shards`: `server` (int16) — the device
index (into `context.devices`) of the parameter server holding shard `k` of a PS variable. Entries with
`k >= shards[n, v]`, and all entries of non-PS variables, are -1. Shards are treated as equal slices.

Search may mutate any array in place (keeping `validate` happy); `copy`, `take`, `rows` (views) and
`concat` keep the layout, `concat` padding `server` with -1 when batches of different K are joined.
Row i of `simulate_batch`'s result depends only on row i, so re-simulating just the mutated rows
(`batch.take(changed)`) is how local search stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from stratagem.errors import InvalidStrategyError, Problem

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
    INTERLEAVED = 2
    ZERO_BUBBLE = 3


class Precision(IntEnum):
    """The step's numerics (`Strategy.precision`); `simulator.precision` prices each."""

    FP32 = 0
    TF32 = 1
    AMP_FP16 = 2
    AMP_BF16 = 3
    BF16 = 4
    FP8 = 5
    FP16 = 6


PER_CANDIDATE: dict[str, Any] = {
    "data": np.int32,
    "tensor": np.int32,
    "pipeline": np.int32,
    "micro_batches": np.int32,
    "schedule": np.int8,
    "consistency": np.int8,
    "staleness": np.int32,
    "recompute": np.bool_,
    "context_parallel": np.int32,
    "virtual_stages": np.int32,
    "selective": np.bool_,
    "precision": np.int8,
    "sequence_parallel": np.bool_,
    "shard_group": np.int32,
    "micro_batch_size": np.int32,
    "async_tp": np.bool_,
    "fp8_gather": np.bool_,
    "compile": np.bool_,
    "selective_op": np.bool_,
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
    "zero_stage": np.int8,
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
    context_parallel: np.ndarray
    virtual_stages: np.ndarray
    selective: np.ndarray
    precision: np.ndarray
    sequence_parallel: np.ndarray
    shard_group: np.ndarray
    zero_stage: np.ndarray
    micro_batch_size: np.ndarray
    async_tp: np.ndarray
    fp8_gather: np.ndarray
    compile: np.ndarray
    selective_op: np.ndarray

    def __len__(self) -> int:
        return int(self.data.shape[0])

    @property
    def max_shards(self) -> int:
        return int(self.server.shape[2])

    @classmethod
    def allocate(cls, context: SimContext, n: int, *, max_shards: int = 1) -> CandidateBatch:
        """N copies of plain data parallelism over every compute device: `auto` all-reduce with one
        fusion group per variable, no compression, BSP, fp32, no recomputation. A starting point search
        overwrites field by field."""
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
            context_parallel=np.ones(n, np.int32),
            virtual_stages=np.ones(n, np.int32),
            selective=np.zeros(n, np.bool_),
            precision=np.zeros(n, np.int8),
            sequence_parallel=np.zeros(n, np.bool_),
            shard_group=np.zeros(n, np.int32),
            zero_stage=np.full((n, V), 2, np.int8),
            micro_batch_size=np.zeros(n, np.int32),
            async_tp=np.zeros(n, np.bool_),
            fp8_gather=np.zeros(n, np.bool_),
            compile=np.zeros(n, np.bool_),
            selective_op=np.zeros(n, np.bool_),
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


def _schedule_problems(b: CandidateBatch) -> list[Problem]:
    """Interleaving needs two or more chunks per rank; GPipe and 1F1B run one; zero-bubble one or two
    (ZB-H1, or the V-shaped ZBV)."""
    v = b.virtual_stages
    problems = _first_bad(
        "virtual_stages", (v < 1) | (v * b.pipeline >= 128), "must be >= 1, with fewer than 128 chunks"
    )
    problems += _first_bad(
        "virtual_stages", (b.schedule == Schedule.INTERLEAVED) & (v < 2), "interleaved 1F1B needs >= 2 chunks per rank"
    )
    problems += _first_bad(
        "virtual_stages", (b.schedule <= Schedule.GPIPE) & (v != 1), "GPipe and 1F1B run one chunk per rank"
    )
    problems += _first_bad(
        "virtual_stages", (b.schedule == Schedule.ZERO_BUBBLE) & (v > 2), "zero-bubble runs one or two chunks per rank"
    )
    return problems


def _value_problems(b: CandidateBatch, context: SimContext) -> list[Problem]:
    D, V = context.num_devices, context.num_variables
    size = b.data.astype(np.int64) * b.tensor * b.pipeline * b.context_parallel
    problems = _first_bad(
        "data",
        (b.data < 1) | (b.tensor < 1) | (b.pipeline < 1) | (b.context_parallel < 1),
        "mesh degrees must be >= 1",
    )
    problems += _first_bad(
        "replicas", b.replicas.sum(axis=1) != size, "number of replicas != data*tensor*pipeline*context_parallel"
    )
    problems += _first_bad(
        "micro_batches", (b.micro_batches < 1) | (b.micro_batches >= 1 << 20), "must be in [1, 2^20)"
    )
    problems += _first_bad("schedule", (b.schedule < 0) | (b.schedule > 3), "unknown schedule")
    problems += _schedule_problems(b)
    problems += _first_bad("precision", (b.precision < 0) | (b.precision > max(Precision)), "unknown precision")
    problems += _first_bad(
        "selective", b.selective & b.recompute, "selective and full recomputation exclude each other"
    )
    problems += _first_bad(
        "selective_op",
        b.selective_op & (b.recompute | b.selective),
        "per-op selective checkpointing excludes the other recomputations",
    )
    problems += _first_bad("sequence_parallel", b.sequence_parallel & (b.tensor < 2), "needs tensor > 1")
    problems += _first_bad(
        "micro_batch_size", (b.micro_batch_size < 0) | (b.micro_batch_size >= 1 << 20), "must be in [0, 2^20)"
    )
    problems += _first_bad("async_tp", b.async_tp & ~b.sequence_parallel, "needs sequence_parallel")
    problems += _first_bad("fp8_gather", b.fp8_gather & (b.precision != Precision.FP8), "needs FP8 precision")
    problems += _first_bad("tensor", b.tensor >= 1 << 12, "must be < 4096")
    problems += _first_bad("context_parallel", b.context_parallel >= 1 << 12, "must be < 4096")
    group = b.shard_group
    problems += _first_bad(
        "shard_group", (group < 0) | ((group > 0) & (b.data % np.maximum(group, 1) != 0)), "must divide data (0: all)"
    )
    problems += _first_bad(
        "zero_stage", (b.kind == SyncKind.SHARDED) & ((b.zero_stage < 1) | (b.zero_stage > 3)), "ZeRO stage 1, 2 or 3"
    )
    problems += _first_bad("consistency", (b.consistency < 0) | (b.consistency > 2), "unknown consistency")
    problems += _first_bad(
        "staleness", (b.consistency == ConsistencyKind.SSP) & (b.staleness < 1), "ssp needs staleness >= 1"
    )
    problems += _first_bad(
        "layer_stage",
        (b.layer_stage < 0) | (b.layer_stage >= (b.pipeline * b.virtual_stages)[:, None]),
        "stage outside [0, pipeline*virtual_stages)",
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
