"""Write choices into `CandidateBatch` rows: the only place that knows how a choice maps to arrays.

Proposals and moves describe *what* to set (these variables to a parameter server, those fused into
groups of 25 MB); the functions here keep the encoding consistent while doing it (a PS variable's
unused shard slots are -1, an all-reduce variable has no servers, fusion labels stay in [0, V)).

Fusion labels: a group is labelled by the ready rank of its first member, so labels are unique
without bookkeeping, stay in [0, V), and groups made by different proposals never collide.
"""

from __future__ import annotations

import heapq
from typing import TypeVar

import numpy as np

from optimizer_service.search.space import Space
from simulator.encoding import Algorithm, CandidateBatch, CompressorKind, Precision, SyncKind

Rows = np.ndarray
_Scalar = TypeVar("_Scalar", bound=float)
"""Row indices into a batch (int array)."""


def set_allreduce(
    batch: CandidateBatch,
    rows: Rows,
    mask: np.ndarray,
    *,
    algorithm: np.ndarray | int = Algorithm.AUTO,
    compressor: np.ndarray | int = CompressorKind.NONE,
    param: np.ndarray | float = 0.0,
) -> None:
    """Variables where `mask` ([len(rows), V] or [V]) is set become unpartitioned all-reduce variables.

    Their fusion labels are left as they are; call `set_fusion` afterwards to group them.
    """
    rr, vv = _pairs(rows, mask)
    batch.kind[rr, vv] = SyncKind.ALLREDUCE
    batch.algorithm[rr, vv] = _pick(algorithm, rr, vv, rows)
    batch.compressor[rr, vv] = _pick(compressor, rr, vv, rows)
    batch.compressor_param[rr, vv] = _pick(param, rr, vv, rows)
    _clear_ps(batch, rr, vv)


def set_mesh(space: Space, batch: CandidateBatch, rows: Rows, meshes: np.ndarray | int) -> None:
    """Rows take mesh choices (indices into `space.meshes`): degrees, micro-batches, schedule, stages,
    recomputation, sequence parallelism, precision, compile and async tensor parallelism. The replicas
    stay every compute device, which every mesh covers; a hybrid shard group that no longer fits the data
    degree inside a node is dropped, and so are fp8 all-gathers at another precision."""
    choice = np.broadcast_to(np.asarray(meshes, dtype=np.intp), rows.shape)
    for index in np.unique(choice).tolist():
        mesh, r = space.meshes[index], rows[choice == index]
        batch.data[r], batch.tensor[r], batch.pipeline[r] = mesh.data, mesh.tensor, mesh.pipeline
        batch.context_parallel[r] = mesh.context
        batch.micro_batches[r], batch.schedule[r], batch.virtual_stages[r] = (
            mesh.micro_batches,
            int(mesh.schedule),
            mesh.virtual_stages,
        )
        batch.recompute[r], batch.selective[r], batch.selective_op[r] = (
            mesh.recompute,
            mesh.selective,
            mesh.selective_op,
        )
        batch.sequence_parallel[r], batch.micro_batch_size[r] = mesh.sequence_parallel, mesh.micro_batch_size
        batch.precision[r], batch.compile[r], batch.async_tp[r] = mesh.precision, mesh.compile, mesh.async_tp
        batch.fp8_gather[r] &= mesh.precision == Precision.FP8
        batch.layer_stage[r] = np.asarray(mesh.layer_stage, dtype=np.int8) if mesh.layer_stage else 0
        groups = space.rules.shard_groups(mesh.data, mesh.tensor, mesh.pipeline, mesh.context)
        batch.shard_group[r] = np.where(np.isin(batch.shard_group[r], groups), batch.shard_group[r], 0)


def set_zero(batch: CandidateBatch, rows: Rows, stage: int, shard_group: int = 0) -> None:
    """The sharded variables of `rows` at ZeRO `stage`, sharded over groups of `shard_group` data ranks (0: all)."""
    sharded = batch.kind[rows] == SyncKind.SHARDED
    batch.zero_stage[rows] = np.where(sharded, stage, batch.zero_stage[rows])
    batch.shard_group[rows] = shard_group


