"""Parameter servers: every node's NIC carries the pushes and pulls of the shards it serves and of the
workers it hosts, so load imbalance and incast show up as one busy NIC.

Per PS variable v (f_v bytes per push: the whole variable, or for a sparse one the rows looked up,
capped by the table) and node j with c_j data-parallel copies of the model:

- node j's workers push c_j·f_v and pull as much back (with local replication: one aggregated push per
  node, min(c_j, 1)·f'_v with f'_v = min(c_max·f_v, table) so a sparse table's rows are counted once);
- the server of shard k (on node s) receives the pushes of every *other* node and sends as many
  pulls: (Total_v - push_s,v)/K over its NIC; its own node's workers cross the intra-node link, except
  the worker on the server device itself (a PS on a replica's own CPU, as on a CPU-only host), whose
  push and pull never leave it;
- the runtime fuses a server's dense shards into one bucket (one push and one pull per server and
  setting), so a bucket pays one round trip of 2α, though the server steps each shard as a tensor of
  its own (at the kind's `optimizer_tensor_s` each); every sparse shard is an exchange of its own,
  whose push and pull each send a row count, then indices, then values: three round trips
  (`collectives.SPARSE_PS_ROUND_TRIPS`); a sparse shard's rows are coalesced where they are pushed and
  the pushes summed (coalesced) at the server, at the device's coalesce rate; the server applies the
  update (streaming param, grad and state through its memory) before anyone can pull.

A server's side of a push (receiving and summing) and of a pull (sending) runs at its kind's
`reduce_efficiency` and `broadcast_efficiency` of the link bandwidth all-reduce buckets reach (gloo on
CPU pulls about twice as fast as it pushes): the node's, for the whole push and pull through its NIC.

Push and pull volumes are equal, so one direction (the slower) of a full-duplex NIC decides: a node's
PS time per step is (its workers' pushes + its shards' remote traffic) / NIC bandwidth + intra-node
traffic + updates (`node_load`). That total per node is the PS *throughput* bound. For synchronous
training the busiest node's NIC is also run as a FIFO timeline (`busiest_queue`); other nodes carry
less by construction and are not timed one by one. A dense bucket is queued (its push, then its
update) when its last member's gradient is ready, since the runtime launches it from that gradient's
hook: one server's bucket of every variable leaves after backward and overlaps none of it. A sparse
shard, exchanged at the optimizer step, is queued with the last PS gradient to be ready. A pull can
only leave once its bucket's update is done, so the pulls of dense buckets overlap later buckets'
pushes (launched in backward) except the last one's, which is exposed after the queue drains: with X
dense buckets on the busiest node, their pull is priced as 1/X of their transfer time (one bucket: the
whole pull waits for the whole push, as the runtime's fused bucket does). Sparse shards exchange at
the optimizer step, one after another (push, update, pull), so every sparse pull is exposed.

Work is done on the flat list of PS (candidate, variable) entries only (`ps_entries`).
`simulator.ps_reference` prices one candidate at a time with plain loops; a property test holds this
module to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator import collectives
from simulator.context import SimContext
from simulator.encoding import CandidateBatch, SyncKind
from simulator.pipeline import ComputePhase
from simulator.timeline import fifo_segments
from simulator.topology import Topology


@dataclass
class PSPhase:
    finish: np.ndarray
    """[N] when the last pull lands on the busiest PS node (synchronous training; 0 without PS)."""
    last_pull: np.ndarray
    """[N] the exposed pulls: the last dense bucket's, which waits for its update after the pushes drain,
    and every sparse shard's (each server's bytes at its pull speed)."""
    throughput: np.ndarray
    """[N] seconds of PS work on the busiest node per step (what asynchronous training cannot hide)."""
    node_seconds: np.ndarray
    """[N, M] seconds of PS work on each node's NIC (and memory) per step."""
    node_bytes: np.ndarray
    """[N, M] bytes each node's NIC receives (= sends) per step for PS traffic."""
    held: np.ndarray
    """[N, D] bytes of PS variables (parameters and optimizer state) each device holds as a server."""
    rows: np.ndarray
    """Flat PS entries, sorted by (candidate, ready position): candidate index..."""
    variables: np.ndarray
    """...and variable index."""


