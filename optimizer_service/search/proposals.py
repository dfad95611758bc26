"""Structured proposals: whole strategies built from what is known to work, before any local search.

Variables are grouped by what decides their best synchronizer: size (latency-bound small tensors
want fusion, big ones want bandwidth), sparsity (only a parameter server moves just the touched rows)
and position in backward (gradients ready last have no compute left to hide behind). Each family
below is one idea from the literature, instantiated over a few settings:

- `allreduce_fusion`: Horovod/DDP — dense all-reduce fused into buckets in backward order;
- `balanced_ps`: AutoDist's PS family, placed by bytes or by NIC bandwidth, optionally partitioned;
- `hybrid`: Parallax — small dense all-reduced, large dense and sparse on balanced servers;
- `sharded_large`: ZeRO for the big tensors, all-reduce for the rest (memory-bound models);
- `by_position`: all-reduce where backward hides it, servers where it cannot;
- `compressed_allreduce` / `relaxed_ps`: only when the caller allows compression / SSP and ASP;
- `mesh_layouts`: Megatron-style — every layout the space starts from (`meshes.py`), with fused
  all-reduce over the data-parallel group, and with the dense variables at ZeRO stage 1, 2 and 3 (at
  fp8, ZeRO-3 gathering the fp8 weights in fp8, torchtitan's float8 recipe);
- `autosync_samples`: AutoSync-style sampling, one random choice per (size, sparsity, position) class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from optimizer_service.search.assign import (
    balanced_servers,
    respect_mesh,
    set_allreduce,
    set_fusion,
    set_mesh,
    set_ps,
    set_sharded,
    set_zero,
    write_whole,
)
from optimizer_service.search.space import Space
from simulator.encoding import Algorithm, CandidateBatch, CompressorKind, ConsistencyKind, SyncKind

MB = 1024 * 1024
FUSION_CAPS = (0.0, 1 * MB, 4 * MB, 16 * MB, 25 * MB, 64 * MB, 256 * MB, float("inf"))
"""Bucket caps tried: 0 is one collective per variable, inf one collective for everything."""
ZERO_STAGES = (1, 2, 3)
DEFAULT_ZERO_STAGE = 2
"""The stage a sharded variable takes unless a proposal or move says otherwise (`CandidateBatch.allocate`)."""
SMALL_BYTES = 256 * 1024
LARGE_BYTES = 16 * MB


@dataclass
class Proposals:
    """A batch of candidates and, per row, how it was made (carried into `provenance.search`)."""

    batch: CandidateBatch
    labels: list[str]


RowWriter = Callable[[Space, CandidateBatch, np.ndarray], None]


def structured_proposals(space: Space, max_shards: int) -> Proposals:
    """Every structured family, one row per (family, setting)."""
    servers = _servers_useful(space)
    layouts = mesh_layouts(space)
    first = layouts if space.rules.global_batch is not None else []
    writers = [
        *first,
        *allreduce_fusion(space),
        *(balanced_ps(space) if servers else []),
        *(hybrid(space) if servers else []),
        *sharded_large(space),
        *(by_position(space) if servers else []),
        *compressed_allreduce(space),
        *(relaxed_ps(space) if servers else []),
        *([] if first else layouts),
    ]
    batch = CandidateBatch.allocate(space.context, len(writers), max_shards=max_shards)
    batch.precision[:] = space.precision
    batch.compile[:] = space.compile
    labels = []
    for i, (label, write) in enumerate(writers):
        write(space, batch, np.array([i]))
        labels.append(label)
    respect_mesh(space, batch)
    return Proposals(batch, labels)


def _servers_useful(space: Space) -> bool:
    """Whether the families that put dense variables on parameter servers can: rows start on the first
    layout, and where it is meshed (under a global batch, accumulated micro-batches) `respect_mesh` turns
    every dense server variable into all-reduce — the rows would repeat `allreduce_fusion`'s."""
    first = space.meshes[0]
    meshed = first.tensor * first.pipeline * first.context > 1 or first.micro_batches > 1
    return not meshed or bool(space.context.var_sparse.any())