def respect_mesh(space: Space, batch: CandidateBatch) -> None:
    """Keep every row inside the space's rules. For an engine, the dense variables synchronize as a
    layout states (all all-reduced, or all sharded at one stage). Under a global batch, a row that states no micro-batch size
    takes the first layout (plain data parallelism where the batch allows). A precision the request does
    not allow (or fp8 with tensor splits where the runner refuses it) becomes the request's, and so does
    compile; async tensor parallelism stays only where the rules allow it (an engine, tensor > 1, sequence
    parallelism, compiled blocks), fp8 all-gathers only at fp8 with ZeRO-3 variables. Rows on a
    tensor, pipeline, context, micro-batched or recomputed layout synchronize their data-parallel groups
    with all-reduce or ZeRO only: dense parameter-server variables become all-reduce, hierarchical
    all-reduce and local replication are dropped (the runtime's data-parallel groups inside a mesh have no
    per-node servers or node sub-groups yet). Sparse tables stay on their servers."""
    rules = space.rules
    if rules.global_batch is not None:
        unstated = np.flatnonzero(batch.micro_batch_size == 0)
        if unstated.size:
            set_mesh(space, batch, unstated, 0)
    if rules.runner == "engine":
        _layout_synchronizers(space, batch)
    fp8_split = (batch.precision == Precision.FP8) & (batch.tensor > 1) & (not rules.fp8_tensor)
    refused = ~np.isin(batch.precision, rules.precisions) | fp8_split
    batch.precision[refused] = space.precision
    batch.compile[~np.isin(batch.compile, rules.compiles)] = space.compile
    _split_knobs(space, batch)
    meshed = np.flatnonzero(
        (batch.tensor > 1)
        | (batch.pipeline > 1)
        | (batch.context_parallel > 1)
        | (batch.micro_batches > 1)
        | batch.recompute
        | batch.selective
        | batch.selective_op
    )
    if meshed.size == 0:
        return
    dense_ps = (batch.kind[meshed] == SyncKind.PS) & ~space.context.var_sparse[None, :]
    if dense_ps.any():
        rr, vv = _pairs(meshed, dense_ps)
        set_allreduce(batch, meshed, dense_ps)
        batch.group[rr, vv] = space.ready_rank[vv]
    hierarchical = batch.algorithm[meshed] == Algorithm.HIERARCHICAL
    batch.algorithm[meshed] = np.where(hierarchical, Algorithm.AUTO, batch.algorithm[meshed])
    batch.local_replication[meshed] = False


def _split_knobs(space: Space, batch: CandidateBatch) -> None:
    """Async tensor parallelism where the rules allow it; fp8 all-gathers at fp8 with ZeRO-3 variables."""
    rules = space.rules
    batch.async_tp &= rules.async_tp & (batch.tensor > 1) & batch.sequence_parallel & batch.compile
    stage3 = ((batch.kind == SyncKind.SHARDED) & (batch.zero_stage == 3)).any(axis=1)
    batch.fp8_gather &= rules.fp8_gather & (batch.precision == Precision.FP8) & stage3


def _layout_synchronizers(space: Space, batch: CandidateBatch) -> None:
    """What an engine states: every dense variable all-reduced, or every one sharded at one ZeRO stage
    (the row's most common); a row with any sharded dense variable shards them all."""
    dense = ~space.context.var_sparse
    if not dense.any():
        return
    sharded = batch.kind[:, dense] == SyncKind.SHARDED
    mixed = np.flatnonzero(sharded.any(axis=1) & ~sharded.all(axis=1))
    if mixed.size:
        stages = np.where(sharded[mixed], batch.zero_stage[mixed][:, dense], 0)
        counts = np.stack([(stages == k).sum(axis=1) for k in (1, 2, 3)], axis=1)
        majority = 1 + np.argmax(counts, axis=1)
        set_sharded(batch, mixed, dense)
        batch.zero_stage[mixed] = majority[:, None]
    others = np.flatnonzero(~sharded.any(axis=1) & (batch.kind[:, dense] != SyncKind.ALLREDUCE).any(axis=1))
    if others.size:
        set_allreduce(batch, others, dense)
        rr, vv = _pairs(others, np.broadcast_to(dense, (len(others), len(dense))))
        batch.group[rr, vv] = space.ready_rank[vv]
    batch.local_replication[:] = False


def set_sharded(batch: CandidateBatch, rows: Rows, mask: np.ndarray) -> None:
    rr, vv = _pairs(rows, mask)
    batch.kind[rr, vv] = SyncKind.SHARDED
    batch.algorithm[rr, vv] = Algorithm.AUTO
    batch.compressor[rr, vv] = CompressorKind.NONE
    batch.compressor_param[rr, vv] = 0.0
    _clear_ps(batch, rr, vv)


def set_ps(
    batch: CandidateBatch,
    rows: Rows,
    mask: np.ndarray,
    servers: np.ndarray,
    *,
    local_replication: np.ndarray | bool = False,
) -> None:
    """Variables in `mask` go to parameter servers; `servers` is [len(rows), V, K'] device indices
    (or [V, K']) with -1 past each variable's last shard; the shard count is read from it."""
    rr, vv = _pairs(rows, mask)
    full = np.broadcast_to(servers, (len(rows), *servers.shape[-2:])) if servers.ndim == 2 else servers
    set_ps_pairs(
        batch, rr, vv, full[_positions(rows, rr), vv], local_replication=_pick(local_replication, rr, vv, rows)
    )


