"""The collective channel: all-reduce and sharded (ZeRO) groups of every candidate, as one FIFO queue.

A fusion group (same `group`, same kind) launches when its last member's gradient is ready, moves the
sum of its members' wire bytes in one collective (one latency), and runs on the candidate's
collective stream after the groups launched before it (one stream per pipeline stage). `auto` takes
the cheapest of ring, tree and hierarchical for the group's bytes (a top-k group all-gathers instead,
see `_group_seconds`). Sharded groups at ZeRO stage 1 all-reduce their whole gradients, at stage 2
reduce-scatter them over the shard group (and, under hybrid sharding, all-reduce each shard across the
groups); the all-gather of updated parameters (in the precision's compute dtype) comes after the
optimizer step, exposed. Stage 3 gathers and reduce-scatters unit by unit in the compute phase
(`simulator.fsdp`) and is left out here. Gradients travel at the precision's gradient bytes (fp32
under amp, bf16 under `bf16` and `fp8`, where they also move at the device's half-precision rate).
Compression work is added to its group's time.

Sparse variables (embeddings with sparse gradients) are not reduced in a fusion group: at the
optimizer step every rank all-gathers the rows it touched (one all-gather of every table's row count,
then indices and values: two per variable), so they join the stream after backward with (p - 1) peers'
rows to receive.

Groups are found with one pass over [N, V]: a group table of 2G + 1 slots per candidate (G = the
largest group id in the chunk + 1; all-reduce groups, sharded groups, and one slot where PS variables
are dropped) collects each group's bytes
(bincount) and its last ready position (maximum.at); everything after that runs on the list of
non-empty groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator import collectives, compression, fsdp
from simulator.context import SimContext
from simulator.encoding import Algorithm, CandidateBatch, CompressorKind, Precision, SyncKind
from simulator.pipeline import ComputePhase
from simulator.precision import HALF_GRADIENTS
from simulator.timeline import fifo_dense
from simulator.topology import Topology
from stratagem.topk_selection import full_selection

HALF_GRADIENT_CODES = np.array(sorted(int(p) for p in HALF_GRADIENTS))
"""Precisions whose gradients travel in 16 bits (`simulator.precision.HALF_GRADIENTS`)."""
SPARSE_ALLREDUCE_COLLECTIVES = 2
"""All-gathers per sparse variable: indices and values (their sizes vary per step), after one
all-gather of every sparse variable's row count."""
TOPK_COLLECTIVES = 1
"""All-gathers per top-k group: values and indices travel as the bytes of one tensor, as the runtime
packs them."""
POWERSGD_COLLECTIVES = 2
"""All-reduces per PowerSGD group holding a matrix: P, then Q, which needs P's sum (and its QR) first,
so a second round is on the stream (the group's vectors ride in P's all-reduce). The two rounds cost
the device's calibrated `lowrank_round_s` where it has one (never less than two link latencies),
else two link latencies."""


@dataclass
class CollectivePhase:
    finish: np.ndarray
    """[N] when the collective stream has drained (at least the last launch's ready time)."""
    allreduce_busy: np.ndarray
    sharded_busy: np.ndarray
    all_gather: np.ndarray
    """[N] seconds of the sharded groups' parameter all-gather after the update."""
    allreduce_bytes: np.ndarray
    """[N] wire bytes all-reduced per step (after compression)."""
    latency_busy: np.ndarray
    """[N] the part of the channel's busy time (both kinds) that is collectives' latency, not bytes."""
    device_share: np.ndarray
    """[N] the share of the busy time that runs on one device's stream: 1 without a pipeline, the
    busiest stage's share with one (each stage reduces only its own gradients, on its own devices)."""