def ps_phase(context: SimContext, batch: CandidateBatch, topo: Topology, compute: ComputePhase) -> PSPhase:
    """The PS entries, each node's load per step, then the busiest node's NIC as a queue."""
    n, M, D = len(batch), context.num_nodes, context.num_devices
    entries = ps_entries(context, batch, topo)
    if entries is None:
        zeros, none = np.zeros(n), np.zeros(0, dtype=np.intp)
        return PSPhase(
            zeros, zeros.copy(), zeros.copy(), np.zeros((n, M)), np.zeros((n, M)), np.zeros((n, D)), none, none
        )
    load = node_load(context, batch, entries)
    queue = busiest_queue(context, entries, load)
    return PSPhase(
        finish=fifo_segments(entries.row, compute.ready_at(entries.row, entries.position), queue.service, n)
        + queue.last_pull,
        last_pull=queue.last_pull,
        throughput=load.node_seconds.max(axis=1),
        node_seconds=load.node_seconds,
        node_bytes=load.node_bytes,
        held=load.by_device["keep"],
        rows=entries.row,
        variables=entries.var,
    )


@dataclass
class PSEntries:
    """The PS (candidate, variable) entries of a batch, flat and sorted by (candidate, ready position),
    and their shards as (entry, server) pairs: shard 0 of every entry, then the further shards."""

    n: int
    row: np.ndarray
    """[E] candidate of each entry..."""
    position: np.ndarray
    """...its variable's ready position..."""
    var: np.ndarray
    """...and its variable."""
    lr: np.ndarray
    """[E] local replication."""
    weights: np.ndarray
    """[n, 2, M] pushing weight per node: data-parallel copies, or at most 1 with local replication."""
    totals: np.ndarray
    """[n·2] `weights` summed over nodes (every pusher of a variable)."""
    weight_row: np.ndarray
    """[E] row of `weights` each entry pushes with: candidate · 2 + local replication."""
    push: np.ndarray
    """[E] bytes one pusher sends for the whole variable."""
    count: np.ndarray
    """[E] shards."""
    update: np.ndarray
    """[E] update bytes per shard."""
    push_share: np.ndarray
    """[E] push bytes per shard."""
    keep: np.ndarray
    """[E] bytes a server holds per shard."""
    entry: np.ndarray
    """[P] the entry of each (entry, shard) pair..."""
    server: np.ndarray
    """...and the device serving that shard."""
    head: np.ndarray
    tail: np.ndarray
    tail_server: np.ndarray
    tail_shard: np.ndarray
    sparse: np.ndarray | None
    """[P] pairs of sparse variables (None when the graph has none)."""
    buckets: DenseBuckets
    exchanges: np.ndarray
    """[P] round trips of each pair's own exchange (sparse shards only; 0 with no sparse variables)."""
    coalesced: np.ndarray
    """[P] bytes each sparse pair's exchange coalesces (`_coalesced_bytes`)."""


def ps_entries(context: SimContext, batch: CandidateBatch, topo: Topology) -> PSEntries | None:
    """None when no candidate has a PS variable."""
    n, D, V = len(batch), context.num_devices, context.num_variables
    flat = np.flatnonzero(np.take(batch.kind, context.order, axis=1).ravel() == SyncKind.PS)
    if not flat.size:
        return None
    row, position = np.divmod(flat, V)
    var = context.order.take(position)
    cell = row * V + var
    lr = batch.local_replication.ravel().take(cell)
    weights = np.stack([topo.copies, np.minimum(topo.copies, 1.0)], axis=1)
    totals = weights.sum(axis=2).reshape(-1)
    ps_bytes = context.var_ps_bytes.take(var)
    push = np.where(lr, np.minimum(topo.copies.max(axis=1).take(row) * ps_bytes, context.var_bytes.take(var)), ps_bytes)
    shards = batch.shards.ravel().take(cell)
    count = shards.astype(np.float64)
    head, tail, tail_server, tail_shard = _shard_slots(batch, cell, shards)
    entry = np.concatenate([np.arange(flat.size), tail])
    sparse = context.var_sparse.take(var.take(entry)) if context.var_sparse.any() else None
    push_share = push / count
    exchanges = np.zeros(entry.size)
    coalesced = np.zeros(entry.size)
    if sparse is not None:
        exchanges = sparse * collectives.SPARSE_PS_ROUND_TRIPS
        coalesced = _coalesced_bytes(
            context, var.take(entry), sparse, push_share.take(entry), totals.take((row * 2 + lr).take(entry))
        )
    return PSEntries(
        n=n,
        row=row,
        position=position,
        var=var,
        lr=lr,
        weights=weights,
        totals=totals,
        weight_row=row * 2 + lr,
        push=push,
        count=count,
        update=context.var_update_bytes.take(var) / count,
        push_share=push_share,
        keep=context.ps_held_bytes.take(var) / count,
        entry=entry,
        server=np.concatenate([head, tail_server]),
        head=head,
        tail=tail,
        tail_server=tail_server,
        tail_shard=tail_shard,
        sparse=sparse,
        buckets=_dense_buckets(
            context, batch.max_shards, row, var, lr, head, tail, tail_server, tail_shard, sparse, n, D
        ),
        exchanges=exchanges,
        coalesced=coalesced,
    )


