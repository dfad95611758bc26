"""NCCL's cost model as the simulator prices it: bus bandwidths, protocols by message size, ring against
tree across thin NICs, NVLink SHARP on Hopper, and what overlapped collectives take from a GPU's compute."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import collectives
from simulator.allreduce import _allreduce_cost
from simulator.context import compile_context
from simulator.encoding import Algorithm, CandidateBatch, SyncKind
from simulator.engine import simulate_batch
from simulator.topology import topology
from stratagem.ir import Layer, Link, ModelGraph, Node, ResourceSpec, Variable
from stratagem.ir.catalog import GPU_COMM_OVERLAP, lookup

GB = 1e9


def graph(params: int = 64 * 1024 * 1024, layers: int = 4) -> ModelGraph:
    """A stack of linear layers holding `params` fp32 parameters, with enough compute to hide a bucket."""
    per = params // layers
    return ModelGraph(
        name="stack",
        batch_size=32,
        layers=[
            Layer(
                name=f"fc{i}",
                type="Linear",
                fwd_flops=2e12,
                bwd_flops=4e12,
                inputs=[f"fc{i - 1}"] if i else [],
                variables=[f"fc{i}.weight"],
            )
            for i in range(layers)
        ],
        variables=[Variable(name=f"fc{i}.weight", shape=[per], consumer=f"fc{i}") for i in range(layers)],
    )


def gpu_cluster(nodes: int, device: str = "H100", nic_gbps: float = 100.0, gpus: int = 8) -> ResourceSpec:
    return ResourceSpec(
        nodes=[Node(address=f"node{i}", chief=i == 0, gpus=list(range(gpus)), device=device) for i in range(nodes)],
        network=Link(kind="infiniband", bandwidth_gbps=nic_gbps, latency_us=14),
    )


def allreduce_batch(context, algorithm: Algorithm, *, group_all: bool = True) -> CandidateBatch:
    batch = CandidateBatch.allocate(context, 1)
    gpus = context.compute_device_indices
    batch.data[:] = gpus.size
    batch.replicas[:] = False
    batch.replicas[0, gpus] = True
    batch.kind[:] = SyncKind.ALLREDUCE
    batch.algorithm[:] = algorithm
    batch.group[:] = 0 if group_all else np.arange(context.num_variables)
    return batch


def busbw(context, algorithm: Algorithm, nbytes: float) -> float:
    """Bus bandwidth (nccl-tests' definition) of one all-reduce of `nbytes` under `algorithm`."""
    topo = topology(context, allreduce_batch(context, algorithm))
    seconds, _ = _allreduce_cost(topo, np.zeros(1, dtype=np.intp), np.array([int(algorithm)]), np.array([nbytes]))
    p = float(topo.dp_degree[0])
    return nbytes / float(seconds[0]) * 2 * (p - 1) / p


def test_a_large_ring_all_reduce_reaches_the_links_bus_bandwidth_inside_an_h100_node():
    context = compile_context(graph(), gpu_cluster(1))
    link = context.resources.intra_link(context.resources.nodes[0])
    assert busbw(context, Algorithm.RING, 4 * GB) == pytest.approx(link.bytes_per_s, rel=0.01)
    assert link.bytes_per_s == pytest.approx(369e9, rel=0.01)  # nccl-tests#212: 370 GB/s on H100


def test_nvlink_sharp_speeds_up_a_large_all_reduce_inside_a_hopper_node_and_not_an_ampere_one():
    hopper = compile_context(graph(), gpu_cluster(1))
    ampere = compile_context(graph(), gpu_cluster(1, device="A100-80GB"))
    assert busbw(hopper, Algorithm.AUTO, 4 * GB) == pytest.approx(1.3 * busbw(hopper, Algorithm.RING, 4 * GB), rel=0.02)
    assert busbw(ampere, Algorithm.AUTO, 4 * GB) == pytest.approx(busbw(ampere, Algorithm.RING, 4 * GB), rel=0.01)


def test_small_messages_pay_the_low_latency_protocol_not_simple_steps():
    context = compile_context(graph(), gpu_cluster(1))
    topo = topology(context, allreduce_batch(context, Algorithm.RING))
    seconds, _ = _allreduce_cost(topo, np.zeros(1, dtype=np.intp), np.array([int(Algorithm.RING)]), np.array([8e3]))
    simple = collectives.BASE_LATENCY_US["ring"][2] + 14 * 3.4
    low = collectives.BASE_LATENCY_US["ring"][0] + 14 * 0.6
    assert float(seconds[0]) * 1e6 == pytest.approx(low, rel=0.05)
    assert float(seconds[0]) * 1e6 < simple / 2


def test_busbw_grows_with_message_size_toward_the_links():
    context = compile_context(graph(), gpu_cluster(1, device="A100-80GB"))
    sizes = [64e3, 1e6, 16e6, 256e6, 4e9]
    bandwidths = [busbw(context, Algorithm.AUTO, n) for n in sizes]
    assert bandwidths == sorted(bandwidths)
    assert bandwidths[0] < 0.2 * bandwidths[-1]


def test_a_tree_halves_a_thin_nics_traffic_on_two_nodes_and_a_ring_wins_on_four():
    two = compile_context(graph(), gpu_cluster(2, device="V100-16GB"))
    four = compile_context(graph(), gpu_cluster(4, device="V100-16GB"))
    size = 100e6
    assert busbw(two, Algorithm.TREE, size) > 1.5 * busbw(two, Algorithm.RING, size)
    assert busbw(four, Algorithm.RING, size) > busbw(four, Algorithm.TREE, size)
    nic = two.resources.nic(two.resources.nodes[0]).bytes_per_s
    assert busbw(four, Algorithm.AUTO, size) == pytest.approx(nic, rel=0.05)


def test_one_nic_shared_by_eight_gpus_bounds_their_ring_by_the_nic():
    thin = compile_context(graph(), gpu_cluster(4, device="A100-80GB", nic_gbps=100))
    fat = compile_context(graph(), gpu_cluster(4, device="A100-80GB", nic_gbps=1600))
    assert busbw(fat, Algorithm.RING, 16 * GB) == pytest.approx(16 * busbw(thin, Algorithm.RING, 16 * GB), rel=0.02)


def test_a_hidden_gpu_all_reduce_still_slows_the_compute_it_overlaps():
    context = compile_context(graph(), gpu_cluster(2, device="A100-80GB", nic_gbps=1600))
    batch = allreduce_batch(context, Algorithm.AUTO, group_all=False)
    result = simulate_batch(context, batch, detail=True)
    busy = float(result.detail["allreduce_busy"][0])
    exposed = float(result.component("allreduce")[0])
    assert GPU_COMM_OVERLAP == lookup("A100-80GB").comm_overlap == pytest.approx(0.81)
    assert exposed >= (1 - GPU_COMM_OVERLAP) * 0.5 * busy
    assert exposed < busy