# --- families --------------------------------------------------------------------------------------


def allreduce_fusion(space: Space) -> list[tuple[str, RowWriter]]:
    out = []
    for cap in FUSION_CAPS:
        for algorithm in Algorithm:
            out.append((f"allreduce_fusion(cap={_mb(cap)}, {algorithm.name.lower()})", _allreduce_row(cap, algorithm)))
    return out


def balanced_ps(space: Space) -> list[tuple[str, RowWriter]]:
    out = []
    for partition in ("none", "large", "all"):
        for by_bandwidth in (False, True):
            for replicate in _replication_choices(space):
                label = f"balanced_ps(partition={partition}, by={'bandwidth' if by_bandwidth else 'bytes'}, local_replication={replicate})"
                out.append((label, _ps_row(partition, by_bandwidth, replicate)))
    return out


def hybrid(space: Space) -> list[tuple[str, RowWriter]]:
    out = []
    for share in (0.0, 0.01, 0.05, 0.25, 0.5):
        for cap in (4 * MB, 25 * MB, float("inf")):
            for replicate in _replication_choices(space):
                label = f"hybrid(top {share:.0%} of dense on PS, cap={_mb(cap)}, local_replication={replicate})"
                out.append((label, _hybrid_row(share, cap, replicate)))
    return out


def sharded_large(space: Space) -> list[tuple[str, RowWriter]]:
    out = []
    for share in (0.05, 0.25, 1.0):
        for cap in (4 * MB, 25 * MB, float("inf")):
            out.append((f"sharded_large(top {share:.0%} of dense sharded, cap={_mb(cap)})", _sharded_row(share, cap)))
    return out


def by_position(space: Space) -> list[tuple[str, RowWriter]]:
    out = []
    for late in (0.1, 0.25, 0.5):
        for replicate in _replication_choices(space):
            out.append(
                (
                    f"by_position(last {late:.0%} of backward on PS, local_replication={replicate})",
                    _position_row(late, replicate),
                )
            )
    return out


def compressed_allreduce(space: Space) -> list[tuple[str, RowWriter]]:
    """Only with `allow_compression`: dense all-reduce, compressed wherever the compressor shrinks a variable."""
    out = []
    for index, compression in enumerate(space.compressions):
        if compression.kind == CompressorKind.NONE:
            continue
        for cap in (25 * MB, float("inf")):
            out.append((f"compressed_allreduce({compression.label()}, cap={_mb(cap)})", _compressed_row(index, cap)))
    return out


def relaxed_ps(space: Space) -> list[tuple[str, RowWriter]]:
    """Only with `allow_async`: balanced parameter servers under each SSP bound and ASP."""
    out = []
    for choice in space.consistencies:
        if choice.kind == ConsistencyKind.BSP:
            continue
        for replicate in _replication_choices(space):
            label = (
                f"relaxed_ps({choice.kind.name.lower()}, staleness={choice.staleness}, local_replication={replicate})"
            )
            out.append((label, _relaxed_row(choice.kind, choice.staleness, replicate)))
    return out


def mesh_layouts(space: Space) -> list[tuple[str, RowWriter]]:
    """Every layout the space starts from other than plain data parallelism, with all-reduce fused in 25 MB
    buckets over the data-parallel group, and with the dense variables ZeRO-sharded at stages 1, 2 and 3
    (optimizer state; and gradients; and parameters, FSDP) for layouts short of memory; FSDP gathers fp8
    weights in fp8 where the rules allow it (the descent tries it off)."""
    out = []
    for index in _layout_order(space):
        mesh = space.meshes[index]
        if index == 0 and not mesh.micro_batch_size:
            continue
        out.append((f"mesh_layout({mesh.label()}, allreduce)", mesh_row(index)))
        for stage in ZERO_STAGES:
            name = "sharded" if stage == DEFAULT_ZERO_STAGE else f"zero-{stage}"
            out.append((f"mesh_layout({mesh.label()}, {name})", mesh_row(index, sharded=True, stage=stage)))
    return out


