"""A first trial far from its prediction re-levels every untried candidate before the next choice."""

from __future__ import annotations

import pytest

from optimizer_service.lowshot import Candidate, Relevel, TrialFailure, TrialPlanner


def around(cid: str, mid: float, spread: float = 0.1, **kwargs) -> Candidate:
    return Candidate(cid, mid * (1 - spread), mid, mid * (1 + spread), **kwargs)


def no_update(measured):
    return {}


def test_far_means_outside_the_interval_or_more_than_15_percent_off() -> None:
    rule = Relevel()
    assert not rule.far(1.05, (0.9, 1.0, 1.1))
    assert rule.far(1.12, (0.9, 1.0, 1.1)), "outside the interval, though within 15%"
    assert rule.far(1.2, (0.5, 1.0, 1.5)), "inside a wide interval, but 20% off"
    assert not rule.far(1.12, (0.5, 1.0, 1.5))
    assert not Relevel(outside_interval=False).far(1.12, (0.9, 1.0, 1.1))


def test_a_far_first_trial_multiplies_every_untried_interval_by_its_miss() -> None:
    planner = TrialPlanner([around("a", 0.8, baseline=True), around("b", 1.0), around("c", 2.0)], update=no_update)
    assert planner.next_candidates(1) == ["a"]
    planner.record("a", 1.6)
    assert planner.interval("b") == pytest.approx((1.8, 2.0, 2.2))
    assert planner.interval("c") == pytest.approx((3.6, 4.0, 4.4))
    event = planner.relevelled
    assert event is not None and event.applied and event.factor == pytest.approx(2.0)
    assert event.levelled["b"] == pytest.approx(2.0) and event.levelled["c"] == pytest.approx(4.0)
    assert "2.00× its prediction" in event.words(planner.relevel)


def test_a_close_first_trial_re_levels_nothing() -> None:
    planner = TrialPlanner([around("a", 1.0, baseline=True), around("b", 1.2)], update=no_update)
    planner.record(planner.next_candidates(1)[0], 1.05)
    assert planner.interval("b") == pytest.approx((1.08, 1.2, 1.32))
    assert planner.relevelled is not None and not planner.relevelled.applied and not planner.relevelled.levelled


def test_re_levelling_changes_the_next_choice_on_a_cluster_faster_than_predicted() -> None:
    """Measured at half its prediction, the baseline leaves b's lower bound (0.74 s) above the leader
    (0.4 s): unlevelled, the planner stops; re-levelled, b may be faster still, so it runs next."""
    candidates = [around("a", 0.8, baseline=True), around("b", 0.82)]
    plain = TrialPlanner(candidates, update=no_update, relevel=None)
    plain.record(plain.next_candidates(1)[0], 0.4)
    assert plain.next_candidates(1) == [] and plain.done()
    levelled = TrialPlanner(candidates, update=no_update)
    levelled.record(levelled.next_candidates(1)[0], 0.4)
    assert levelled.next_candidates(1) == ["b"]


def test_the_level_holds_through_later_refits() -> None:
    candidates = [around("a", 1.0, baseline=True), around("b", 1.0), around("c", 1.0), around("d", 1.0)]
    planner = TrialPlanner(candidates, budget=4)  # the default update: shared bias, one pseudo-trial
    planner.record("a", 2.0)
    planner.record("b", 2.0)
    assert planner.interval("c")[1] == pytest.approx(2.0), "both trials say 2x: the level stays at 2x"
    unlevelled = TrialPlanner(candidates, budget=4, relevel=None)
    unlevelled.record("a", 2.0)
    unlevelled.record("b", 2.0)
    assert unlevelled.interval("c")[1] == pytest.approx(2.0 ** (2 / 3)), "the bias shrunk by a pseudo-trial"


def test_only_the_first_successful_trial_re_levels() -> None:
    candidates = [around("a", 1.0, baseline=True), around("b", 1.0), around("c", 1.0)]
    planner = TrialPlanner(candidates, update=no_update)
    planner.record("a", TrialFailure("oom", outcome="oom"))
    planner.record("b", 1.03)
    planner.record("c", 3.0)
    assert planner.relevelled is not None and planner.relevelled.candidate_id == "b"
    assert not planner.relevelled.applied