def set_ps_pairs(
    batch: CandidateBatch,
    rr: np.ndarray,
    vv: np.ndarray,
    servers: np.ndarray,
    *,
    local_replication: np.ndarray | bool = False,
) -> None:
    """(row, variable) pairs to parameter servers; `servers` is [len(rr), K'] with -1 past the last shard."""
    if servers.shape[1] > batch.max_shards:
        raise ValueError(f"{servers.shape[1]} shard slots given, the batch has room for {batch.max_shards}")
    batch.kind[rr, vv] = SyncKind.PS
    batch.algorithm[rr, vv] = Algorithm.AUTO
    batch.compressor[rr, vv] = CompressorKind.NONE
    batch.compressor_param[rr, vv] = 0.0
    batch.shards[rr, vv] = np.maximum((servers >= 0).sum(axis=1), 1)
    batch.partition_axis[rr, vv] = 0
    batch.server[rr, vv, :] = -1
    batch.server[rr, vv, : servers.shape[1]] = servers
    batch.local_replication[rr, vv] = local_replication


def set_fusion(
    space: Space,
    batch: CandidateBatch,
    rows: Rows,
    cap_bytes: np.ndarray | float,
    *,
    first_cap_bytes: float | None = None,
) -> None:
    """Re-group the all-reduce and sharded variables of `rows` into buckets in backward order.

    A bucket closes once it holds `cap_bytes` (per row), as DDP's do; `first_cap_bytes` makes the first
    bucket smaller so communication starts early. Each kind fills its own buckets.
    """
    # Scans run along the backward order; arrays are [V, n] so each step of a scan is one contiguous row.
    order = space.backward_order
    n = len(rows)
    nbytes = space.context.var_bytes[order][:, None]
    caps = np.maximum(np.broadcast_to(np.asarray(cap_bytes, dtype=np.float64), (n,)), 1.0)[None, :]
    first = caps if first_cap_bytes is None else np.minimum(caps, first_cap_bytes)
    whole = _whole(batch, rows)
    kinds = np.ascontiguousarray((batch.kind if whole else batch.kind[rows])[:, order].T)
    labels = np.ascontiguousarray((batch.group if whole else batch.group[rows])[:, order].T)
    position = np.arange(len(order), dtype=np.int32)[:, None]
    for kind in (SyncKind.ALLREDUCE, SyncKind.SHARDED):
        member = kinds == kind
        if not member.any():
            continue
        own = np.where(member, nbytes, 0.0)
        before = np.cumsum(own, axis=0) - own
        # bucket index: how many caps were passed before this variable joined (first cap counts once)
        bucket = np.where(before < first, 0.0, 1.0 + np.floor(np.maximum(before - first, 0.0) / caps))
        seen = np.maximum.accumulate(np.where(member, bucket, -1.0), axis=0)
        previous = np.concatenate([np.full((1, n), -1.0), seen[:-1]], axis=0)
        start = member & (bucket > previous)
        label = np.maximum.accumulate(np.where(start, position, -1), axis=0)
        labels = np.where(member, label, labels)
    if whole:
        batch.group[:, order] = labels.T
    else:
        batch.group[rows[:, None], order[None, :]] = labels.T


def write_whole(
    space: Space,
    batch: CandidateBatch,
    kind: np.ndarray,
    *,
    algorithm: np.ndarray,
    compressor: np.ndarray,
    param: np.ndarray,
    shards: np.ndarray,
    first_server: np.ndarray,
    replicate: np.ndarray,
) -> None:
    """Every per-variable array of a whole batch at once, for rows made from scratch ([n, V] inputs).

    PS shard k of a variable goes to server slot (first_server + k) mod S. Fusion labels are left
    for `set_fusion`.
    """
    ps, allreduce = kind == SyncKind.PS, kind == SyncKind.ALLREDUCE
    batch.kind[:] = kind
    batch.algorithm[:] = np.where(allreduce, algorithm, Algorithm.AUTO)
    batch.compressor[:] = np.where(allreduce, compressor, CompressorKind.NONE)
    batch.compressor_param[:] = np.where(allreduce, param, 0.0)
    batch.shards[:] = np.where(ps, np.minimum(shards, batch.max_shards), 1)
    batch.partition_axis[:] = 0
    batch.local_replication[:] = ps & replicate
    k = np.arange(batch.max_shards, dtype=np.int32)
    slot = (first_server.astype(np.int32)[:, :, None] + k) % np.int32(space.num_servers)
    live = ps[:, :, None] & (k < batch.shards[:, :, None])
    batch.server[:] = np.where(live, space.servers[slot], np.int16(-1))