def _layout_order(space: Space) -> list[int]:
    """The order layouts are proposed in. Under a global batch they come before every other family:
    each tensor × pipeline split once before any split's variants (micro-batch, context, schedule), the
    widest tensor degree first (Megatron's recipe: tensor parallelism fills a node, then pipeline stages
    are added). A large cluster whose step graphs are slow to compile may price only a few dozen layouts
    in its time budget; those must include the pipeline depths that fit a large model's memory."""
    indices = list(range(len(space.meshes)))
    if space.rules.global_batch is None:
        return indices
    meshes = space.meshes
    seen: dict[tuple[int, int], int] = {}
    variant = {}
    for i in indices[1:]:
        split = (meshes[i].tensor, meshes[i].pipeline)
        variant[i] = seen.get(split, 0)
        seen[split] = variant[i] + 1
    return [0, *sorted(indices[1:], key=lambda i: (variant[i], -meshes[i].tensor, meshes[i].pipeline, i))]


# --- row writers -----------------------------------------------------------------------------------


def mesh_row(index: int, *, sharded: bool = False, stage: int = 2) -> RowWriter:
    """Rows on layout `index` of the space, all-reduce fused in 25 MB buckets over the data-parallel group
    (with `sharded`, the dense variables ZeRO-sharded at `stage` instead)."""
    variables = _sharded_row(1.0, 25 * MB) if sharded else _allreduce_row(25 * MB, Algorithm.AUTO)

    def write(space: Space, batch: CandidateBatch, rows: np.ndarray) -> None:
        variables(space, batch, rows)
        if sharded:
            set_zero(batch, rows, stage)
        set_mesh(space, batch, rows, index)
        mesh = space.meshes[index]
        batch.fp8_gather[rows] = sharded and stage == 3 and space.rules.fp8_gather_ok(mesh.precision)

    return write


def _allreduce_row(cap: float, algorithm: Algorithm) -> RowWriter:
    def write(space: Space, batch: CandidateBatch, rows: np.ndarray) -> None:
        dense = ~space.context.var_sparse
        set_allreduce(batch, rows, dense, algorithm=algorithm)
        _sparse_to_ps(space, batch, rows, replicate=False)
        set_fusion(space, batch, rows, cap, first_cap_bytes=1 * MB if 25 * MB <= cap < float("inf") else None)

    return write


def _ps_row(partition: str, by_bandwidth: bool, replicate: bool) -> RowWriter:
    def write(space: Space, batch: CandidateBatch, rows: np.ndarray) -> None:
        traffic = space.context.var_ps_bytes
        if partition == "none":
            shards = np.ones(space.num_variables, dtype=np.int32)
        elif partition == "all":
            shards = space.shard_limit.copy()
        else:
            large = traffic >= traffic.sum() / max(space.num_servers, 1) / 4
            shards = np.where(large, space.shard_limit, 1)
        servers = balanced_servers(space, traffic, shards, by_bandwidth=by_bandwidth)
        set_ps(batch, rows, np.ones(space.num_variables, bool), servers, local_replication=replicate)

    return write


def _hybrid_row(share: float, cap: float, replicate: bool) -> RowWriter:
    def write(space: Space, batch: CandidateBatch, rows: np.ndarray) -> None:
        on_ps = _largest_dense(space, share) | space.context.var_sparse
        set_allreduce(batch, rows, ~on_ps)
        _to_balanced_ps(space, batch, rows, on_ps, replicate)
        set_fusion(space, batch, rows, cap)

    return write


def _sharded_row(share: float, cap: float) -> RowWriter:
    def write(space: Space, batch: CandidateBatch, rows: np.ndarray) -> None:
        sharded = _largest_dense(space, share)
        set_allreduce(batch, rows, ~sharded & ~space.context.var_sparse)
        set_sharded(batch, rows, sharded)
        _sparse_to_ps(space, batch, rows, replicate=False)
        set_fusion(space, batch, rows, cap)

    return write