def collective_phase(
    context: SimContext, batch: CandidateBatch, topo: Topology, compute: ComputePhase
) -> CollectivePhase:
    n, V = len(batch), context.num_variables
    G = int(batch.group.max()) + 1 if batch.group.size else 1
    slots = 2 * G + 1
    kind = batch.kind
    sparse = _sparse_allreduce(context, batch)
    dropped = kind == SyncKind.PS if sparse is None else (kind == SyncKind.PS) | sparse
    is_sharded = kind == SyncKind.SHARDED
    full_shard = _full_shard(batch, is_sharded)
    if full_shard is not None:
        dropped = dropped | full_shard
    key = np.where(dropped, 2 * G, batch.group + np.where(is_sharded, G, 0))
    key += (np.arange(n, dtype=key.dtype) * slots)[:, None]
    key = key.ravel()
    wire = context.var_bytes_tile(n).copy()
    _split_bytes(context, batch, wire)
    gathered = _precision_bytes(context, batch, wire)
    compressed = np.flatnonzero((batch.compressor != CompressorKind.NONE) & (kind == SyncKind.ALLREDUCE) & ~dropped)
    squeeze = _compress(context, batch, topo, compressed, wire, key, n * slots)
    group_bytes = np.bincount(key, weights=wire, minlength=n * slots)
    last = np.full(n * slots, -1, dtype=np.int32)
    np.maximum.at(last, key, context.ready_position_tile(n))

    groups = np.flatnonzero(last >= 0)
    row, local = np.divmod(groups, slots)
    collective = np.flatnonzero(local < 2 * G)
    groups, row, local = groups.take(collective), row.take(collective), local.take(collective)
    sharded = local >= G
    position = last.take(groups)
    nbytes = group_bytes.take(groups)
    last_member = row * V + context.order.take(position)
    algorithm = batch.algorithm.ravel().take(last_member)
    compressor = batch.compressor.ravel().take(last_member)
    ar_time, ar_latency = _group_seconds(topo, batch, row, algorithm, compressor, nbytes)
    lowrank = (
        np.flatnonzero(_lowrank_groups(context, batch, compressed, key, n * slots).take(groups))
        if compressed.size
        else compressed
    )
    if lowrank.size:
        second = _second_round(context, topo, row.take(lowrank), algorithm.take(lowrank))
        ar_time[lowrank] += second
        ar_latency[lowrank] += second
    reduce_scatter = np.flatnonzero(sharded)
    reduce_scatter = reduce_scatter[batch.zero_stage.ravel().take(last_member.take(reduce_scatter)) != 1]
    latency, duration = ar_latency, ar_time
    if reduce_scatter.size:
        rs_time, rs_latency = _sharded_seconds(topo, row.take(reduce_scatter), nbytes.take(reduce_scatter))
        duration, latency = duration.copy(), latency.copy()
        duration[reduce_scatter], latency[reduce_scatter] = rs_time, rs_latency
    if squeeze is not None:
        duration += squeeze.take(groups)
    service = np.zeros((n, V))
    service.ravel()[row * V + position] = duration
    gather_bytes = nbytes if gathered is None else np.bincount(key, weights=gathered, minlength=n * slots).take(groups)
    all_gather = (topo.shard_all_gather[0].take(row), topo.shard_all_gather[1].take(row))
    ag_time = collectives.cost(all_gather, gather_bytes) * sharded
    busy, wire_total = _per_row(row, duration * ~sharded, n), _per_row(row, nbytes * ~sharded, n)
    latency_busy = _per_row(row, latency, n)
    if sparse is not None:
        rows_seconds, rows_bytes, rows_latency = _sparse_rows(context, batch, topo, sparse)
        service[:, V - 1] += rows_seconds
        busy, wire_total, latency_busy = busy + rows_seconds, wire_total + rows_bytes, latency_busy + rows_latency
    finish, share = _stream_finish(context, batch, compute, service)
    return CollectivePhase(
        finish=finish,
        device_share=share,
        allreduce_busy=busy,
        sharded_busy=_per_row(row, duration * sharded, n),
        all_gather=_gather_seconds(context, batch, compute, row, row * V + position, ag_time),
        allreduce_bytes=wire_total,
        latency_busy=latency_busy,
    )