def balanced_servers(space: Space, nbytes: np.ndarray, shards: np.ndarray, *, by_bandwidth: bool) -> np.ndarray:
    """Place each variable's shards on the servers with the least traffic (longest first): [V, K].

    `nbytes` is the traffic per variable (a step's pushes; 0 for variables not on servers). By bytes,
    every server gets about the same bytes; by bandwidth, the same *time* on its NIC.
    """
    key = (nbytes.tobytes(), shards.tobytes(), by_bandwidth)
    cached = space.placements.get(key)
    if cached is None:
        cached = space.placements[key] = _balanced(space, nbytes, shards, by_bandwidth)
    return cached.copy()


def _balanced(space: Space, nbytes: np.ndarray, shards: np.ndarray, by_bandwidth: bool) -> np.ndarray:
    speed = space.server_bandwidth if by_bandwidth else np.ones(space.num_servers)
    # heap of (seconds of traffic placed on the server so far, server slot); ties go to the lower slot
    heap = [(0.0, s) for s in range(space.num_servers)]
    heapq.heapify(heap)
    out = np.full((len(nbytes), int(max(shards.max(initial=1), 1))), -1, dtype=np.int16)
    for v in np.argsort(-nbytes, kind="stable").tolist():
        if nbytes[v] <= 0 and shards[v] <= 0:
            continue
        count = max(int(shards[v]), 1)
        share = float(nbytes[v]) / count
        for k in range(count):
            seconds, slot = heapq.heappop(heap)
            out[v, k] = space.servers[slot]
            heapq.heappush(heap, (seconds + share / float(speed[slot]), slot))
    return out


def round_robin_servers(space: Space, shards: np.ndarray, start: np.ndarray) -> np.ndarray:
    """[n, K] servers for n (variable, shard count) pairs: shard k on server (start + k) mod S."""
    k = np.arange(int(shards.max(initial=1)))[None, :]
    index = (start[:, None] + k) % space.num_servers
    return np.where(k < shards[:, None], space.servers[index], -1).astype(np.int16)


def server_traffic(space: Space, batch: CandidateBatch, rows: Rows) -> np.ndarray:
    """[len(rows), S] bytes each parameter server receives per step from one worker."""
    servers = batch.server[rows]
    share = (space.context.var_ps_bytes / np.maximum(batch.shards[rows], 1)) * (batch.kind[rows] == SyncKind.PS)
    slot = space.server_slot[servers]  # -1 (and non-server devices) map to slot S, dropped below
    flat = (np.arange(len(rows), dtype=np.int64)[:, None, None] * (space.num_servers + 1) + slot).ravel()
    weights = np.broadcast_to(share[:, :, None], servers.shape).ravel()
    traffic = np.bincount(flat, weights=weights, minlength=len(rows) * (space.num_servers + 1))
    return traffic.reshape(len(rows), space.num_servers + 1)[:, :-1]


def _clear_ps(batch: CandidateBatch, rr: np.ndarray, vv: np.ndarray) -> None:
    batch.shards[rr, vv] = 1
    batch.partition_axis[rr, vv] = 0
    batch.local_replication[rr, vv] = False
    batch.server[rr, vv, :] = -1


def _pairs(rows: Rows, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, variable) index pairs where `mask` holds; `mask` is per row or shared by all rows."""
    full = np.broadcast_to(mask, (len(rows), mask.shape[-1]))
    r, v = np.nonzero(full)
    return rows[r], v


def _pick(value: np.ndarray | _Scalar, rr: np.ndarray, vv: np.ndarray, rows: Rows) -> np.ndarray | _Scalar:
    """A scalar as is; a per-variable [V] array at vv; a per-row [len(rows), V] array at (row, v)."""
    if np.isscalar(value) or np.ndim(value) == 0:
        return value
    array = np.asarray(value)
    if array.ndim == 1:
        return array[vv]
    return array[_positions(rows, rr), vv]


def _whole(batch: CandidateBatch, rows: Rows) -> bool:
    """rows is 0..n-1 in order (they are distinct and sorted wherever this module is called)."""
    return len(rows) == len(batch) and (len(rows) == 0 or (rows[0] == 0 and rows[-1] == len(batch) - 1))


def _positions(rows: Rows, rr: np.ndarray) -> np.ndarray:
    """Where each of rr sits in rows (rows are distinct)."""
    order = np.argsort(rows, kind="stable")
    return order[np.searchsorted(rows[order], rr)]
