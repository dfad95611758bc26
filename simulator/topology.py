"""Where each candidate's ranks sit, and the links its collectives cross (one value per candidate).

Ranks fill the device table node by node, tensor innermost (`rank = ((d·P + p)·C + c)·T + t`), so:
- a tensor group stays inside a node when T <= replicas per node;
- gradients are reduced over the data × context ranks of a (tensor, pipeline) position, every context
  rank holding a full replica: a group of g = data·C with k = min(C, per_node // T) ·
  max(1, per_node // (T·C·P)) members per node over m = ceil(g / k) nodes; when m > 1 its ring crosses
  NICs, and the T·P groups that share a node (at most `per_node / min(C, per_node // T)`) run their rings
  side by side, splitting the NIC;
- ring attention passes key/value blocks among the C context ranks (stride T), across NICs when
  T·C > per_node;
- hybrid sharding shards over groups of `shard_group` data ranks (× C: S ranks, consecutive, so inside
  a node when they fit) and all-reduces each shard across the R = data / shard_group groups;
- the slowest link a collective crosses decides its bandwidth, the largest latency its alpha;
- reduce-scatter and all-gather reach the pacing device kind's `scatter_efficiency` of that bandwidth
  (below 1 where the collective library has no ring for them, as gloo on CPU); an all-gather into
  one tensor per rank (`row_gather`: sparse rows, top-k) reaches its `gather_efficiency`.

GPU candidates (the pacing kind `is_gpu`) reduce through NCCL, priced by its own cost model
(`simulator.collectives`): ring and tree are NCCL's, each with its LL, LL128 and Simple protocols
(`protocols`), plus NVLink SHARP for a group inside one NVSwitch node; `auto` is NCCL's choice among
them. The two-level `hierarchical` all-reduce is the runtime's own (reduce inside the node, all-reduce
across, broadcast back), priced only where a strategy names it. Every rank of a node that sends
through the NIC at once shares it: a pipeline boundary's sends are the T·C ranks of a stage.
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
    dp_degree: np.ndarray
    """[N] ranks a gradient is reduced over: data × context."""
    cp: Pair
    """A send between neighbouring context-parallel ranks (ring attention)."""
    shard_degree: np.ndarray
    """[N] ranks a sharded variable is sharded over: the shard group (or all data ranks) × context."""
    shard_reduce_scatter: Pair
    shard_all_gather: Pair
    replicate: Pair
    """All-reduce of a shard across the R = data / shard_group groups (free when R = 1)."""
    nccl: np.ndarray
    """[N] whether the candidate reduces through NCCL (its pacing kind is a GPU)."""
    protocols: list[Pair]
    """NCCL's other all-reduce choices beside `ring` and `tree` (their Simple protocol): ring LL and LL128,
    tree LL and LL128, NVLink SHARP; infinite latency where a candidate has no such choice."""


def topology(context: SimContext, batch: CandidateBatch) -> Topology:
    replicas = batch.replicas
    per_node_count = context.per_node(replicas.astype(np.float64))
    used = per_node_count > 0
    nodes_used = np.maximum(used.sum(axis=1), 1)
    cp = batch.context_parallel.astype(np.float64)
    size = batch.data.astype(np.float64) * batch.tensor * batch.pipeline * cp
    per_node = size / nodes_used
    kind = _slowest_kind(context, replicas)
    capacity = np.where(replicas, context.kinds.memory_bytes[context.device_kind], np.inf).min(axis=1)

    links = Links(
        alpha_i=np.where(used, context.intra_latency, 0.0).max(axis=1),
        band_i=np.where(used, context.intra_bandwidth, np.inf).min(axis=1),
        alpha_e=np.maximum(
            np.where(used, context.nic_latency, 0.0).max(axis=1), np.where(used, context.intra_latency, 0.0).max(axis=1)
        ),
        band_nic=np.where(used, context.nic_bandwidth, np.inf).min(axis=1),
    )
    gbps = np.where(used, context.nic_gbps, np.inf).min(axis=1)

    data = batch.data.astype(np.float64)
    tensor = batch.tensor.astype(np.float64)
    stride = tensor * batch.pipeline
    block = stride * cp
    cp_on_node = np.clip(np.floor(per_node / tensor), 1, cp)
    k = cp_on_node * np.clip(np.floor(per_node / block), 1, data)
    degree = data * cp
    m = np.ceil(degree / k)
    crosses = m > 1
    band_e = links.band_nic / np.clip(np.minimum(stride, per_node / cp_on_node), 1, None)
    alpha = np.where(crosses, links.alpha_e, links.alpha_i)
    band = np.where(crosses, np.minimum(links.band_i, band_e), links.band_i)

    ring = _pair(collectives.ring_allreduce(degree, alpha, band))
    tree = _pair(collectives.tree_allreduce(degree, alpha, band))
    nccl = context.kinds.is_gpu[kind]
    nvlink = np.asarray(np.where(used, context.intra_nvlink, True).all(axis=1))
    protocols: list[Pair] = []
    if nccl.any():
        nccl_ring, nccl_tree, protocols = _nccl_allreduce(
            context, kind, links, nvlink, degree, k, m, crossings=crosses, band=band, band_e=band_e
        )
        ring = _select(nccl, nccl_ring, ring)
        tree = _select(nccl, nccl_tree, tree)
        protocols = [_select(nccl, choice, _never(len(batch))) for choice in protocols]
    hier = _pair(
        collectives.hierarchical_allreduce(
            k, m, links.alpha_i, links.band_i, links.alpha_e, np.minimum(band_e, links.band_i)
        )
    )
    two_level = crosses & (k > 1)
    hierarchical = (np.where(two_level, hier[0], ring[0]), np.where(two_level, hier[1], ring[1]))

    tp_crosses = tensor > per_node
    tp_alpha = np.where(tp_crosses, links.alpha_e, links.alpha_i)
    tp_band = np.where(tp_crosses, np.minimum(links.band_i, links.band_nic), links.band_i)
    tp_pair = _pair(collectives.ring_allreduce(tensor, tp_alpha, tp_band))
    if nccl.any():
        tp_nodes = np.where(tp_crosses, np.ceil(tensor / np.maximum(per_node, 1)), 1.0)
        tp_ring = _pair(collectives.nccl_ring_allreduce(tensor, tp_nodes, links.alpha_i, links.alpha_e, tp_band, 2))
        tp_pair = _select(nccl, tp_ring, tp_pair)
    pp_crosses = block > per_node
    scatter = context.kinds.scatter_efficiency[kind]
    reduce_scatter = _pair(collectives.reduce_scatter(degree, alpha, band * scatter))
    all_gather = _pair(collectives.all_gather(degree, alpha, band * scatter))
    if nccl.any():
        nccl_scatter = _nccl_scatter(links, degree, m, band * scatter)
        reduce_scatter = _select(nccl, nccl_scatter, reduce_scatter)
        all_gather = _select(nccl, nccl_scatter, all_gather)
    shard = _shard_groups(batch, links, per_node, cp_on_node, block, scatter, reduce_scatter, all_gather)
    cp_crosses = tensor * cp > per_node
    cp_band = np.minimum(links.band_i, links.band_nic / np.clip(per_node / cp_on_node, 1, None))
    return Topology(
        kind=kind,
        capacity=capacity,
        copies=per_node_count / stride[:, None],
        ring=ring,
        tree=tree,
        hierarchical=hierarchical,
        reduce_scatter=reduce_scatter,
        all_gather=all_gather,
        row_gather=_pair(collectives.all_gather(degree, alpha, band * context.kinds.gather_efficiency[kind])),
        half_reduce=context.kinds.half_reduce_efficiency[kind],
        tensor=tp_pair,
        p2p=_pair(
            collectives.send(
                np.where(pp_crosses, links.alpha_e, links.alpha_i),
                np.where(
                    pp_crosses,
                    np.minimum(
                        links.band_nic / np.where(nccl, np.clip(np.minimum(per_node, tensor * cp), 1, None), 1.0),
                        links.band_i,
                    ),
                    links.band_i,
                ),
            )
        ),
        dp_crosses_nodes=crosses,
        nic_gbps=gbps,
        dp_degree=degree,
        cp=_pair(
            collectives.send(
                np.where(cp_crosses, links.alpha_e, links.alpha_i), np.where(cp_crosses, cp_band, links.band_i)
            )
        ),
        shard_degree=shard[0],
        shard_reduce_scatter=shard[1],
        shard_all_gather=shard[2],
        replicate=shard[3],
        nccl=nccl,
        protocols=protocols,
    )


@dataclass
class Links:
    """[N] the links a candidate's collectives can cross: inside a node (`_i`) and through its NIC."""

    alpha_i: np.ndarray
    band_i: np.ndarray
    alpha_e: np.ndarray
    band_nic: np.ndarray

    def group(self, members: np.ndarray, per_node_members: np.ndarray, sharing: np.ndarray) -> Pair:
        """(alpha, bandwidth) of a group with `per_node_members` members on each of its nodes, whose
        NIC `sharing` such groups split."""
        crosses = np.ceil(members / per_node_members) > 1
        band_e = self.band_nic / np.clip(sharing, 1, None)
        return np.where(crosses, self.alpha_e, self.alpha_i), np.where(
            crosses, np.minimum(self.band_i, band_e), self.band_i
        )


