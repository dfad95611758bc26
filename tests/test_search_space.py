"""The space: its size, its constraints, and the proposals written into it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from search_graphs import cluster, one_variable_graph, recommender_graph, transformer_graph

from optimizer_service.search import SearchOptions, space_size
from optimizer_service.search.assign import balanced_servers, set_allreduce, set_fusion
from optimizer_service.search.proposals import autosync_samples, structured_proposals
from optimizer_service.search.space import Space
from simulator import CandidateBatch, compile_context, to_strategy
from simulator.encoding import CompressorKind, ConsistencyKind, SyncKind


def _space(graph, resources, **options) -> Space:
    return Space(compile_context(graph, resources), SearchOptions(**options))


def test_space_size_counts_one_variable_exactly() -> None:
    # One dense [4] variable on 2 nodes x 2 GPUs: 2 servers, local replication useful, at most 2 shards.
    # PS: 1 shard on 2 servers x 2 replication = 4; 2 shards: 2*2 placements x 2 = 8.
    # All-reduce: 4 algorithms x 1 compressor x (1, 2, 3 or 4 shards) = 16.  Sharded: 1.
    size = space_size(one_variable_graph([4]), cluster(nodes=2, gpus=2))
    assert size.log10_candidates == pytest.approx(math.log10(4 + 8 + 16 + 1), abs=1e-3)
    assert size.knobs["compressor"] == 0.0
    assert size.knobs["consistency"] == 0.0
    assert size.knobs["mesh"] == 0.0


def test_space_size_grows_with_compression_and_async_only_when_allowed() -> None:
    graph, resources = transformer_graph(layers=2), cluster(nodes=4)
    default = space_size(graph, resources)
    wider = space_size(graph, resources, SearchOptions(allow_compression=True, allow_async=True))
    assert wider.knobs["compressor"] > 0 and wider.knobs["consistency"] == pytest.approx(math.log10(6), abs=1e-3)
    assert wider.log10_candidates > default.log10_candidates
    assert default.variables == len(graph.trainable_variables)
    assert default.parameter_servers == 4
    assert all(value >= 0 for value in default.knobs.values())


def test_sparse_variables_count_only_parameter_server_choices() -> None:
    size = space_size(recommender_graph(tables=(1000,)), cluster(nodes=2))
    assert size.sparse_variables == 1
    # fixing the synchronizer removes every dense alternative; the sparse table had none to lose
    dense_only = space_size(transformer_graph(layers=1), cluster(nodes=2))
    assert dense_only.knobs["synchronizer"] > 0


def test_shard_limit_never_exceeds_the_axis_length_or_the_servers() -> None:
    space = _space(one_variable_graph([3, 5]), cluster(nodes=8))
    assert space.shard_limit.tolist() == [3]
    space = _space(one_variable_graph([100]), cluster(nodes=4))
    assert space.shard_limit.tolist() == [4]


def test_every_structured_proposal_is_a_valid_strategy_with_sparse_tables_on_servers() -> None:
    graph, resources = recommender_graph(), cluster(nodes=4)
    space = _space(graph, resources)
    proposals = structured_proposals(space, space.max_shards)
    proposals.batch.validate(space.context)
    assert len(proposals.labels) == len(proposals.batch) > 20
    sparse = space.context.var_sparse
    assert (proposals.batch.kind[:, sparse] == SyncKind.PS).all()
    for i in range(0, len(proposals.batch), 7):
        to_strategy(space.context, proposals.batch, i).validate_for(graph, resources)


def test_autosync_samples_stay_inside_the_space() -> None:
    graph, resources = recommender_graph(), cluster(nodes=4)
    space = _space(graph, resources)
    samples = autosync_samples(space, 300, np.random.default_rng(3), space.max_shards)
    samples.batch.validate(space.context)
    assert (samples.batch.kind[:, space.context.var_sparse] == SyncKind.PS).all()
    assert (samples.batch.compressor == CompressorKind.NONE).all()
    assert (samples.batch.consistency == ConsistencyKind.BSP).all()
    kinds = {int(k) for k in np.unique(samples.batch.kind)}
    assert kinds == {0, 1, 2}


def test_samples_use_compression_and_async_once_allowed() -> None:
    space = _space(transformer_graph(layers=2), cluster(nodes=2), allow_compression=True, allow_async=True)
    samples = autosync_samples(space, 200, np.random.default_rng(0), space.max_shards)
    samples.batch.validate(space.context)
    assert (samples.batch.compressor != CompressorKind.NONE).any()
    assert (samples.batch.consistency != ConsistencyKind.BSP).any()


def test_fusion_buckets_are_contiguous_in_backward_order_and_respect_the_cap() -> None:
    space = _space(transformer_graph(layers=3), cluster(nodes=2))
    batch = CandidateBatch.allocate(space.context, 3)
    rows = np.arange(3)
    set_allreduce(batch, rows, np.ones(space.num_variables, bool))
    set_fusion(space, batch, rows, np.array([0.0, 1024 * 1024, np.inf]))
    labels = batch.group[:, space.backward_order]
    assert len(np.unique(labels[0])) == space.num_variables  # cap 0: a collective per variable
    assert len(np.unique(labels[2])) == 1  # no cap: one collective
    changes = np.flatnonzero(np.diff(labels[1]) != 0)
    runs = np.split(space.context.var_bytes[space.backward_order], changes + 1)
    assert len(np.unique(labels[1])) == len(runs)  # contiguous: each label is one run
    assert all(run[:-1].sum() < 1024 * 1024 for run in runs)  # a bucket closes once it reaches the cap


def test_balanced_placement_evens_out_server_traffic() -> None:
    space = _space(transformer_graph(layers=4), cluster(nodes=4))
    traffic = space.context.var_ps_bytes
    shards = np.ones(space.num_variables, dtype=np.int32)
    servers = balanced_servers(space, traffic, shards, by_bandwidth=False)
    loads = np.array([traffic[servers[:, 0] == s].sum() for s in space.servers])
    assert loads.max() - loads.min() <= traffic.max()
    assert (servers[:, 0] >= 0).all()


def test_compressed_and_relaxed_proposals_appear_only_when_allowed() -> None:
    graph, resources = transformer_graph(layers=2), cluster(nodes=2)
    strict = structured_proposals(_space(graph, resources), 2)
    assert not any(label.startswith(("compressed_allreduce", "relaxed_ps")) for label in strict.labels)
    loose_space = _space(graph, resources, allow_compression=True, allow_async=True)
    loose = structured_proposals(loose_space, loose_space.max_shards)
    loose.batch.validate(loose_space.context)
    assert (loose.batch.compressor != CompressorKind.NONE).any(axis=1).sum() >= 2
    assert (loose.batch.consistency != ConsistencyKind.BSP).sum() >= 2
    for i in range(len(loose.batch)):
        to_strategy(loose_space.context, loose.batch, i).validate_for(graph, resources)


def test_the_search_graph_helpers_build_the_intended_documents() -> None:
    transformer = transformer_graph(layers=2)
    assert len(transformer.variables) == 1 + 2 * 10
    recommender = recommender_graph()
    assert [v.sparse for v in recommender.variables][:4] == [True] * 4
    assert cluster(3, 2).num_devices == 6
