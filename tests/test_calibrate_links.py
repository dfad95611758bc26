"""`stratagem calibrate --gpu` on several GPUs: a node's link is fitted from an all-reduce sweep by inverting
the NCCL model the simulator prices with, so a measured link prices back to what was measured. The sweep
runs here under gloo on CPU ranks (its code is backend-agnostic); NCCL itself needs GPUs."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import collectives
from simulator.allreduce import _allreduce_cost
from simulator.context import compile_context
from simulator.encoding import Algorithm, CandidateBatch, SyncKind
from simulator.topology import topology
from stratagem.calibrate.gpu import gpu_spec
from stratagem.calibrate.links import LINK_SIZES, busbw, fit_nccl_link
from stratagem.calibrate.workers import RankJob, run_ranks
from stratagem.ir import Layer, Link, ModelGraph, Variable
from stratagem.ir.nccl import step_ratio

FIGURES = dict.fromkeys(
    (
        "elementwise_rate",
        "norm_rate",
        "optimizer_rate",
        "stream_rate",
        "cast_rate",
        "select_rate",
        "lowrank_rate",
        "coalesce_rate",
    ),
    1e12,
) | {"matmul_flops": 2e14, "conv_flops": 2e14, "bf16_flops": 3e14, "copy_bandwidth": 2e12}
FIGURES |= {"layer_overhead_s": 1e-5, "optimizer_tensor_s": 1e-6}
"""Compute figures of a calibrated device (any will do: only the link is priced here)."""


def ring_seconds(sizes, ranks: int, link: Link, link_class: str) -> list[float]:
    """What the simulator's NCCL ring (cheapest protocol) takes for each all-reduce on one node."""
    out = []
    for n in sizes:
        times = []
        for protocol in range(3):
            step = link.latency_s * step_ratio(link_class, "ring", protocol)
            pair = collectives.nccl_ring_allreduce(ranks, 1, step, step, link.bytes_per_s, protocol)
            times.append(float(collectives.cost(pair, n)))
        out.append(min(times))
    return out


@pytest.mark.parametrize(
    ("kind", "gbps", "latency_us", "ranks"),
    [("nvlink", 2960, 3.4, 8), ("nvlink", 1920, 3.4, 8), ("pcie", 102, 5.7, 4), ("nvlink", 960, 5.0, 2)],
)
def test_the_fit_recovers_the_link_a_sweep_was_priced_on(kind: str, gbps: float, latency_us: float, ranks: int):
    link = Link(kind=kind, bandwidth_gbps=gbps, latency_us=latency_us, efficiency=1.0)
    seconds = ring_seconds(LINK_SIZES, ranks, link, kind)
    fitted = fit_nccl_link(LINK_SIZES, seconds, ranks, kind)
    assert fitted.kind == kind and fitted.efficiency == 1.0
    assert fitted.bandwidth_gbps == pytest.approx(gbps, rel=1e-6)
    assert fitted.latency_us == pytest.approx(latency_us, rel=1e-6)


def test_bus_bandwidth_is_nccl_tests_definition():
    assert busbw([8e6], [1e-3], 8) == pytest.approx([2 * 7 / 8 * 8e9])


def test_a_fit_needs_peers_and_sizes():
    with pytest.raises(ValueError, match="two or more ranks"):
        fit_nccl_link(LINK_SIZES, [1e-3] * len(LINK_SIZES), 1, "nvlink")


def test_a_measured_link_prices_the_sweeps_largest_all_reduce_back():
    sizes, ranks = LINK_SIZES, 4
    measured = ring_seconds(sizes, ranks, Link(kind="nvlink", bandwidth_gbps=1500, latency_us=4.0), "nvlink")
    link = fit_nccl_link(sizes, measured, ranks, "nvlink")
    spec = gpu_spec(FIGURES, name="NVIDIA A100-SXM4-80GB", memory_bytes=80e9, gpus=list(range(ranks)), link=link)
    graph = ModelGraph(
        name="one",
        batch_size=1,
        layers=[Layer(name="fc", kind="matmul", fwd_flops=1e9, bwd_flops=2e9, variables=["fc.weight"])],
        variables=[Variable(name="fc.weight", shape=[1024], consumer="fc")],
    )
    context = compile_context(graph, spec)
    batch = CandidateBatch.allocate(context, 1)
    batch.kind[:] = SyncKind.ALLREDUCE
    topo = topology(context, batch)
    seconds, _ = _allreduce_cost(
        topo, np.zeros(1, dtype=np.intp), np.array([int(Algorithm.RING)]), np.array([sizes[-1]])
    )
    assert float(seconds[0]) == pytest.approx(measured[-1], rel=1e-6)


def test_the_sweep_runs_on_the_ranks_process_group_and_grows_with_size():
    sizes = (8, 1 << 10, 256 << 10, 4 << 20)
    per_rank = run_ranks(RankJob(ranks=2, backend="gloo", probes="links", link_sizes=sizes), timeout_s=120)
    assert len(per_rank) == 2
    for figures in per_rank:
        seconds = figures["link_seconds"]
        assert list(figures) == ["link_seconds"] and len(seconds) == len(sizes)
        # one size's median can catch a busy machine (8 B at 3.4 ms once, beside 1.7 ms for 4 MB)
        assert all(t > 0 for t in seconds) and seconds[-1] > min(seconds[:-1])
    link = fit_nccl_link(sizes, per_rank[0]["link_seconds"], 2, "pcie")
    assert link.bandwidth_gbps > 0 and link.latency_us >= 0