def _shard_groups(
    batch: CandidateBatch,
    links: Links,
    per_node: np.ndarray,
    cp_on_node: np.ndarray,
    block: np.ndarray,
    scatter: np.ndarray,
    reduce_scatter: Pair,
    all_gather: Pair,
) -> tuple[np.ndarray, Pair, Pair, Pair]:
    """Shard degree, the shard group's reduce-scatter and all-gather, and the all-reduce across groups.
    Without a shard group the shard group is the whole data × context group."""
    cp = batch.context_parallel.astype(np.float64)
    data = batch.data.astype(np.float64)
    hybrid = batch.shard_group > 0
    none = (np.zeros(len(batch)), np.zeros(len(batch)))
    if not hybrid.any():
        return data * cp, reduce_scatter, all_gather, none
    group = np.where(hybrid, batch.shard_group, batch.data).astype(np.float64)
    shard = group * cp
    k_shard = cp_on_node * np.clip(np.floor(per_node / block), 1, group)
    alpha, band = links.group(shard, k_shard, np.minimum(block / cp, per_node / cp_on_node))
    across = data / group
    k_across = np.clip(np.floor(per_node / (group * block)), 1, across)
    alpha_r, band_r = links.group(across, k_across, per_node / k_across)
    rs = _pair(collectives.reduce_scatter(shard, alpha, band * scatter))
    ag = _pair(collectives.all_gather(shard, alpha, band * scatter))
    replicate = _pair(collectives.ring_allreduce(across, alpha_r, band_r))
    return (
        shard,
        (np.where(hybrid, rs[0], reduce_scatter[0]), np.where(hybrid, rs[1], reduce_scatter[1])),
        (np.where(hybrid, ag[0], all_gather[0]), np.where(hybrid, ag[1], all_gather[1])),
        (np.where(hybrid, replicate[0], 0.0), np.where(hybrid, replicate[1], 0.0)),
    )