def _position_row(late: float, replicate: bool) -> RowWriter:
    def write(space: Space, batch: CandidateBatch, rows: np.ndarray) -> None:
        cutoff = (1.0 - late) * space.num_variables
        on_ps = (space.ready_rank >= cutoff) | space.context.var_sparse
        set_allreduce(batch, rows, ~on_ps)
        _to_balanced_ps(space, batch, rows, on_ps, replicate)
        set_fusion(space, batch, rows, 25 * MB, first_cap_bytes=1 * MB)

    return write


def _compressed_row(index: int, cap: float) -> RowWriter:
    def write(space: Space, batch: CandidateBatch, rows: np.ndarray) -> None:
        compression = space.compressions[index]
        allowed = space.compression_allowed[index]
        dense = ~space.context.var_sparse
        set_allreduce(
            batch,
            rows,
            dense,
            compressor=np.where(allowed, int(compression.kind), int(CompressorKind.NONE)),
            param=np.where(allowed, compression.param, 0.0),
        )
        _sparse_to_ps(space, batch, rows, replicate=False)
        set_fusion(space, batch, rows, cap)

    return write


def _relaxed_row(kind: ConsistencyKind, staleness: int, replicate: bool) -> RowWriter:
    def write(space: Space, batch: CandidateBatch, rows: np.ndarray) -> None:
        _ps_row("large", True, replicate)(space, batch, rows)
        batch.consistency[rows] = kind
        batch.staleness[rows] = staleness

    return write


def _largest_dense(space: Space, share: float) -> np.ndarray:
    """The dense variables that together hold `share` of the dense bytes, biggest first (at least one)."""
    dense = ~space.context.var_sparse
    nbytes = np.where(dense, space.context.var_bytes, 0.0)
    if share >= 1.0:
        return dense
    order = np.argsort(-nbytes, kind="stable")
    cumulative = np.cumsum(nbytes[order])
    chosen = np.zeros(space.num_variables, dtype=bool)
    if share <= 0.0 or cumulative[-1] <= 0:
        return chosen
    count = int(np.searchsorted(cumulative, share * cumulative[-1])) + 1
    chosen[order[:count]] = True
    return chosen & dense


def _to_balanced_ps(space: Space, batch: CandidateBatch, rows: np.ndarray, mask: np.ndarray, replicate: bool) -> None:
    traffic = np.where(mask, space.context.var_ps_bytes, 0.0)
    large = traffic >= traffic.sum() / max(space.num_servers, 1) / 4
    shards = np.where(mask & large, space.shard_limit, 1)
    servers = balanced_servers(space, traffic, np.where(mask, shards, 0), by_bandwidth=True)
    set_ps(batch, rows, mask, servers, local_replication=replicate)


def _sparse_to_ps(space: Space, batch: CandidateBatch, rows: np.ndarray, replicate: bool) -> None:
    if space.context.var_sparse.any():
        _to_balanced_ps(space, batch, rows, space.context.var_sparse, replicate)


def _replication_choices(space: Space) -> tuple[bool, ...]:
    return (False, True) if space.local_replication_useful else (False,)


def _mb(cap: float) -> str:
    if cap == float("inf"):
        return "all"
    return f"{cap / MB:g}MB"


# --- AutoSync-style sampling -------------------------------------------------------------------------


