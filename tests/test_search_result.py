"""The search end to end: baselines always in, guard, budgets, progress, reproducibility, diversity."""

from __future__ import annotations

import numpy as np
import pytest
from search_graphs import cluster, one_variable_graph, recommender_graph, transformer_graph

from optimizer_service.search import SearchCancelled, SearchOptions, SearchProgress, search
from optimizer_service.search.guard import admissible
from optimizer_service.search.select import select_diverse
from simulator import CandidateBatch, compile_context, simulate
from stratagem.builders import BUILDERS
from stratagem.errors import InfeasibleStrategyError, InvalidDocumentError
from stratagem.ir import Strategy

BUDGET = {"time_budget_s": None, "max_candidates": 1500}
"""Candidate budget only, so every test run is reproducible whatever the machine's load."""


@pytest.fixture(scope="module")
def recommender_result():
    graph, resources = recommender_graph(), cluster(nodes=4)
    return graph, resources, search(graph, resources, top_k=4, seed=1, **BUDGET)


def test_result_ranks_valid_predicted_strategies_with_reasons(recommender_result) -> None:
    graph, resources, result = recommender_result
    assert 1 <= len(result.candidates) <= 4
    times = [c.predicted.step_time_s for c in result.candidates]
    assert times == sorted(times)
    for rank, candidate in enumerate(result.candidates, start=1):
        candidate.validate_for(graph, resources)
        assert candidate.predicted is not None and candidate.predicted.feasible
        record = candidate.provenance.search
        assert (
            record["rank"] == rank
            and record["found_by"]
            and record["method"] in {"builder", "proposal", "sampling", "local_search"}
        )
        assert "data parallel" in record["why"]
        assert candidate.provenance.simulator_version


def test_predictions_agree_with_the_simulator(recommender_result) -> None:
    graph, resources, result = recommender_result
    again = simulate(graph, resources, result.candidates)
    for candidate, prediction in zip(result.candidates, again, strict=True):
        assert prediction.step_time_s == pytest.approx(candidate.predicted.step_time_s, rel=1e-9)


def test_every_builder_is_a_predicted_baseline_and_none_beats_the_answer(recommender_result) -> None:
    _, _, result = recommender_result
    assert set(result.baselines) == set(BUILDERS)
    fastest = min(b.predicted.step_time_s for b in result.baselines.values() if b.predicted.feasible)
    assert all(c.predicted.step_time_s <= fastest * (1 + 1e-9) for c in result.candidates)
    assert result.speedup_vs_best_builder >= 1.0
    assert result.best_builder in BUILDERS and result.best_builder != "DataParallel"
    builder = result.baselines[result.best_builder].predicted.step_time_s
    assert builder == min(b.predicted.step_time_s for name, b in result.baselines.items() if name != "DataParallel")
    assert result.speedup_vs_best_builder == pytest.approx(builder / result.candidates[0].predicted.step_time_s)
    dp = result.baselines["DataParallel"].predicted.step_time_s
    assert result.speedup_vs_data_parallel == pytest.approx(dp / result.candidates[0].predicted.step_time_s)


def test_sparse_tables_make_parameter_servers_win_well_ahead_of_data_parallel(recommender_result) -> None:
    _, _, result = recommender_result
    # about 1.6x: every sparse pull is exposed, as the runtime exchanges tables one at a time
    assert result.speedup_vs_data_parallel > 1.5
    best = result.candidates[0]
    sparse = {"table0.weight", "table1.weight", "table2.weight", "table3.weight"}
    assert all(best.config_of(name).synchronizer.kind == "ps" for name in sparse)


def test_defaults_never_pick_lossy_compression_or_async(recommender_result) -> None:
    _, _, result = recommender_result
    for candidate in result.candidates:
        assert candidate.consistency.kind == "bsp"
        for config in candidate.variables:
            for sync in config.synchronizers:
                assert sync.kind != "allreduce" or sync.compressor.kind == "none"