def _nccl_allreduce(
    context: SimContext,
    kind: np.ndarray,
    links: Links,
    nvlink: np.ndarray,
    degree: np.ndarray,
    k: np.ndarray,
    m: np.ndarray,
    *,
    crossings: np.ndarray,
    band: np.ndarray,
    band_e: np.ndarray,
) -> tuple[Pair, Pair, list[Pair]]:
    """NCCL's ring and tree (Simple protocol) and its other choices for the data-parallel group: k ranks
    per node on m nodes. A tree carries n through each NIC on two nodes, half a ring's, and 2n on more."""
    nodes = np.where(crossings, m, 1.0)
    per_node = np.where(crossings, k, degree)

    def steps(algorithm: str, protocol: int) -> tuple[np.ndarray, np.ndarray]:
        inside = np.where(
            nvlink,
            collectives.step_latency(links.alpha_i, "nvlink", algorithm, protocol),
            collectives.step_latency(links.alpha_i, "pcie", algorithm, protocol),
        )
        return inside, np.asarray(collectives.step_latency(links.alpha_e, "net", algorithm, protocol))

    tree_band = np.where(crossings, np.minimum(links.band_i, band_e * np.where(nodes == 2, 2.0, 1.0)), band)
    ring = {p: _pair(collectives.nccl_ring_allreduce(degree, nodes, *steps("ring", p), band, p)) for p in range(3)}
    tree = {
        p: _pair(collectives.nccl_tree_allreduce(per_node, nodes, *steps("tree", p), tree_band, p)) for p in range(3)
    }
    never = _never(len(degree))
    ll128 = nvlink  # NCCL enables LL128 only where the node's GPUs share NVLink
    choices = [ring[0], _select(ll128, ring[1], never), tree[0], _select(ll128, tree[1], never)]
    sharp = context.kinds.nvlink_sharp[kind]
    nvls = (sharp > 0) & nvlink & ~crossings
    if nvls.any():
        step = collectives.step_latency(links.alpha_i, "nvlink", "nvls", 2)
        nvls_pair = _pair(collectives.nccl_nvls_allreduce(degree, step, links.band_i * np.maximum(sharp, 1e-9)))
        choices.append(_select(nvls, nvls_pair, never))
    return ring[2], tree[2], choices


def _nccl_scatter(links: Links, degree: np.ndarray, m: np.ndarray, band: np.ndarray) -> Pair:
    """NCCL's ring reduce-scatter (or all-gather) over the data-parallel group, Simple protocol."""
    return _pair(collectives.nccl_ring_scatter(degree, np.maximum(m, 1.0), links.alpha_i, links.alpha_e, band))


def _select(mask: np.ndarray, chosen: Pair, other: Pair) -> Pair:
    return np.where(mask, chosen[0], other[0]), np.where(mask, chosen[1], other[1])


def _never(n: int) -> Pair:
    """A choice no candidate takes (infinite latency)."""
    return np.full(n, np.inf), np.zeros(n)


def _pair(coefficients: tuple[collectives.Number, collectives.Number]) -> Pair:
    """A collective's (latency, seconds per byte) as arrays (one value per candidate)."""
    return np.asarray(coefficients[0]), np.asarray(coefficients[1])


def _slowest_kind(context: SimContext, replicas: np.ndarray) -> np.ndarray:
    slowness = context.kind_slowness[context.device_kind]
    worst = np.where(replicas, slowness, -1).max(axis=1)
    by_rank = np.argsort(context.kind_slowness)
    return by_rank[np.maximum(worst, 0)]
