"""Scores computed by hand on tiny examples (`simulator.metrics`), and cross-validation that never
splits a job."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.learned import build_features, cross_validate
from simulator.learned.metrics import score
from simulator.learned.synthetic import synthetic_records
from simulator.metrics import (
    kendall_tau,
    kendall_tau_on_pairs,
    kendall_tau_within_groups,
    mape,
    mean_abs_log_error,
    top1_regret,
)
from stratagem.errors import StratagemError


def test_mape_is_the_mean_error_relative_to_the_measurement():
    assert mape(measured=[1.0, 2.0], predicted=[1.1, 1.0]) == pytest.approx((0.1 + 0.5) / 2)
    assert mape(measured=[2.0], predicted=[1.0]) == pytest.approx(0.5)
    assert mape(measured=[1.0], predicted=[2.0]) == pytest.approx(1.0), "divided by the measurement, not the guess"
    assert math.isnan(mape(measured=[], predicted=[]))


def test_measured_and_predicted_must_pair_up():
    with pytest.raises(ValueError, match="pair up"):
        mape(measured=[1.0, 2.0], predicted=[1.0])


def test_log_error_weighs_too_slow_and_too_fast_alike():
    assert mean_abs_log_error(measured=np.array([1.0, 1.0]), predicted=np.array([2.0, 0.5])) == pytest.approx(
        math.log(2)
    )
    assert mape(measured=np.array([1.0]), predicted=np.array([0.5])) == pytest.approx(0.5)


def test_kendall_tau_b_matches_hand_computed_values():
    assert kendall_tau(measured=[1, 2, 3, 4], predicted=[10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau(measured=[1, 2, 3, 4], predicted=[4, 3, 2, 1]) == pytest.approx(-1.0)
    # one swapped pair of six: (5 - 1) / 6
    assert kendall_tau(measured=[1, 2, 3, 4], predicted=[1, 3, 2, 4]) == pytest.approx(4 / 6)
    # a tie on one side: two concordant pairs over sqrt(3 x 2) (tau-b)
    assert kendall_tau(measured=[1, 2, 3], predicted=[1, 2, 2]) == pytest.approx(2 / math.sqrt(6))
    assert math.isnan(kendall_tau(measured=[1, 2, 3], predicted=[5, 5, 5]))
    assert math.isnan(kendall_tau(measured=[1], predicted=[1]))


def test_tau_over_chosen_pairs_counts_a_predicted_tie_neither_way():
    measured, predicted = [1.0, 2.0, 3.0], [1.0, 3.0, 3.0]
    assert kendall_tau_on_pairs(measured=measured, predicted=predicted, pairs=[(0, 1), (1, 2)]) == pytest.approx(0.5)
    assert math.isnan(kendall_tau_on_pairs(measured=measured, predicted=predicted, pairs=[]))


def test_kendall_tau_is_averaged_within_jobs_only():
    measured = np.array([1.0, 2.0, 3.0, 10.0, 20.0, 30.0])
    same_order = np.array([5.0, 6.0, 7.0, 0.1, 0.2, 0.3])
    jobs = ["a"] * 3 + ["b"] * 3
    assert kendall_tau_within_groups(measured=measured, predicted=same_order, groups=jobs) == pytest.approx(1.0)
    one_reversed = np.array([5.0, 6.0, 7.0, 0.3, 0.2, 0.1])
    assert kendall_tau_within_groups(measured=measured, predicted=one_reversed, groups=jobs) == pytest.approx(0.0)


def test_jobs_without_an_order_to_compare_are_skipped():
    alone = kendall_tau_within_groups(measured=[1.0, 2.0], predicted=[1.0, 2.0], groups=["a", "b"])
    assert math.isnan(alone)
    constant = kendall_tau_within_groups(
        measured=[1.0, 2.0, 1.0, 2.0], predicted=[1.0, 1.0, 1.0, 2.0], groups=["a", "a", "b", "b"]
    )
    assert constant == pytest.approx(1.0), "job a predicts a tie and has no order; job b is ordered right"


def test_top1_regret_is_how_much_slower_the_pick_is():
    measured = np.array([1.0, 1.2, 2.0, 2.5])
    predicted = np.array([0.9, 0.8, 1.0, 3.0])
    jobs = ["a", "a", "b", "b"]
    # job a picks the 1.2 s strategy (best 1.0): 20% regret; job b picks 2.0 s, the best: 0%.
    assert top1_regret(measured=measured, predicted=predicted, groups=jobs) == pytest.approx(0.1)
    scores = score(measured=measured, predicted=predicted, groups=jobs)
    assert scores.n == 4 and scores.n_groups == 2 and scores.kendall_tau == pytest.approx(0.0)


class _Recorder:
    """Remembers which jobs each fit saw, and predicts the simulator unchanged."""

    seen: list[set[str]] = []

    def fit(self, data):
        self.seen.append(set(data.groups))
        return self

    def predict(self, data):
        assert not set(data.groups) & self.seen[-1], "a job was split between train and test"
        return data.simulated_s


def test_cross_validation_keeps_each_job_on_one_side():
    matrix = build_features(synthetic_records(n_groups=6, per_group=4))
    result = cross_validate(_Recorder, matrix, n_splits=3)
    assert result.n_splits == 3 and len(_Recorder.seen) == 3
    assert result.corrected == result.simulator


def test_cross_validation_needs_two_jobs():
    with pytest.raises(StratagemError, match="at least 2 jobs"):
        cross_validate(_Recorder, build_features(synthetic_records(n_groups=1, per_group=4)))
