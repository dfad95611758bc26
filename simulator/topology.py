"""Where each candidate's ranks sit, and the links its collectives cross (one value per candidate).

Ranks fill the device table node by node, tensor innermost (`rank = (d·P + p)·T + t`), so:
- a tensor group stays inside a node when T <= replicas per node;
- a data-parallel group (stride T·P) has k = max(1, per_node // (T·P)) members per node over
  m = ceil(data / k) nodes; when m > 1 its ring crosses NICs, and the T·P groups that share a node
  (at most `per_node`) run their rings side by side, splitting the NIC;
- the slowest link a collective crosses decides its bandwidth, the largest latency its alpha;
- reduce-scatter and all-gather reach the pacing device kind's `scatter_efficiency` of that bandwidth
  (below 1 where the collective library has no ring for them, as gloo on CPU); an all-gather into
  one tensor per rank (`row_gather`: sparse rows, top-k) reaches its `gather_efficiency`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator import collectives
from simulator.context import SimContext
from simulator.encoding import CandidateBatch

Pair = tuple[np.ndarray, np.ndarray]


@dataclass
class Topology:
    kind: np.ndarray
    """[N] the slowest device kind among the replicas (it paces a synchronous step)."""
    capacity: np.ndarray
    """[N] memory of the smallest replica device."""
    copies: np.ndarray
    """[N, M] data-parallel copies of the model per node (replicas on the node / (T·P))."""
    ring: Pair
    tree: Pair
    hierarchical: Pair
    reduce_scatter: Pair
    all_gather: Pair
    row_gather: Pair
    """An all-gather into one tensor per rank, n being the gathered (full) bytes."""
    half_reduce: np.ndarray
    """[N] the pacing kind's `half_reduce_efficiency`: a half-precision all-reduce's speed per byte."""
    tensor: Pair
    """All-reduce inside the tensor group (Megatron's activations)."""
    p2p: Pair
    """A send between pipeline stages."""
    dp_crosses_nodes: np.ndarray
    nic_gbps: np.ndarray
    """[N] line rate of the slowest NIC among the replicas' nodes (for messages)."""


def topology(context: SimContext, batch: CandidateBatch) -> Topology:
    replicas = batch.replicas
    per_node_count = context.per_node(replicas.astype(np.float64))
    used = per_node_count > 0
    nodes_used = np.maximum(used.sum(axis=1), 1)
    size = batch.data.astype(np.float64) * batch.tensor * batch.pipeline
    per_node = size / nodes_used
    kind = _slowest_kind(context, replicas)
    capacity = np.where(replicas, context.kinds.memory_bytes[context.device_kind], np.inf).min(axis=1)

    alpha_i = np.where(used, context.intra_latency, 0.0).max(axis=1)
    band_i = np.where(used, context.intra_bandwidth, np.inf).min(axis=1)
    alpha_e = np.maximum(np.where(used, context.nic_latency, 0.0).max(axis=1), alpha_i)
    band_nic = np.where(used, context.nic_bandwidth, np.inf).min(axis=1)
    gbps = np.where(used, context.nic_gbps, np.inf).min(axis=1)

    data = batch.data.astype(np.float64)
    tensor = batch.tensor.astype(np.float64)
    stride = tensor * batch.pipeline
    k = np.clip(np.floor(per_node / stride), 1, data)
    m = np.ceil(data / k)
    crosses = m > 1
    band_e = band_nic / np.clip(np.minimum(stride, per_node), 1, None)
    alpha = np.where(crosses, alpha_e, alpha_i)
    band = np.where(crosses, np.minimum(band_i, band_e), band_i)

    ring = collectives.ring_allreduce(data, alpha, band)
    hier = collectives.hierarchical_allreduce(k, m, alpha_i, band_i, alpha_e, np.minimum(band_e, band_i))
    two_level = crosses & (k > 1)
    hierarchical = (np.where(two_level, hier[0], ring[0]), np.where(two_level, hier[1], ring[1]))

    tp_crosses = tensor > per_node
    tp_alpha = np.where(tp_crosses, alpha_e, alpha_i)
    tp_band = np.where(tp_crosses, np.minimum(band_i, band_nic), band_i)
    pp_crosses = stride > per_node
    scatter = context.kinds.scatter_efficiency[kind]
    return Topology(
        kind=kind,
        capacity=capacity,
        copies=per_node_count / stride[:, None],
        ring=ring,
        tree=collectives.tree_allreduce(data, alpha, band),
        hierarchical=hierarchical,
        reduce_scatter=collectives.reduce_scatter(data, alpha, band * scatter),
        all_gather=collectives.all_gather(data, alpha, band * scatter),
        row_gather=collectives.all_gather(data, alpha, band * context.kinds.gather_efficiency[kind]),
        half_reduce=context.kinds.half_reduce_efficiency[kind],
        tensor=collectives.ring_allreduce(tensor, tp_alpha, tp_band),
        p2p=collectives.send(
            np.where(pp_crosses, alpha_e, alpha_i), np.where(pp_crosses, np.minimum(band_nic, band_i), band_i)
        ),
        dp_crosses_nodes=crosses,
        nic_gbps=gbps,
    )


def _slowest_kind(context: SimContext, replicas: np.ndarray) -> np.ndarray:
    slowness = context.kind_slowness[context.device_kind]
    worst = np.where(replicas, slowness, -1).max(axis=1)
    by_rank = np.argsort(context.kind_slowness)
    return by_rank[np.maximum(worst, 0)]