def variable_classes(space: Space) -> np.ndarray:
    """Class of each variable: size bucket (3) × sparse (2) × third of backward (3), as one int."""
    nbytes = space.context.var_bytes
    size = np.where(nbytes < SMALL_BYTES, 0, np.where(nbytes < LARGE_BYTES, 1, 2))
    third = np.minimum(3 * space.ready_rank // max(space.num_variables, 1), 2)
    return size + 3 * space.context.var_sparse.astype(np.int64) + 6 * third


def autosync_samples(space: Space, n: int, rng: np.random.Generator, max_shards: int) -> Proposals:
    """n candidates: each class of variables gets one random choice, each variable a small chance of its own.

    Per class: the synchronizer (all-reduce 50%, PS 35%, sharded 15%), the algorithm and compressor,
    whether PS variables are partitioned and replicated; per row: the fusion cap, the consistency and,
    for half the rows, a mesh layout.
    PS shards are dealt round-robin from a random server, biggest variables first.
    """
    batch = CandidateBatch.allocate(space.context, n, max_shards=max_shards)
    batch.precision[:] = space.precision
    batch.compile[:] = space.compile
    if n == 0:
        return Proposals(batch, [])
    classes = variable_classes(space)
    V = space.num_variables
    mix = [0.5, 0.35, 0.15]
    kind = rng.choice(3, size=(n, 18), p=mix)[:, classes]
    kind = np.where(rng.random((n, V)) < 0.1, rng.choice(3, size=(n, V), p=mix), kind)
    kind = np.where(space.context.var_sparse[None, :], SyncKind.PS, kind).astype(np.int8)
    compressor, param = _sample_compression(space, rng, n, classes)
    shards = np.where((rng.random((n, 18)) < 0.5)[:, classes], space.shard_limit[None, :], 1)
    shards = np.where(kind == SyncKind.PS, shards, 0)
    write_whole(
        space,
        batch,
        kind,
        algorithm=rng.integers(len(Algorithm), size=(n, 18))[:, classes],
        compressor=compressor,
        param=param,
        shards=shards,
        first_server=_dealt(space, shards) + rng.integers(space.num_servers, size=(n, 1)),
        replicate=(rng.random((n, 18)) < 0.5)[:, classes] & space.local_replication_useful,
    )
    rows = np.arange(n)
    set_fusion(space, batch, rows, np.array(FUSION_CAPS)[rng.integers(len(FUSION_CAPS), size=n)])
    _sample_consistency(space, batch, rows, rng)
    _sample_mesh(space, batch, rows, rng)
    respect_mesh(space, batch)
    return Proposals(batch, ["autosync_sample"] * n)


def _sample_mesh(space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator) -> None:
    """Half the samples on a random layout other than plain data parallelism (when there is one)."""
    if space.first_meshes == 1:
        return
    moved = rows[rng.random(len(rows)) < 0.5]
    set_mesh(space, batch, moved, rng.integers(1, space.first_meshes, size=len(moved)))


def _sample_compression(
    space: Space, rng: np.random.Generator, n: int, classes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    V = space.num_variables
    compressor = np.zeros((n, V), dtype=np.int8)
    param = np.zeros((n, V), dtype=np.float32)
    if len(space.compressions) > 1:
        pick = rng.integers(len(space.compressions), size=(n, 18))[:, classes]
        for index, choice in enumerate(space.compressions):
            hit = (pick == index) & space.compression_allowed[index][None, :]
            compressor = np.where(hit, int(choice.kind), compressor).astype(np.int8)
            param = np.where(hit, choice.param, param).astype(np.float32)
    return compressor, param


def _dealt(space: Space, shards: np.ndarray) -> np.ndarray:
    """Shards dealt before each variable, biggest traffic first: where its round-robin starts."""
    order = np.argsort(-space.context.var_ps_bytes, kind="stable")
    in_order = shards[:, order].T
    dealt = np.empty(shards.shape, dtype=np.int64)
    dealt[:, order] = (np.cumsum(in_order, axis=0) - in_order).T
    return dealt


def _sample_consistency(space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator) -> None:
    if len(space.consistencies) == 1:
        return
    pick = rng.integers(len(space.consistencies), size=len(rows))
    batch.consistency[rows] = [int(space.consistencies[i].kind) for i in pick]
    batch.staleness[rows] = [space.consistencies[i].staleness for i in pick]