def test_candidates_are_different_ideas(recommender_result) -> None:
    _, _, result = recommender_result
    ids = [c.id for c in result.candidates]
    assert len(set(ids)) == len(ids)
    mixes = [tuple(sorted(c.provenance.search["composition"].items(), key=str)) for c in result.candidates]
    assert len({str(m) for m in mixes}) >= min(2, len(mixes))


def test_same_seed_same_result_under_a_candidate_budget() -> None:
    graph, resources = transformer_graph(layers=3), cluster(nodes=2)
    first = search(graph, resources, seed=5, top_k=3, time_budget_s=None, max_candidates=600)
    second = search(graph, resources, seed=5, top_k=3, time_budget_s=None, max_candidates=600)
    assert [c.id for c in first.candidates] == [c.id for c in second.candidates]
    assert first.evaluated == second.evaluated
    assert [c.provenance.search for c in first.candidates] == [c.provenance.search for c in second.candidates]


def test_budgets_bound_the_work() -> None:
    graph, resources = transformer_graph(layers=2), cluster(nodes=2)
    result = search(graph, resources, time_budget_s=None, max_candidates=120)
    assert result.evaluated <= 120 and result.stopped_by == "candidates"
    timed = search(graph, resources, time_budget_s=0.3, max_candidates=10**9)
    assert timed.stopped_by == "time" and timed.elapsed_s < 3.0
    assert timed.candidates  # the baselines always run, so there is always an answer


def test_progress_is_reported_and_raising_from_it_cancels() -> None:
    graph, resources = transformer_graph(layers=2), cluster(nodes=2)
    seen: list[SearchProgress] = []
    search(graph, resources, time_budget_s=None, max_candidates=800, progress=seen.append)
    phases = [p.phase for p in seen]
    assert phases[0] == "baselines" and phases[-1] == "finalizing" and "local_search" in phases
    assert [p.evaluated for p in seen] == sorted(p.evaluated for p in seen)
    assert seen[-1].best_step_time_s is not None and seen[-1].best_step_time_s > 0

    def cancel(progress: SearchProgress) -> None:
        if progress.evaluated > 100:
            raise SearchCancelled("cancelled by the user")

    with pytest.raises(SearchCancelled):
        search(graph, resources, time_budget_s=None, max_candidates=5000, progress=cancel)


def test_compression_and_async_are_used_only_when_allowed() -> None:
    graph, resources = transformer_graph(layers=3, hidden=512), cluster(nodes=8, gbps=10)
    result = search(graph, resources, time_budget_s=None, max_candidates=1500, allow_compression=True, allow_async=True)
    assert result.space.knobs["compressor"] > 0
    recorded = result.candidates[0].provenance.search["options"]
    assert recorded["allow_compression"] is True and recorded["allow_async"] is True
    assert recorded["precision"] == "fp32" and recorded["runner"] == "stratagem"
    strict = search(graph, resources, time_budget_s=None, max_candidates=1500)
    assert result.candidates[0].predicted.step_time_s <= strict.candidates[0].predicted.step_time_s * (1 + 1e-9)


def test_bad_arguments_name_the_field() -> None:
    graph, resources = transformer_graph(layers=1), cluster(nodes=1)
    with pytest.raises(InvalidDocumentError, match=r"search\.top_k: must be a positive integer"):
        search(graph, resources, top_k=0)
    with pytest.raises(InvalidDocumentError, match=r"search\.time_budget_s"):
        search(graph, resources, time_budget_s=-1.0)


def test_guard_drops_slower_and_disallowed_rows() -> None:
    graph, resources = transformer_graph(layers=1), cluster(nodes=2)
    context = compile_context(graph, resources)
    batch = CandidateBatch.allocate(context, 4)
    batch.compressor[1, 0] = 1
    batch.consistency[2] = 2
    scores = np.array([1.0, 0.5, 0.5, 2.0])
    allowed = admissible(batch, scores, SearchOptions(), best_prebuilt=1.5)
    assert allowed.tolist() == [True, False, False, False]
    assert admissible(batch, scores, SearchOptions(True, True), best_prebuilt=1.5).tolist() == [True, True, True, False]


