"""Near-copies are one candidate with variants: the key, the 0.1% grouping, and the search's answer."""

from __future__ import annotations

import numpy as np
from sample_documents import make_mlp_graph, make_t4_cluster
from search_graphs import cluster, recommender_graph

from optimizer_service.search import search
from optimizer_service.search.variants import TOLERANCE, group_variants, small_variables, variant_keys
from simulator import CandidateBatch, compile_context
from simulator.encoding import SyncKind


def _rows():
    context = compile_context(make_mlp_graph(), make_t4_cluster(2))
    return context, CandidateBatch.allocate(context, 5), context.variable_index


def test_small_means_under_a_hundredth_of_the_largest_variable() -> None:
    context, _, index = _rows()
    small = small_variables(context)
    assert not small[index["fc1.weight"]] and not small[index["fc2.weight"]]  # 1.6 MB and 0.5 MB
    assert small[index["fc3.weight"]] and small[index["fc1.bias"]] and small[index["fc3.bias"]]  # 10 kB and less


def test_the_key_ignores_where_small_variables_live_and_sees_everything_else() -> None:
    context, batch, index = _rows()
    bias, weight = index["fc1.bias"], index["fc2.weight"]
    batch.kind[1, bias] = SyncKind.PS  # a small variable on a parameter server
    batch.server[1, bias, 0] = context.device_index["10.0.0.2:CPU:0"]
    batch.group[2] += 100  # every fusion group relabelled: the same grouping
    batch.kind[3, weight] = SyncKind.SHARDED  # a large variable elsewhere
    batch.tensor[4] = 2  # another layout
    keys = variant_keys(context, batch)
    assert keys[0] == keys[1] == keys[2]
    assert len({keys[0], keys[3], keys[4]}) == 3
    assert variant_keys(context, batch) == keys, "stable: the same rows give the same keys"


def test_rows_of_one_key_within_a_tenth_of_a_percent_are_one_group() -> None:
    keys = ["a", "a", "b", "a", "a"]
    scores = np.array([1.0, 1.0005, 1.0002, 1.01, np.inf])
    groups = group_variants(keys, scores)
    assert [(g.key, g.members) for g in groups] == [("a", [0, 1]), ("b", [2]), ("a", [3])]
    assert groups[0].representative == 0 and groups[0].variants == [1]


def test_the_search_returns_each_idea_once_with_its_variants() -> None:
    graph, resources = recommender_graph(), cluster(nodes=4)
    result = search(graph, resources, top_k=4, seed=1, time_budget_s=None, max_candidates=1500)
    context = compile_context(graph, resources)
    small = {name for name, is_small in zip(context.variable_names, small_variables(context), strict=True) if is_small}
    records = [c.provenance.search for c in result.candidates]
    steps = [c.predicted.step_time_s for c in result.candidates]
    for i in range(len(records)):
        for j in range(i):
            if records[i]["variants"]["key"] == records[j]["variants"]["key"]:
                assert steps[i] > steps[j] * (1 + TOLERANCE), "no two candidates are near-copies"
    with_variants = [r for r in records if r["variants"]["count"]]
    assert with_variants, "this search finds near-copies of its best ideas"
    for record, candidate in zip(records, result.candidates, strict=True):
        variants = record["variants"]
        assert len(variants["listed"]) == min(variants["count"], 8)
        for variant in variants["listed"]:
            assert abs(variant["step_time_s"] / candidate.predicted.step_time_s - 1) <= 0.001 + 1e-12
            assert variant["differs"] and {d["variable"] for d in variant["differs"]} <= small
            assert all(d["representative"] != d["variant"] for d in variant["differs"])
