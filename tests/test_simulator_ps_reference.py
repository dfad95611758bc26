"""The vectorised parameter-server phase prices every candidate as the per-candidate loops of
`simulator.ps_reference` do, on random graphs, clusters and placements."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sample_documents import make_awkward_graph, make_embedding_graph, make_mlp_graph
from simulator_golden import calibrated_cpu

from simulator import CandidateBatch, compile_context
from simulator.encoding import SyncKind
from simulator.pipeline import compute_phase
from simulator.ps import ps_phase
from simulator.ps_reference import ps_reference
from simulator.topology import topology
from stratagem.ir import Link, Node, ResourceSpec

GRAPHS = {"mlp": make_mlp_graph(), "embedding": make_embedding_graph(), "awkward": make_awkward_graph()}


def _cluster(nodes: int, gpus: int, cpus: int, nics: list[float]) -> ResourceSpec:
    return ResourceSpec(
        name="random",
        nodes=[
            Node(
                address=f"10.0.0.{j + 1}",
                chief=j == 0,
                gpus=list(range(gpus)),
                cpus=list(range(cpus)),
                device="T4",
                network_bandwidth_gbps=nics[j],
            )
            for j in range(nodes)
        ],
        network=Link(kind="ethernet", bandwidth_gbps=25, latency_us=30),
    )


def _candidates(context, n: int, rng: np.random.Generator) -> CandidateBatch:
    batch = CandidateBatch.allocate(context, n, max_shards=3)
    V, L, D = context.num_variables, context.num_layers, context.num_devices
    replicas = context.compute_device_indices
    for i in range(n):
        size = len(replicas)
        tensor, pipeline = 1, 1
        shape = rng.integers(3)
        if shape == 1 and size % 2 == 0:
            tensor = 2
        if shape == 2 and size % 2 == 0 and L > 1:
            pipeline = 2
            batch.micro_batches[i] = 4
            batch.layer_stage[i] = np.minimum(np.arange(L) * 2 // L, 1)
        batch.data[i], batch.tensor[i], batch.pipeline[i] = size // (tensor * pipeline), tensor, pipeline
    batch.kind[:] = rng.choice([SyncKind.ALLREDUCE, SyncKind.PS, SyncKind.SHARDED], size=(n, V), p=[0.2, 0.7, 0.1])
    axis0 = context.var_shape[:, 0]
    ps = batch.kind == SyncKind.PS
    batch.shards[:] = np.where(ps, np.minimum(rng.integers(1, 4, size=(n, V)), axis0), 1)
    batch.local_replication[:] = rng.random((n, V)) < 0.4
    live = ps[:, :, None] & (np.arange(3) < batch.shards[:, :, None])
    batch.server[:] = np.where(live, rng.integers(0, D, size=(n, V, 3)), -1)
    batch.validate(context)
    return batch


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    graph=st.sampled_from(sorted(GRAPHS)),
    nodes=st.integers(1, 3),
    gpus=st.integers(0, 3),
    cpus=st.integers(1, 2),
    nics=st.lists(st.sampled_from([10.0, 25.0, 100.0]), min_size=3, max_size=3),
    calibrated=st.booleans(),
    n=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_vectorised_ps_phase_matches_the_scalar_reference(graph, nodes, gpus, cpus, nics, calibrated, n, seed):
    resources = calibrated_cpu() if calibrated else _cluster(nodes, gpus, cpus, nics)
    context = compile_context(GRAPHS[graph], resources)
    batch = _candidates(context, n, np.random.default_rng(seed))
    topo = topology(context, batch)
    compute = compute_phase(context, batch, topo)
    phase = ps_phase(context, batch, topo, compute)
    for i in range(n):
        expected = ps_reference(context, batch, topo, compute, i)
        assert phase.finish[i] == pytest.approx(expected.finish, rel=1e-9, abs=1e-15)
        assert phase.last_pull[i] == pytest.approx(expected.last_pull, rel=1e-9, abs=1e-15)
        assert phase.throughput[i] == pytest.approx(expected.throughput, rel=1e-9, abs=1e-15)
        np.testing.assert_allclose(phase.node_seconds[i], expected.node_seconds, rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(phase.node_bytes[i], expected.node_bytes, rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose(phase.held[i], expected.held, rtol=1e-9, atol=1e-6)


def test_a_candidate_without_parameter_servers_has_no_ps_time():
    context = compile_context(GRAPHS["embedding"], _cluster(2, 2, 1, [25.0, 25.0]))
    batch = CandidateBatch.allocate(context, 1)
    topo = topology(context, batch)
    compute = compute_phase(context, batch, topo)
    phase = ps_phase(context, batch, topo, compute)
    reference = ps_reference(context, batch, topo, compute, 0)
    assert phase.finish[0] == reference.finish == 0.0
    assert phase.rows.size == 0 and not any(reference.node_seconds)