def test_diverse_selection_skips_near_copies_first() -> None:
    signature = np.array([[0, 0, 0, 0], [0, 0, 0, 1], [1, 1, 1, 1], [1, 1, 0, 0]])
    scores = np.array([1.0, 1.01, 1.5, 1.2])
    assert select_diverse(signature, scores, 2, min_distance=2) == [0, 3]
    assert select_diverse(signature, scores, 4, min_distance=2) == [0, 1, 3, 2]


def test_a_single_device_search_returns_a_strategy() -> None:
    graph, resources = transformer_graph(layers=1), cluster(nodes=1, gpus=1)
    result = search(graph, resources, time_budget_s=None, max_candidates=200)
    assert isinstance(result.candidates[0], Strategy)
    result.candidates[0].validate_for(graph, resources)


def test_diverse_selection_prefers_a_new_synchronizer_mix() -> None:
    signature = np.array([[0, 0, 0, 0], [0, 0, 1, 1], [1, 1, 1, 1]])
    mixes = np.array([[0, 0], [0, 0], [1, 1]])
    scores = np.array([1.0, 1.1, 1.2])
    assert select_diverse(signature, scores, 2, min_distance=2, mixes=mixes) == [0, 2]
    assert select_diverse(signature, scores, 3, min_distance=2, mixes=mixes) == [0, 1, 2]


def test_a_model_that_fits_nowhere_is_refused_with_the_reason() -> None:
    graph, resources = one_variable_graph([20_000, 1_000_000]), cluster(nodes=2)  # 80 GB of fp32 weights
    with pytest.raises(InfeasibleStrategyError, match="does not fit"):
        search(graph, resources, time_budget_s=None, max_candidates=300)


@pytest.mark.parametrize(("nodes", "gbps", "seed"), [(1, 50, 0), (2, 10, 1), (4, 100, 2)])
def test_never_slower_than_any_prebuilt_strategy(nodes: int, gbps: float, seed: int) -> None:
    graph, resources = transformer_graph(layers=2, hidden=384), cluster(nodes=nodes, gbps=gbps)
    result = search(graph, resources, time_budget_s=None, max_candidates=400, seed=seed, top_k=3)
    prebuilt = [b.predicted.step_time_s for b in result.baselines.values() if b.predicted.feasible]
    assert all(c.predicted.step_time_s <= min(prebuilt) * (1 + 1e-9) for c in result.candidates)
    assert result.speedup_vs_best_builder >= 1.0


def test_a_tiny_space_ends_the_search_once_explored() -> None:
    graph, resources = one_variable_graph([4]), cluster(nodes=1, gpus=1)
    result = search(graph, resources, time_budget_s=None, max_candidates=10**6)
    assert result.stopped_by == "completed" and result.evaluated < 1000


def test_a_graph_that_clips_gets_no_asynchronous_servers_even_when_async_is_allowed() -> None:
    """ASP applies each worker's push alone, so no step has a whole gradient to clip: the simulator makes
    those candidates infeasible and the search never returns one."""
    graph, resources = recommender_graph(), cluster(nodes=4)
    clipped = graph.replace(optimizer=graph.optimizer.model_copy(update={"max_grad_norm": 1.0}))
    result = search(clipped, resources, top_k=8, seed=1, allow_async=True, **BUDGET)
    assert result.candidates
    kinds = {c.consistency.kind for c in result.candidates}
    assert "asp" not in kinds
    loose = search(graph, resources, top_k=8, seed=1, allow_async=True, **BUDGET)
    assert "asp" in {c.consistency.kind for c in loose.candidates}
