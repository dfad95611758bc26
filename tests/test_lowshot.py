"""Low-shot trial selection on synthetic candidates: what runs first, when it stops, what it answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optimizer_service.lowshot import (
    Candidate,
    CostModelUpdater,
    InvalidPlanError,
    TrialFailure,
    TrialPlanner,
    candidates_from_model,
    run_plan,
)
from simulator.learned import CostModel
from simulator.learned.synthetic import synthetic_records
from stratagem.errors import TrialFailedError


def around(cid: str, mid: float, spread: float = 0.1, **kwargs) -> Candidate:
    return Candidate(cid, mid * (1 - spread), mid, mid * (1 + spread), **kwargs)


def no_update(measured):
    return {}


@pytest.fixture
def job() -> list[Candidate]:
    return [
        around("dp", 1.0, baseline=True, family="dp"),
        around("ps", 1.3, baseline=True, family="ps"),
        around("search-a", 0.8, family="mixed"),
        around("search-b", 0.85, family="mixed"),
        around("search-c", 0.9, family="sharded"),
    ]


def test_the_predicted_best_runs_first_and_the_best_baseline_second(job):
    planner = TrialPlanner(job, budget=4, update=no_update)
    assert planner.next_candidates(1) == ["search-a"]
    planner.record("search-a", 0.95)
    assert planner.next_candidates(1) == ["dp"]


def test_a_batch_holds_distinct_candidates_and_waits_for_them(job):
    planner = TrialPlanner(job, budget=4, update=no_update)
    batch = planner.next_candidates(3)
    assert batch == ["search-a", "dp", "search-c"], "search-b shares search-a's family"
    assert not planner.done(), "trials are out"
    assert planner.trials_left == 1
    assert planner.next_candidates(5) == ["search-b"], "one trial of the budget is left"
    assert planner.next_candidates(5) == []
    batch.append("search-b")
    for cid in batch:
        planner.record(cid, 1.0)


def test_it_stops_as_soon_as_the_best_is_clear(job):
    planner = TrialPlanner(job, budget=4, update=no_update, relevel=None)
    answer = run_plan(planner, {"search-a": 0.6, "dp": 1.0, "ps": 1.3, "search-b": 0.85, "search-c": 0.9}.__getitem__)
    assert planner.trial_order == ["search-a", "dp"], "0.6 s measured is below every other lower bound"
    assert answer.candidate_id == "search-a" and answer.source == "measured"
    assert planner.next_candidates(1) == []


@pytest.mark.parametrize("noise, runs", [(0.05, True), (0.01, False)])
def test_a_candidate_that_may_beat_the_leader_within_its_noise_still_runs(noise, runs):
    """search's lower bound (0.969 s) is above dp's 0.95 s measurement, but not above 0.95 s + 5%."""
    candidates = [around("dp", 1.0, baseline=True, family="dp"), around("search", 1.02, spread=0.05, family="mixed")]
    planner = TrialPlanner(candidates, budget=4, update=no_update, measurement_noise=noise)
    run_plan(planner, {"dp": 0.95, "search": 0.94}.__getitem__)
    assert planner.trial_order == (["dp", "search"] if runs else ["dp"])


def test_the_budget_is_never_exceeded_and_the_fastest_measured_wins(job):
    truth = {"dp": 1.0, "ps": 1.3, "search-a": 0.99, "search-b": 0.84, "search-c": 0.95}
    planner = TrialPlanner(job, budget=3, diversity=0.0, update=no_update)
    answer = run_plan(planner, truth.__getitem__)
    assert planner.trial_order == ["search-a", "dp", "search-b"]
    assert answer.candidate_id == "search-b" and answer.source == "measured"
    assert planner.next_candidates(1) == [] and planner.done()


def test_a_failed_trial_uses_budget_and_the_next_best_takes_its_place(job):
    planner = TrialPlanner(job, budget=4, update=no_update)
    planner.record(planner.next_candidates(1)[0], TrialFailure("killed by the OOM killer", outcome="oom"))
    assert planner.trials_left == 3
    assert planner.next_candidates(1) == ["dp"]
    planner.record("dp", 1.0)
    assert planner.next_candidates(1) == ["search-c"], "the lowest lower bound outside the failed family"
    assert "search-a" not in planner.ranking()


def test_a_failed_baseline_is_replaced_by_the_next_baseline(job):
    planner = TrialPlanner(job, budget=4, update=no_update)
    planner.record(planner.next_candidates(1)[0], 0.7)
    assert planner.next_candidates(1) == ["dp"]
    planner.record("dp", TrialFailure("rank 1 raised"))
    assert planner.next_candidates(1) == ["ps"]


def test_when_every_trial_fails_the_answer_is_the_best_prediction_left(job):
    planner = TrialPlanner(job, budget=2, update=no_update)
    run_plan(planner, lambda cid: TrialFailure("crashed"))
    answer = planner.answer()
    assert answer.source == "predicted" and answer.candidate_id == "search-b"


def test_when_every_candidate_fails_the_answer_is_an_error():
    planner = TrialPlanner([around("a", 1.0), around("b", 2.0)], budget=2, update=no_update)
    with pytest.raises(TrialFailedError, match="every candidate failed its trial: a: timeout"):
        run_plan(planner, lambda cid: TrialFailure("timed out", outcome="timeout"))


def test_a_trial_runner_error_is_recorded_as_a_failure(job):
    def run(cid: str) -> float:
        if cid == "search-a":
            raise TrialFailedError("hang after 3 steps")
        return {"dp": 1.0, "ps": 1.3, "search-b": 0.8, "search-c": 0.9}[cid]

    planner = TrialPlanner(job, budget=4, update=no_update)
    answer = run_plan(planner, run)
    assert planner.failed["search-a"].reason == "hang after 3 steps"
    assert answer.candidate_id == "search-b"


def test_an_untried_candidate_is_the_answer_only_when_its_interval_clears_every_measurement():
    candidates = [around("slow-surprise", 0.5, 0.05, baseline=True), around("next", 0.6, 0.05), around("other", 3.0)]
    planner = TrialPlanner(candidates, budget=1, update=no_update)
    run_plan(planner, {"slow-surprise": 2.0}.__getitem__)
    answer = planner.answer()
    assert answer.source == "measured", "a 4x miss may be shared by every prediction: a guess never beats it"

    planner = TrialPlanner(candidates, budget=1, update=no_update)
    run_plan(planner, {"slow-surprise": 0.6}.__getitem__)
    assert planner.answer().source == "measured", "0.6 s measured is inside next's interval: not cleared"

    fast = [around("baseline", 0.5, 0.05, baseline=True), around("fast", 0.3, 0.02), around("other", 3.0)]
    planner = TrialPlanner(fast, budget=2, update=no_update)
    planner.record("baseline", 0.5)
    answer = planner.answer()
    assert answer.source == "predicted" and answer.candidate_id == "fast" and answer.high < 0.5


def test_the_default_update_moves_every_prediction_by_the_shared_bias(job):
    planner = TrialPlanner(job, budget=4, relevel=None)
    planner.record(planner.next_candidates(1)[0], 1.6)  # predicted 0.8: twice as slow
    low, mid, high = planner.interval("dp")
    assert mid == pytest.approx(1.0 * math.sqrt(2.0)), "log ratio log 2 shrunk by one pseudo-trial"
    assert low < mid < high


def test_diversity_prefers_a_family_not_yet_tried():
    candidates = [
        around("a1", 1.0, family="a", baseline=True),
        around("a2", 1.01, family="a"),
        around("b1", 1.02, family="b"),
    ]
    plain = TrialPlanner(candidates, budget=3, diversity=0.0, update=no_update)
    diverse = TrialPlanner(candidates, budget=3, diversity=0.25, update=no_update)
    assert plain.next_candidates(2) == ["a1", "a2"]
    assert diverse.next_candidates(2) == ["a1", "b1"]


@pytest.mark.parametrize("acquisition", ["lcb", "ei"])
def test_on_noisy_synthetic_jobs_the_answer_is_usually_the_fastest(acquisition):
    rng = np.random.default_rng(7)
    hits, regrets = 0, []
    for _ in range(60):
        truth = rng.uniform(0.5, 2.0, size=12)
        mids = truth * np.exp(rng.normal(0, 0.15, size=12)) * 0.7  # a shared bias and per-candidate noise
        candidates = [
            Candidate(f"c{i}", m * np.exp(-0.4), m, m * np.exp(0.4), baseline=i < 3) for i, m in enumerate(mids)
        ]
        planner = TrialPlanner(candidates, budget=4, acquisition=acquisition)
        answer = run_plan(planner, lambda cid, truth=truth: float(truth[int(cid[1:])]))
        chosen = truth[int(answer.candidate_id[1:])]
        hits += chosen == truth.min()
        regrets.append(chosen / truth.min() - 1)
        measured_baselines = [truth[int(c[1:])] for c in planner.measured if int(c[1:]) < 3]
        assert measured_baselines and chosen <= min(measured_baselines), "never worse than a measured baseline"
    assert hits / 60 >= 0.6 and float(np.mean(regrets)) < 0.05


def test_the_cost_model_refit_learns_from_this_jobs_trials():
    records = synthetic_records(n_groups=6, per_group=10, seed=3)
    history = [r for r in records if r.group_id != "job-5"][:5]
    job = {r.strategy_id: r for r in records if r.group_id == "job-5"}
    queries = {cid: r.model_copy(update={"measured_step_time_s": None}) for cid, r in job.items()}
    truth = {cid: r.measured_step_time_s for cid, r in job.items()}
    make = lambda: CostModel(n_estimators=60, n_bootstrap=4)  # noqa: E731
    candidates = candidates_from_model(make().fit(history), queries, baselines=list(job)[:2])
    planner = TrialPlanner(candidates, budget=4, update=CostModelUpdater(history, queries, make))
    before = {c.id: c.mid for c in candidates}
    answer = run_plan(planner, truth.__getitem__)
    assert any(planner.interval(cid)[1] != before[cid] for cid in job if cid not in planner.measured)
    assert truth[answer.candidate_id] <= min(truth[cid] for cid in planner.measured)
    assert truth[answer.candidate_id] / min(truth.values()) - 1 < 0.1


def test_bad_plans_and_results_name_the_field():
    with pytest.raises(InvalidPlanError, match=r"budget: must be at least 1 trial.*candidates\[1\]\.id: duplicate"):
        TrialPlanner([around("a", 1.0), around("a", 2.0)], budget=0)
    with pytest.raises(InvalidPlanError, match=r"candidates\[0\]: needs 0 < low <= mid <= high"):
        TrialPlanner([Candidate("a", 2.0, 1.0, 3.0)])
    planner = TrialPlanner([around("a", 1.0), around("b", 2.0)])
    with pytest.raises(InvalidPlanError, match="unknown candidate 'zz'"):
        planner.record("zz", 1.0)
    with pytest.raises(InvalidPlanError, match="result: must be a positive number"):
        planner.record("a", -1.0)
    planner.record("a", 1.0)
    with pytest.raises(InvalidPlanError, match="already recorded"):
        planner.record("a", 1.0)
    with pytest.raises(InvalidPlanError, match="k: must be at least 1"):
        planner.next_candidates(0)
