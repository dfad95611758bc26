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

GPU ranks reduce through NCCL, whose own cost model (NVIDIA/nccl@5067397c, `src/graph/tuning.cc`) these
formulas follow. NCCL runs each collective with one algorithm (ring, tree, NVLink SHARP) and one
protocol (LL: 8-byte stores with a flag, LL128: 120 of every 128 bytes, Simple: bulk copies with a
synchronisation per step) and picks the cheapest for the message. Per protocol P:

    ring all-reduce    base_P + (2(p-1) - 2(m-1))·step_P(intra) + 2(m-1)·step_P(net)
                       + 2(p-1)/p · n / (eff_P · B)
    tree all-reduce    base_P + 2((k-1)·step_P(intra) + ⌊log2 m⌋·step_P(net)) + 2 · n / (0.92 · eff_P · B_tree)
    NVLS all-reduce    step_nvls + 2(p-1)/p · n / (sharp · B)                (one node, NVSwitch, Simple)
    reduce-scatter,    base_P + ((p-1) - (m-1))·step_P(intra) + (m-1)·step_P(net) + (p-1)/p · n / (eff_P · B)
    all-gather

with k ranks per node on m nodes, B the bus bandwidth of the slowest link the ring crosses (NCCL reaches
about 80 % of NVLink's line rate, 370 of 450 GB/s per direction on H100: sjeaugey in NVIDIA/nccl-tests#212;
12.2 GB/s through one 100 Gb/s EDR card: NVIDIA/nccl-tests#29). A ring carries 2(p-1)/p · n through
every node's NIC; a double binary tree carries n through each NIC on two nodes (each node is the
other's only peer in both trees) and up to 2n on more, so `B_tree` is twice the NIC share at m = 2
(sjeaugey in NVIDIA/nccl#209: on two nodes a tree's bus bandwidth reaches up to twice the network's, not
on 3+). Protocol factors `eff_P`: LL 0.5, LL128 0.92 (NVLink nodes only, as NCCL enables it), Simple 1;
the tree's LL 1/3.8 and LL128 7/9 inside a node, 120/128 across. A step's latency on a link is the link's latency (one Simple ring
step) times NCCL's ratio for the protocol and algorithm (`stratagem.ir.nccl`).
"""

from __future__ import annotations

import numpy as np

from stratagem.ir.nccl import (
    BASE_LATENCY_US,
    RING_EFFICIENCY,
    TREE_EFFICIENCY,
    TREE_PROTOCOL,
    step_ratio,
)

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


# --- NCCL (constants in `stratagem.ir.nccl`) ---------------------------------------------------------


def step_latency(alpha: Number, link: str, algorithm: str, protocol: int) -> Number:
    """One step of `algorithm` under `protocol` on a link whose Simple ring step takes `alpha` seconds."""
    return np.asarray(alpha) * step_ratio(link, algorithm, protocol)


def nccl_ring_allreduce(
    p: Number, m: Number, step_intra: Number, step_net: Number, bandwidth: Number, protocol: int
) -> tuple[Number, Number]:
    """A ring over p ranks on m nodes: 2(p-1) steps, 2(m-1) of them through the NICs."""
    p, m = np.asarray(p, dtype=float), np.asarray(m, dtype=float)
    inter = 2 * (m - 1)
    latency = BASE_LATENCY_US["ring"][protocol] * 1e-6 + (2 * (p - 1) - inter) * step_intra + inter * step_net
    per_byte = 2 * (p - 1) / p / (RING_EFFICIENCY[protocol] * np.asarray(bandwidth))
    return np.where(p > 1, latency, 0.0), np.where(p > 1, per_byte, 0.0)


def nccl_tree_allreduce(
    k: Number, m: Number, step_intra: Number, step_net: Number, bandwidth: Number, protocol: int
) -> tuple[Number, Number]:
    """A chain inside each node under a double binary tree across the m nodes (k ranks per node)."""
    k, m = np.asarray(k, dtype=float), np.asarray(m, dtype=float)
    p = k * m
    depth = np.floor(np.log2(np.maximum(m, 1.0)))
    latency = BASE_LATENCY_US["tree"][protocol] * 1e-6 + 2 * ((k - 1) * step_intra + depth * step_net)
    factor: Number = TREE_PROTOCOL[protocol] if protocol == 0 else TREE_PROTOCOL[3]
    if protocol == 1:
        factor = np.where(m > 1, TREE_PROTOCOL[2], TREE_PROTOCOL[1])
    per_byte = 2.0 / (TREE_EFFICIENCY * factor * np.asarray(bandwidth))
    return np.where(p > 1, latency, 0.0), np.where(p > 1, per_byte, 0.0)


def nccl_nvls_allreduce(p: Number, step: Number, bandwidth: Number) -> tuple[Number, Number]:
    """NVLink SHARP inside one node: the switch reduces, one step; `bandwidth` is its bus bandwidth."""
    p = np.asarray(p, dtype=float)
    return np.where(p > 1, step, 0.0), np.where(p > 1, 2 * (p - 1) / p / np.asarray(bandwidth), 0.0)


def nccl_ring_scatter(
    p: Number, m: Number, step_intra: Number, step_net: Number, bandwidth: Number, protocol: int = 2
) -> tuple[Number, Number]:
    """Reduce-scatter or all-gather on a ring: p-1 steps, m-1 of them through the NICs."""
    p, m = np.asarray(p, dtype=float), np.asarray(m, dtype=float)
    inter = m - 1
    latency = BASE_LATENCY_US["ring"][protocol] * 1e-6 + (p - 1 - inter) * step_intra + inter * step_net
    per_byte = (p - 1) / p / (RING_EFFICIENCY[protocol] * np.asarray(bandwidth))
    return np.where(p > 1, latency, 0.0), np.where(p > 1, per_byte, 0.0)


def async_tensor_parallel(comm: Number, matmul: Number, degree: Number, overlap: Number) -> Number:
    """Seconds a tensor-parallel collective leaves on the critical path when async TP cuts it into `degree`
    pieces, each moving while the matmul consumes (all-gather) or produces (reduce-scatter) the piece
    before it (Wang et al. 2023; torch's micro-pipeline TP). The first piece is exposed; the others hide
    behind the matmuls on either side of the collective, taken as twice the row-parallel layer's
    `matmul` time, and what does not fit is exposed too; the hidden pieces slow those matmuls by
    (1 - `overlap`) of themselves, as any overlapped collective does.

        exposed = c/T + max(0, c(T-1)/T - 2m(T-1)/T) + (1 - overlap) · hidden
    """
    comm, degree = np.asarray(comm, dtype=float), np.maximum(np.asarray(degree, dtype=float), 1.0)
    piece = comm / degree
    pieces = comm - piece
    excess = np.maximum(pieces - 2 * np.asarray(matmul) * (degree - 1) / degree, 0.0)
    hidden = pieces - excess
    return piece + excess + (1.0 - np.asarray(overlap)) * hidden


SPARSE_PS_ROUND_TRIPS = 3
"""Round trips of a sparse PS exchange: rows are found only at run time, so the push sends a row count,
then indices, then values, and the pull the same, each its own message; a dense push and pull are one."""


def ps_push_pull(alpha: Number) -> Number:
    """The latency a PS round trip adds per variable shard (push, then pull): 2·α.

    The bytes of a PS exchange are not a collective formula: they are the load on each server's NIC,
    computed from who pushes what to whom in `simulator.ps`.
    """
    return 2 * np.asarray(alpha, dtype=float)
