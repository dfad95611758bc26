"""One cost function per collective: the alpha-beta formulas, in one place.

Each collective is written as `latency + bytes * seconds_per_byte`, and each function returns the pair
`(latency_s, seconds_per_byte)` so the batch engine can apply one formula to a whole fusion group.
`alpha` is a link's latency in seconds, `bandwidth` the bytes/s collectives reach on it, `p` the
number of ranks. Arguments may be floats or numpy arrays (the engine passes one value per candidate).
With p = 1 every collective costs nothing.

    ring all-reduce          2(p-1)·α + 2(p-1)/p · n/B
    tree all-reduce          2⌈log2 p⌉·α + 2 · n/B            (pipelined double binary tree)
    hierarchical all-reduce  reduce-scatter inside the node (k ranks), ring all-reduce across the m nodes
                             of the node's 1/k share (the k shares cross the NIC side by side), all-gather
                             inside the node:
                             2(k-1)·α_i + 2(k-1)/k · n/B_i + 2(m-1)·α_e + 2(m-1)/m · n/B_e
    reduce-scatter           (p-1)·α + (p-1)/p · n/B
    all-gather               (p-1)·α + (p-1)/p · n/B
    point-to-point send      α + n/B
"""

from __future__ import annotations

import numpy as np

Number = float | np.ndarray


def cost(coefficients: tuple[Number, Number], nbytes: Number) -> Number:
    """Seconds for `nbytes` under `(latency, seconds_per_byte)`."""
    latency, per_byte = coefficients
    return latency + nbytes * per_byte


def ring_allreduce(p: Number, alpha: Number, bandwidth: Number) -> tuple[Number, Number]:
    """2(p-1)·α + 2(p-1)/p · n/B: each rank sends and receives 2(p-1)/p of the buffer."""
    p = np.asarray(p, dtype=float)
    return 2 * (p - 1) * alpha, 2 * (p - 1) / p / bandwidth


def tree_allreduce(p: Number, alpha: Number, bandwidth: Number) -> tuple[Number, Number]:
    """2⌈log2 p⌉·α + 2·n/B: reduce up and broadcast down a pipelined tree; log latency, full buffer twice."""
    p = np.asarray(p, dtype=float)
    steps = np.ceil(np.log2(np.maximum(p, 1.0)))
    return 2 * steps * alpha, np.where(p > 1, 2.0 / bandwidth, 0.0)


def hierarchical_allreduce(
    k: Number, m: Number, alpha_intra: Number, bandwidth_intra: Number, alpha_inter: Number, bandwidth_inter: Number
) -> tuple[Number, Number]:
    """k ranks per node on m nodes: inside-node reduce-scatter + all-gather, across-node all-reduce.

    The k ranks of a node each all-reduce a 1/k share across nodes at the same time, so together they
    move the whole buffer through the node's NIC: the inter-node term is a ring over m nodes on n bytes.
    """
    k = np.asarray(k, dtype=float)
    m = np.asarray(m, dtype=float)
    latency = 2 * (k - 1) * alpha_intra + 2 * (m - 1) * alpha_inter
    per_byte = 2 * (k - 1) / k / bandwidth_intra + 2 * (m - 1) / m / bandwidth_inter
    return latency, per_byte


def reduce_scatter(p: Number, alpha: Number, bandwidth: Number) -> tuple[Number, Number]:
    """(p-1)·α + (p-1)/p · n/B: each rank ends with the reduced 1/p of the buffer."""
    p = np.asarray(p, dtype=float)
    return (p - 1) * alpha, (p - 1) / p / bandwidth


def all_gather(p: Number, alpha: Number, bandwidth: Number) -> tuple[Number, Number]:
    """(p-1)·α + (p-1)/p · n/B, n being the gathered (full) buffer."""
    p = np.asarray(p, dtype=float)
    return (p - 1) * alpha, (p - 1) / p / bandwidth


def send(alpha: Number, bandwidth: Number) -> tuple[Number, Number]:
    """α + n/B: one point-to-point transfer (pipeline stage boundaries)."""
    return alpha, 1.0 / np.asarray(bandwidth, dtype=float)


SPARSE_PS_ROUND_TRIPS = 3
"""Round trips of a sparse PS exchange: rows are found only at run time, so the push sends a row count,
then indices, then values, and the pull the same, each its own message; a dense push and pull are one."""


def ps_push_pull(alpha: Number) -> Number:
    """The latency a PS round trip adds per variable shard (push, then pull): 2·α.

    The bytes of a PS exchange are not a collective formula: they are the load on each server's NIC,
    computed from who pushes what to whom in `simulator.ps`.
    """
    return 2 * np.asarray(alpha, dtype=float)
