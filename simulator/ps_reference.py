"""The parameter-server phase of one candidate, in plain loops: the reference `simulator.ps` is held to.

It prices the model `simulator.ps` documents, shard by shard and node by node, with no arrays to
keep in step; a property test (`tests/test_simulator_ps_reference.py`) checks that the vectorised
phase gives the same numbers on random candidates. It is far too slow for search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator import collectives
from simulator.context import SimContext
from simulator.encoding import CandidateBatch, SyncKind
from simulator.pipeline import ComputePhase
from simulator.ps import SPARSE_CHANGED_ROWS_COALESCES
from simulator.topology import Topology


@dataclass
class ReferencePS:
    finish: float
    last_pull: float
    throughput: float
    node_seconds: list[float]
    node_bytes: list[float]
    held: list[float]


@dataclass
class Shard:
    var: int
    entry: int
    """Position of its variable among the candidate's PS variables in gradient-ready order."""
    server: int
    local_replication: bool
    sparse: bool
    push: float
    """Bytes one pusher (a model copy, or a node under local replication) sends to this shard."""
    update: float
    held: float


def ps_reference(
    context: SimContext, batch: CandidateBatch, topo: Topology, compute: ComputePhase, i: int
) -> ReferencePS:
    """Candidate i's PS finish time, exposed pull, throughput bound, per-node seconds and bytes, and the
    bytes each server device holds."""
    M, D = context.num_nodes, context.num_devices
    copies = [float(c) for c in topo.copies[i]]
    ready = compute.ready_dense()[i]
    ps_vars = [int(v) for v in context.order if batch.kind[i, v] == SyncKind.PS]
    if not ps_vars:
        return ReferencePS(0.0, 0.0, 0.0, [0.0] * M, [0.0] * M, [0.0] * D)

    def weight(lr: bool, node: int) -> float:
        """How many pushes of a variable node `node` sends: its model copies, or one with local replication."""
        return min(copies[node], 1.0) if lr else copies[node]

    def pushers(lr: bool) -> float:
        return sum(weight(lr, j) for j in range(M))

    def resident(lr: bool, device: int) -> float:
        """Pushes that start on the server device itself (its own replica's), which never leave it."""
        if not batch.replicas[i, device]:
            return 0.0
        if lr:
            return weight(True, int(context.device_node[device]))
        return 1.0 / (int(batch.tensor[i]) * int(batch.pipeline[i]))

    shards = _shards(context, batch, i, ps_vars, max(copies))
    price = context.server_price
    node_bytes = [0.0] * M
    intra_seconds = [0.0] * M
    work = [0.0] * M
    held = [0.0] * D
    buckets: dict[tuple[int, bool, float], int] = {}
    """(server, local replication, itemsize) -> the entry that launches the dense bucket."""
    for shard in shards:
        s, lr = shard.server, shard.local_replication
        home = int(context.device_node[s])
        held[s] += shard.held
        for j in range(M):
            if j != home:
                node_bytes[j] += weight(lr, j) * shard.push
                node_bytes[home] += weight(lr, j) * shard.push
        intra_seconds[home] += (weight(lr, home) - resident(lr, s)) * shard.push * price.inv_intra[s]
        work[home] += shard.update * price.inv_rate[s] + price.tensor_s[s]
        if shard.sparse:
            work[home] += collectives.SPARSE_PS_ROUND_TRIPS * price.latency[s]
            work[home] += _coalesced(context, shard, pushers(lr)) * price.inv_coalesce[s]
        else:
            key = (s, lr, float(context.var_itemsize[shard.var]))
            buckets[key] = max(buckets.get(key, -1), shard.entry)
    for s, _, _ in buckets:
        work[int(context.device_node[s])] += price.latency[s]
    node_seconds = [
        (node_bytes[j] / context.nic_bandwidth[j] + intra_seconds[j]) * max(price.push_scale[j], price.pull_scale[j])
        + work[j]
        for j in range(M)
    ]

    busy = node_seconds.index(max(node_seconds))
    last_entry = len(ps_vars) - 1
    service = [0.0] * len(ps_vars)
    moved, moved_sparse = 0.0, 0.0
    for shard in shards:
        s, lr = shard.server, shard.local_replication
        launch = last_entry if shard.sparse else buckets[(s, lr, float(context.var_itemsize[shard.var]))]
        seconds = weight(lr, busy) * shard.push / context.nic_bandwidth[busy]
        if int(context.device_node[s]) == busy:
            own = weight(lr, busy) * shard.push
            remote = pushers(lr) * shard.push - own
            seconds += (remote - own) * price.inv_nic[s] + (own - resident(lr, s) * shard.push) * price.inv_intra[s]
        service[launch] += seconds * price.push_scale[busy]
        moved += seconds
        moved_sparse += seconds if shard.sparse else 0.0
        if int(context.device_node[s]) == busy:
            service[launch] += shard.update * price.inv_rate[s] + price.tensor_s[s]
            if shard.sparse:
                service[launch] += collectives.SPARSE_PS_ROUND_TRIPS * price.latency[s]
                service[launch] += _coalesced(context, shard, pushers(lr)) * price.inv_coalesce[s]
    busy_buckets = 0
    for (s, _, _), launch in buckets.items():
        if int(context.device_node[s]) == busy:
            service[launch] += price.latency[s]
            busy_buckets += 1
    last_pull = ((moved - moved_sparse) / max(busy_buckets, 1) + moved_sparse) * price.pull_scale[busy]
    clock = -math.inf
    for entry, v in enumerate(ps_vars):
        clock = max(clock, ready[context.ready_position[v]]) + service[entry]
    return ReferencePS(
        finish=clock + last_pull,
        last_pull=last_pull,
        throughput=max(node_seconds),
        node_seconds=node_seconds,
        node_bytes=node_bytes,
        held=held,
    )


def _shards(context: SimContext, batch: CandidateBatch, i: int, ps_vars: list[int], most_copies: float) -> list[Shard]:
    out = []
    for entry, v in enumerate(ps_vars):
        lr = bool(batch.local_replication[i, v])
        rows = float(context.var_ps_bytes[v])
        push = min(most_copies * rows, float(context.var_bytes[v])) if lr else rows
        count = int(batch.shards[i, v])
        for k in range(count):
            out.append(
                Shard(
                    var=v,
                    entry=entry,
                    server=int(batch.server[i, v, k]),
                    local_replication=lr,
                    sparse=bool(context.var_sparse[v]),
                    push=push / count,
                    update=float(context.var_update_bytes[v]) / count,
                    held=float(context.ps_held_bytes[v]) / count,
                )
            )
    return out


def _coalesced(context: SimContext, shard: Shard, pushers: float) -> float:
    """Bytes a sparse shard's exchange coalesces: its rows where pushed, every push at the server, and
    the server's search for the rows that changed, per byte of values and indices."""
    pushed = float(context.var_ps_bytes[shard.var])
    indexed = float(context.var_coalesce_work[shard.var]) / pushed if pushed > 0 else 1.0
    return shard.push * (1.0 + pushers + SPARSE_CHANGED_ROWS_COALESCES) * indexed