@dataclass
class NodeLoad:
    """What each server device and node carries per step."""

    by_device: dict[str, np.ndarray]
    """Per (candidate, server device): `push` [n, 2, D] by local replication, `update`, `keep` and
    `tensors` [n, D] (`_device_sums`)."""
    resident: np.ndarray
    """[n, 2, D] pushing weight of the worker on each server device itself (`_resident_weights`)."""
    node_seconds: np.ndarray
    node_bytes: np.ndarray


def node_load(context: SimContext, batch: CandidateBatch, e: PSEntries) -> NodeLoad:
    """Each node's PS seconds per step: its workers' pushes and its servers' remote traffic through its NIC
    (the slower of push and pull), its own workers' pushes over the intra-node link, and its servers'
    updates, round trips and coalesces."""
    n, D = e.n, context.num_devices
    by_device = _device_sums(e.row, e.head, e.tail, e.tail_server, n, D, e.lr, e.push_share, e.update, e.keep)
    device_trips = e.buckets.per_device
    if e.sparse is not None:
        device_trips = device_trips + np.bincount(
            e.row.take(e.entry) * D + e.server, weights=e.exchanges, minlength=n * D
        ).reshape(n, D)
    device_weights = e.weights[:, :, context.device_node]
    own = (by_device["push"] * device_weights).sum(axis=1)
    resident = _resident_weights(batch, device_weights)
    crossing = ((device_weights - resident) * by_device["push"]).sum(axis=1)
    remote = (by_device["push"] * e.weights.sum(axis=2)[:, :, None]).sum(axis=1) - 2 * own
    price = context.server_price
    device_coalesced = np.bincount(e.row.take(e.entry) * D + e.server, weights=e.coalesced, minlength=n * D).reshape(
        n, D
    )
    device_transfer = remote * price.inv_nic + crossing * price.inv_intra
    device_work = (
        by_device["update"] * price.inv_rate
        + by_device["tensors"] * price.tensor_s
        + device_trips * price.latency
        + device_coalesced * price.inv_coalesce
    )
    worker_bytes = (by_device["push"].sum(axis=2)[:, :, None] * e.weights).sum(axis=1)
    transfer_seconds = worker_bytes / context.nic_bandwidth + context.per_node(device_transfer)
    node_seconds = transfer_seconds * np.maximum(price.push_scale, price.pull_scale) + context.per_node(device_work)
    return NodeLoad(by_device, resident, node_seconds, worker_bytes + context.per_node(remote))


@dataclass
class BusiestQueue:
    service: np.ndarray
    """[E] seconds each entry launches on the busiest node's queue (0 where it launches nothing)."""
    last_pull: np.ndarray
    """[n] the exposed pulls after the queue drains."""


