"""Local moves keep candidates inside the space, and each move does what it says."""

from __future__ import annotations

import numpy as np
import pytest
from search_graphs import cluster, recommender_graph, transformer_graph

from optimizer_service.search import SearchOptions
from optimizer_service.search.assign import server_traffic
from optimizer_service.search.moves import Loads, available_moves, merge_groups, move_shard, mutate, split_group
from optimizer_service.search.proposals import autosync_samples, structured_proposals
from optimizer_service.search.space import Space
from simulator import compile_context, simulate_batch, to_strategy
from simulator.encoding import CompressorKind, ConsistencyKind, SyncKind


def _space(graph, resources, **options) -> Space:
    return Space(compile_context(graph, resources), SearchOptions(**options))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mutated_candidates_stay_valid_and_keep_the_constraints(seed: int) -> None:
    graph, resources = recommender_graph(), cluster(nodes=4)
    space = _space(graph, resources)
    batch = autosync_samples(space, 200, np.random.default_rng(seed), space.max_shards).batch
    for _ in range(5):
        mutate(space, batch, np.random.default_rng(seed + 10))
        batch.validate(space.context)
    assert (batch.kind[:, space.context.var_sparse] == SyncKind.PS).all()
    assert (batch.compressor == CompressorKind.NONE).all()
    assert (batch.consistency == ConsistencyKind.BSP).all()
    for i in (0, 57, 199):
        to_strategy(space.context, batch, i).validate_for(graph, resources)
    assert np.isfinite(simulate_batch(space.context, batch).step_time).all()


def test_mutation_changes_rows_and_is_reproducible() -> None:
    space = _space(transformer_graph(layers=3), cluster(nodes=2))
    parent = structured_proposals(space, space.max_shards).batch.take(np.zeros(100, dtype=int))
    first, second = parent.copy(), parent.copy()
    mutate(space, first, np.random.default_rng(7))
    mutate(space, second, np.random.default_rng(7))
    for name, array in first.arrays().items():
        assert np.array_equal(array, getattr(second, name)), name
    changed = np.zeros(len(parent), dtype=bool)
    for name, array in first.arrays().items():
        changed |= (array != getattr(parent, name)).reshape(len(parent), -1).any(axis=1)
    assert changed.mean() > 0.8


def test_compression_and_consistency_moves_exist_only_when_allowed() -> None:
    strict = _space(transformer_graph(layers=1), cluster(nodes=2))
    loose = _space(transformer_graph(layers=1), cluster(nodes=2), allow_compression=True, allow_async=True)
    assert "change_compressor" not in available_moves(strict) and "change_consistency" not in available_moves(strict)
    assert {"change_compressor", "change_consistency"} <= set(available_moves(loose))


def test_merge_reduces_and_split_increases_the_number_of_fusion_groups() -> None:
    space = _space(transformer_graph(layers=3), cluster(nodes=2))
    proposals = structured_proposals(space, space.max_shards)
    row = proposals.labels.index("allreduce_fusion(cap=1MB, auto)")
    batch = proposals.batch.take(np.full(50, row))
    rows = np.arange(50)
    before = len(np.unique(batch.group[0]))
    merged = batch.copy()
    merge_groups(space, merged, rows, np.random.default_rng(0), Loads(space, merged))
    assert all(len(np.unique(merged.group[i])) == before - 1 for i in rows)
    split = batch.copy()
    split_group(space, split, rows, np.random.default_rng(0), Loads(space, split))
    assert all(len(np.unique(split.group[i])) == before + 1 for i in rows)
    split.validate(space.context)


def test_guided_shard_moves_relieve_the_busiest_server() -> None:
    space = _space(transformer_graph(layers=4), cluster(nodes=4))
    proposals = structured_proposals(space, space.max_shards)
    row = proposals.labels.index("balanced_ps(partition=none, by=bytes, local_replication=False)")
    batch = proposals.batch.take(np.full(64, row))
    batch.server[:, :, 0] = np.where(batch.kind == SyncKind.PS, space.servers[0], -1)  # everything on one server
    before = server_traffic(space, batch, np.arange(64)).max(axis=1)
    rows = np.arange(64)
    for seed in range(10):
        move_shard(space, batch, rows, np.random.default_rng(seed), Loads(space, batch))
    after = server_traffic(space, batch, rows).max(axis=1)
    assert (after <= before).all() and (after < before).mean() > 0.9