def _full_shard(batch: CandidateBatch, is_sharded: np.ndarray) -> np.ndarray | None:
    """[N, V] ZeRO-3 variables of candidates without a pipeline (None when there are none): their
    gathers and reduce-scatters run unit by unit in the compute phase (`simulator.fsdp`). Under a
    pipeline stage 3 runs as stage 2 (see there)."""
    if batch.zero_stage.size == 0 or batch.zero_stage.max() < 3:
        return None
    sharded = np.flatnonzero(is_sharded)
    stage3 = sharded[batch.zero_stage.ravel().take(sharded) == 3]
    stage3 = stage3[batch.pipeline.take(stage3 // batch.kind.shape[1]) <= 1]
    if not stage3.size:
        return None
    out = np.zeros(batch.kind.shape, dtype=bool)
    out.ravel()[stage3] = True
    return out


def _precision_bytes(context: SimContext, batch: CandidateBatch, wire: np.ndarray) -> np.ndarray | None:
    """Rescale `wire` (flat [N·V] captured bytes per tensor rank) in place to each candidate's gradient
    bytes; return the bytes its parameters are all-gathered in (None when every candidate runs as
    captured, where both are the captured bytes)."""
    scaled = np.flatnonzero(batch.precision > Precision.TF32)
    if not scaled.size:
        return None
    rows = wire.reshape(len(batch), -1)
    captured = rows[scaled]
    precision = batch.precision[scaled].astype(np.intp)
    rows[scaled] = captured * context.var_precision.gradient[precision]
    gathered = wire.copy()
    gathered.reshape(len(batch), -1)[scaled] = (
        captured * context.var_precision.gathered[precision] * fsdp.fp8_gather_scale(context, batch.fp8_gather[scaled])
    )
    return gathered


def _sharded_seconds(topo: Topology, row: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ZeRO-2's gradient reduction: a reduce-scatter over the shard group, then (hybrid sharding) the
    all-reduce of each 1/S shard across the groups; seconds and latency."""
    rs = (topo.shard_reduce_scatter[0].take(row), topo.shard_reduce_scatter[1].take(row))
    across = (topo.replicate[0].take(row), topo.replicate[1].take(row))
    seconds = collectives.cost(rs, nbytes) + collectives.cost(across, nbytes / topo.shard_degree.take(row))
    return np.asarray(seconds), rs[0] + across[0]


def _sparse_allreduce(context: SimContext, batch: CandidateBatch) -> np.ndarray | None:
    """[N, V] all-reduce entries of sparse variables (None when the graph has none): they are not reduced
    in a fusion group but exchanged as rows on their own, see `_sparse_rows`."""
    if not context.var_sparse.any():
        return None
    return (batch.kind == SyncKind.ALLREDUCE) & context.var_sparse[None, :]


def _sparse_rows(
    context: SimContext, batch: CandidateBatch, topo: Topology, sparse: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[N] seconds, wire bytes and latency seconds of the sparse variables' row exchanges. As the runtime runs them, at
    the optimizer step each rank coalesces its gradients, all-gathers every table's row count in one
    collective, then each table's int64 indices and values, so every rank receives its p - 1 peers'
    rows, and coalesces the p row sets into one sum."""
    per_row = np.where(sparse, context.var_coalesce_bytes, 0.0).sum(axis=1)
    work = np.where(sparse, context.var_coalesce_work, 0.0).sum(axis=1)
    gathered = per_row * topo.dp_degree
    latency, per_byte = topo.row_gather
    count = sparse.sum(axis=1)
    kinds = context.kinds
    coalesce_rate = kinds.memory_bandwidth[topo.kind] * kinds.coalesce_efficiency[topo.kind]
    coalesced = work * (1.0 + topo.dp_degree)
    calls = 1 + SPARSE_ALLREDUCE_COLLECTIVES * count
    latencies = np.where(count > 0, calls * latency, 0.0)
    seconds = np.where(count > 0, latencies + gathered * per_byte + coalesced / coalesce_rate, 0.0)
    return seconds, per_row * np.maximum(topo.dp_degree - 1, 0), latencies


def _stream_finish(
    context: SimContext, batch: CandidateBatch, compute: ComputePhase, service: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """[N] when the collective stream drains, and the share of its busy time on the busiest device.
    Pipeline stages live on different devices, each data-parallel group reducing only its stage's
    gradients, so a pipelined candidate has one stream per stage (a group belongs to the stage of its
    last member) and drains when the slowest stage's does."""
    finish = fifo_dense(compute.ready_dense(), service)
    share = np.ones(len(batch))
    rows = compute.piped
    if rows.size == 0:
        return finish, share
    stage = compute.piped_var_stage[:, context.order]
    piped_service = service[rows]
    stages, busiest = np.zeros(rows.size), np.zeros(rows.size)
    for s in range(int(batch.pipeline[rows].max())):
        on_stage = np.where(stage == s, piped_service, 0.0)
        stages = np.maximum(stages, fifo_dense(compute.piped_ready, on_stage))
        busiest = np.maximum(busiest, on_stage.sum(axis=1))
    finish[rows] = stages
    total = piped_service.sum(axis=1)
    share[rows] = np.divide(busiest, total, out=np.ones(rows.size), where=total > 0)
    return finish, share


def _gather_seconds(
    context: SimContext,
    batch: CandidateBatch,
    compute: ComputePhase,
    row: np.ndarray,
    slot: np.ndarray,
    seconds: np.ndarray,
) -> np.ndarray:
    """[N] seconds of the parameter all-gathers after the update. Each pipeline stage gathers its own
    parameters on its own devices at the same time, so a pipelined candidate waits for the slowest stage."""
    n, V = len(batch), context.num_variables
    total = _per_row(row, seconds, n)
    rows = compute.piped
    if rows.size == 0 or not seconds.any():
        return total
    dense = np.zeros((n, V))
    dense.ravel()[slot] = seconds
    stage = compute.piped_var_stage[:, context.order]
    piped = dense[rows]
    slowest = np.zeros(rows.size)
    for s in range(int(batch.pipeline[rows].max())):
        slowest = np.maximum(slowest, np.where(stage == s, piped, 0.0).sum(axis=1))
    total[rows] = slowest
    return total


def _per_row(row: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(row, weights=values, minlength=n).astype(np.float64, copy=False)


def _split_bytes(context: SimContext, batch: CandidateBatch, wire: np.ndarray) -> None:
    """Tensor parallelism: a split variable's gradient is reduced per slice, 1/T of it."""
    split = np.flatnonzero(batch.tensor > 1)
    if split.size:
        rows = wire.reshape(len(batch), -1)
        rows[split] = np.where(
            context.var_tensor_split, context.var_bytes / batch.tensor[split, None], context.var_bytes
        )


def _compress(
    context: SimContext,
    batch: CandidateBatch,
    topo: Topology,
    entries: np.ndarray,
    wire: np.ndarray,
    key: np.ndarray,
    slots: int,
) -> np.ndarray | None:
    """Shrink the compressed entries of `wire` in place; return each group slot's compression seconds."""
    if not entries.size:
        return None
    row, var = np.divmod(entries, context.num_variables)
    div = np.where(context.var_tensor_split.take(var), batch.tensor.take(row), 1).astype(float)
    compressor, param = batch.compressor.ravel().take(entries), batch.compressor_param.ravel().take(entries)
    wire[entries] = np.minimum(compression.wire_bytes(context.compression, compressor, param, var, div), wire[entries])
    kinds, kind = context.kinds, topo.kind.take(row)
    bandwidth = kinds.memory_bandwidth[kind]
    rates = compression.Rates(
        byte=bandwidth * kinds.stream_efficiency[kind],
        cast=bandwidth * kinds.cast_efficiency[kind],
        select=bandwidth * kinds.select_efficiency[kind],
        lowrank=bandwidth * kinds.lowrank_efficiency[kind],
        flop=kinds.peak_flops[kind] * kinds.matmul_efficiency[kind],
    )
    seconds = compression.compute_seconds(context.compression, compressor, param, var, div, rates)
    slot = key.take(entries)
    topk = compressor == CompressorKind.TOPK
    if topk.any():
        full_rate = bandwidth * kinds.full_select_efficiency[kind]
        seconds = seconds + _full_selection_seconds(
            context, var, div, param, slot, topk, slots, 1.0 / full_rate - 1.0 / rates.select
        )
    return np.bincount(slot, weights=seconds, minlength=slots)


def _full_selection_seconds(
    context: SimContext,
    var: np.ndarray,
    div: np.ndarray,
    ratio: np.ndarray,
    slot: np.ndarray,
    topk: np.ndarray,
    slots: int,
    extra_per_byte: np.ndarray,
) -> np.ndarray:
    """What each top-k entry's selection costs beyond the sampled rate where its bucket is selected in one
    full `topk` (a bucket of few entries, or few kept: `stratagem.topk_selection.full_selection`). The
    runtime selects over a bucket, so the path is the bucket's, from its entries and its ratio."""
    numel = np.where(topk, context.var_numel.take(var) / div, 0.0)
    bucket = np.bincount(slot, weights=numel, minlength=slots)
    entries = bucket.take(slot)
    full = topk & full_selection(np.round(entries).astype(np.int64), np.ceil(ratio * entries).astype(np.int64))
    return np.where(full, numel * context.var_itemsize.take(var) * extra_per_byte, 0.0)


def _lowrank_groups(
    context: SimContext, batch: CandidateBatch, entries: np.ndarray, key: np.ndarray, slots: int
) -> np.ndarray:
    """[slots] whether a group slot holds a matrix under PowerSGD (and so runs a second all-reduce)."""
    var = entries % context.num_variables
    matrix = (batch.compressor.ravel().take(entries) == CompressorKind.POWERSGD) & (
        context.compression.lowrank_bytes[CompressorKind.POWERSGD].take(var) > 0
    )
    return np.bincount(key.take(entries[matrix]), minlength=slots) > 0


def _second_round(context: SimContext, topo: Topology, row: np.ndarray, algorithm: np.ndarray) -> np.ndarray:
    """Seconds a PowerSGD group's rounds add to its one-collective time (which holds one latency): the
    calibrated `lowrank_round_s` of both rounds less that latency, at least one more latency."""
    latency = _allreduce_cost(topo, row, algorithm, np.zeros(row.size))[0]
    rounds = context.kinds.lowrank_round_s[topo.kind.take(row)]
    return np.maximum(rounds - latency, (POWERSGD_COLLECTIVES - 1) * latency)


def _group_seconds(
    topo: Topology,
    batch: CandidateBatch,
    row: np.ndarray,
    algorithm: np.ndarray,
    compressor: np.ndarray,
    nbytes: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of each all-reduce group's collectives, and the latency part of them. A half-precision
    payload moves at the device's `half_reduce_efficiency`; top-k's values and indices are not summed on
    the wire but all-gathered (`TOPK_COLLECTIVES`), every rank receiving its p - 1 peers' entries."""
    half = (compressor == CompressorKind.FP16) | (compressor == CompressorKind.BF16)
    precision = batch.precision.take(row)
    half |= (compressor == CompressorKind.NONE) & np.isin(precision, HALF_GRADIENT_CODES)
    seconds, latency = _allreduce_cost(
        topo, row, algorithm, np.where(half, nbytes / topo.half_reduce.take(row), nbytes)
    )
    topk = compressor == CompressorKind.TOPK
    if topk.any():
        gather_latency = TOPK_COLLECTIVES * topo.row_gather[0].take(row)
        gathered = gather_latency + nbytes * topo.dp_degree.take(row) * topo.row_gather[1].take(row)
        seconds, latency = np.where(topk, gathered, seconds), np.where(topk, gather_latency, latency)
    return seconds, latency


RING_CHOICES = (0, 3, 4)
TREE_CHOICES = (1, 5, 6)
"""Rows of `_allreduce_cost`'s table holding a ring (Simple, LL, LL128) and a tree (Simple, LL, LL128)."""


def _allreduce_cost(
    topo: Topology, row: np.ndarray, algorithm: np.ndarray, nbytes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of one all-reduce of `nbytes` per group under its algorithm, and the latency of the choice.

    `auto` takes whichever of ring, tree and hierarchical is cheapest for those bytes; under NCCL (GPU
    candidates) it is NCCL's own choice among its ring and tree in each protocol and NVLink SHARP, and a
    named ring or tree still runs the cheapest protocol of that algorithm, as NCCL's tuner picks it
    (`topology.Topology.protocols`: ring LL, ring LL128, tree LL, tree LL128, NVLS)."""
    coefficients = [(t[0].take(row), t[1].take(row)) for t in (topo.ring, topo.tree, topo.hierarchical)]
    coefficients += [(t[0].take(row), t[1].take(row)) for t in topo.protocols]
    seconds = np.stack([collectives.cost(c, nbytes) for c in coefficients])
    latencies = np.stack([c[0] for c in coefficients])
    columns = np.arange(nbytes.size)
    if topo.protocols:
        nccl = topo.nccl.take(row)
        ring = np.array(RING_CHOICES).take(seconds[list(RING_CHOICES)].argmin(axis=0))
        tree = np.array(TREE_CHOICES).take(seconds[list(TREE_CHOICES)].argmin(axis=0))
        gloo_only = (np.arange(len(coefficients)) == 2)[:, None] & nccl[None, :]
        best = np.where(gloo_only, np.inf, seconds).argmin(axis=0)
        ring, tree = np.where(nccl, ring, 0), np.where(nccl, tree, 1)
    else:
        best, ring, tree = seconds.argmin(axis=0), np.zeros(row.size, dtype=np.intp), np.ones(row.size, dtype=np.intp)
    chosen = np.select(
        [algorithm == Algorithm.RING, algorithm == Algorithm.TREE, algorithm == Algorithm.HIERARCHICAL],
        [ring, tree, np.full(row.size, 2)],
        default=best,
    )
    return seconds[chosen, columns], latencies[chosen, columns]