def busiest_queue(context: SimContext, e: PSEntries, load: NodeLoad) -> BusiestQueue:
    """The busiest node's NIC as a FIFO: each dense bucket (its pushes through the NIC, the shards' updates
    and one round trip) is served when its last member's gradient is ready, each sparse shard with the
    last PS gradient; then the exposed pulls."""
    n, M = e.n, context.num_nodes
    price = context.server_price
    busiest = load.node_seconds.argmax(axis=1)
    busy_node = busiest.take(e.row)
    copies = e.weights.reshape(-1)
    outbound = copies.take(e.weight_row * M + busy_node) * e.push / context.nic_bandwidth.take(busy_node)
    entry_push = price.push_scale.take(busy_node)
    on_busy = np.flatnonzero(context.device_node.take(e.server) == busy_node.take(e.entry))
    i, d = e.entry.take(on_busy), e.server.take(on_busy)
    share = e.push_share.take(i)
    own = copies.take(e.weight_row.take(i) * M + context.device_node.take(d)) * share
    resident = load.resident.reshape(-1).take(e.weight_row.take(i) * context.num_devices + d) * share
    total = share * e.totals.take(e.weight_row.take(i))
    transfer = (total - 2 * own) * price.inv_nic.take(d) + (own - resident) * price.inv_intra.take(d)
    buckets = e.buckets
    launched = buckets.launch.take(on_busy)
    E = e.row.size
    service = (
        np.bincount(buckets.launch, weights=(outbound / e.count).take(e.entry), minlength=E)
        + np.bincount(launched, weights=transfer, minlength=E)
    ) * entry_push
    seconds = e.update.take(i) * price.inv_rate.take(d) + price.tensor_s.take(d)
    sparse_on_busy = np.zeros(0)
    if e.sparse is not None:
        sparse_on_busy = e.sparse.take(on_busy).astype(np.float64)
        seconds += e.exchanges.take(on_busy) * price.latency.take(d) + e.coalesced.take(
            on_busy
        ) * price.inv_coalesce.take(d)
    service += np.bincount(launched, weights=seconds, minlength=E)
    on_busy_bucket = np.flatnonzero(context.device_node.take(buckets.device) == busy_node.take(buckets.entry))
    service += np.bincount(
        buckets.entry.take(on_busy_bucket), weights=price.latency.take(buckets.device.take(on_busy_bucket)), minlength=E
    )
    moved = np.bincount(e.row, weights=outbound, minlength=n)
    moved += np.bincount(e.row.take(i), weights=transfer, minlength=n)
    moved_sparse: np.ndarray = np.zeros(n)
    if sparse_on_busy.size:
        moved_sparse = np.bincount(e.row, weights=outbound * context.var_sparse.take(e.var), minlength=n)
        moved_sparse += np.bincount(e.row.take(i), weights=transfer * sparse_on_busy, minlength=n)
    dense_buckets = np.bincount(e.row.take(buckets.entry.take(on_busy_bucket)), minlength=n).astype(np.float64)
    last_pull = ((moved - moved_sparse) / np.maximum(dense_buckets, 1.0) + moved_sparse) * price.pull_scale.take(
        busiest
    )
    return BusiestQueue(service, last_pull)


SPARSE_CHANGED_ROWS_COALESCES = 1.5
"""What a sparse server spends, in coalesces of the pushed rows, to find the rows its update changed and
send only those: the candidate rows' unique sort, reading them before and after the step, comparing,
reading the changed ones for the pull, and every worker writing them into its copy. Measured on DLRM's
four tables: the server's update took 3.7 ms more than the same sparse steps under all-reduce, where one
coalesce of the rows took 2.5 ms."""


def _coalesced_bytes(
    context: SimContext, var: np.ndarray, sparse: np.ndarray, push: np.ndarray, pushers: np.ndarray
) -> np.ndarray:
    """Bytes each sparse shard's exchange coalesces (values and int64 indices), or costs as much as:
    its rows where they are pushed (once on the critical path: every worker does it at once), every
    push at the server, and the server's search for the rows that changed."""
    pushed = context.var_ps_bytes.take(var)
    indexed = np.divide(context.var_coalesce_work.take(var), pushed, out=np.ones_like(pushed), where=pushed > 0)
    return np.where(sparse, push * (1.0 + pushers + SPARSE_CHANGED_ROWS_COALESCES) * indexed, 0.0)


def _resident_weights(batch: CandidateBatch, device_weights: np.ndarray) -> np.ndarray:
    """[n, 2, D] the pushing weight of the worker on each device itself, where that device is a replica:
    its 1/(T·P) of a model copy, or with local replication its node's one aggregated push (the runtime's
    server is the node's first rank, which also leads the node's aggregation)."""
    replica = batch.replicas.astype(np.float64)
    stride = (batch.tensor * batch.pipeline).astype(np.float64)[:, None]
    return np.stack([replica / stride, replica * device_weights[:, 1, :]], axis=1)


@dataclass
class DenseBuckets:
    """The runtime's dense PS buckets, one per (candidate, server device, local replication, dtype)."""

    per_device: np.ndarray
    """[n, D] buckets each server device serves (each pays one round trip)."""
    entry: np.ndarray
    """[B] the bucket's last PS entry to be ready: its round trip leaves after that gradient..."""
    device: np.ndarray
    """...[B] and its server device."""
    launch: np.ndarray
    """[P] per (entry, shard) pair, in `entry` order (shard 0 of every entry, then the further shards): the
    entry whose gradient launches its push: its bucket's last-ready member, or for a sparse pair (exchanged
    at the optimizer step) the candidate's last PS entry."""


def _dense_buckets(
    context: SimContext,
    K: int,
    row: np.ndarray,
    var: np.ndarray,
    lr: np.ndarray,
    head: np.ndarray,
    tail: np.ndarray,
    tail_server: np.ndarray,
    tail_shard: np.ndarray,
    sparse: np.ndarray | None,
    n: int,
    D: int,
) -> DenseBuckets:
    """Entries are numbered in (candidate, ready position) order, so a bucket's last-ready member is its
    highest (entry, shard) rank: one scatter-max over the (entry, shard) pairs, no sort."""
    slots, dtype_slot = np.unique(context.var_itemsize, return_inverse=True)
    S = 2 * slots.size
    rank = np.arange(row.size) * K
    key = ((row * D + head) * 2 + lr) * slots.size + dtype_slot.take(var)
    if tail.size:
        rank = np.concatenate([rank, tail * K + tail_shard])
        key = np.concatenate(
            [
                key,
                ((row.take(tail) * D + tail_server) * 2 + lr.take(tail)) * slots.size + dtype_slot.take(var.take(tail)),
            ]
        )
    launch = rank // K
    dense: np.ndarray | slice = slice(None)
    if sparse is not None:
        launch[sparse] = _last_of_row(row).take(row.take(launch[sparse]))
        dense = np.flatnonzero(~sparse)
        rank, key = rank.take(dense), key.take(dense)
    last = np.full(n * D * S, -1, dtype=np.int64)
    np.maximum.at(last, key, rank)
    launch[dense] = last.take(key) // K
    bucket = np.flatnonzero(last >= 0)
    per_device = np.bincount(bucket // S, minlength=n * D).reshape(n, D).astype(np.float64)
    return DenseBuckets(per_device, last.take(bucket) // K, (bucket // S) % D, launch)


def _last_of_row(row: np.ndarray) -> np.ndarray:
    """[N] each candidate's last PS entry (entries run in (candidate, ready position) order); -1 for none."""
    last = np.full(int(row[-1]) + 1, -1, dtype=np.int64)
    ends = np.r_[np.flatnonzero(row[1:] != row[:-1]), row.size - 1]
    last[row.take(ends)] = ends
    return last


def _shard_slots(
    batch: CandidateBatch, cell: np.ndarray, shards: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Servers of the PS entries at flat [N·V] `cell`s: shard 0 of every entry ([E]), then the
    (entry, server, shard index) triples of shards 1, 2, ... of the partitioned ones."""
    K = batch.max_shards
    servers = batch.server.ravel()
    head = servers.take(cell * K).astype(np.intp)
    entries, devices, index = [], [], []
    for k in range(1, K):
        more = np.flatnonzero(shards > k)
        if not more.size:
            break
        entries.append(more)
        devices.append(servers.take(cell.take(more) * K + k))
        index.append(np.full(more.size, k, dtype=np.intp))
    if not entries:
        empty = np.zeros(0, dtype=np.intp)
        return head, empty, empty, empty
    return head, np.concatenate(entries), np.concatenate(devices).astype(np.intp), np.concatenate(index)


def _device_sums(
    row: np.ndarray,
    head: np.ndarray,
    tail: np.ndarray,
    tail_server: np.ndarray,
    n: int,
    D: int,
    lr: np.ndarray,
    push: np.ndarray,
    update: np.ndarray,
    keep: np.ndarray,
) -> dict[str, np.ndarray]:
    """Per (candidate, server device): pushes [n, 2, D] by local replication, and [n, D] update bytes,
    held bytes and shards (tensors it steps), over shard 0 of every entry (`head`) and the further shards (`tail`)."""
    device = row * D + head
    lr_device = (row * 2 + lr) * D + head
    tail_row = row.take(tail)
    tail_device = tail_row * D + tail_server
    tail_lr_device = (tail_row * 2 + lr.take(tail)) * D + tail_server

    def add(keys: np.ndarray, tail_keys: np.ndarray, weights: np.ndarray | None, size: int) -> np.ndarray:
        out = np.bincount(keys, weights=weights, minlength=size)
        if tail.size:
            out = out + np.bincount(tail_keys, weights=None if weights is None else weights.take(tail), minlength=size)
        return out.astype(np.float64, copy=False)

    return {
        "push": add(lr_device, tail_lr_device, push, n * 2 * D).reshape(n, 2, D),
        "update": add(device, tail_device, update, n * D).reshape(n, D),
        "keep": add(device, tail_device, keep, n * D).reshape(n, D),
        "tensors": add(device, tail_device, None, n * D).reshape(n, D),
    }
