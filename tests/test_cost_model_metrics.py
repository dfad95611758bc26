"""Scores computed by hand on tiny examples, and cross-validation that never splits a job."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.learned import build_features, cross_validate
from simulator.learned.metrics import kendall_tau_within_groups, mape, mean_abs_log_error, score, top1_regret
from simulator.learned.synthetic import synthetic_records
from stratagem.errors import StratagemError


def test_mape_is_the_mean_relative_error():
    assert mape(np.array([1.0, 2.0]), np.array([1.1, 1.0])) == pytest.approx((0.1 + 0.5) / 2)


def test_log_error_weighs_too_slow_and_too_fast_alike():
    assert mean_abs_log_error(np.array([1.0, 1.0]), np.array([2.0, 0.5])) == pytest.approx(math.log(2))
    assert mape(np.array([1.0]), np.array([2.0])) == pytest.approx(1.0)
    assert mape(np.array([1.0]), np.array([0.5])) == pytest.approx(0.5)


def test_kendall_tau_is_averaged_within_jobs_only():
    measured = np.array([1.0, 2.0, 3.0, 10.0, 20.0, 30.0])
    same_order = np.array([5.0, 6.0, 7.0, 0.1, 0.2, 0.3])
    assert kendall_tau_within_groups(measured, same_order, ["a"] * 3 + ["b"] * 3) == pytest.approx(1.0)
    one_reversed = np.array([5.0, 6.0, 7.0, 0.3, 0.2, 0.1])
    assert kendall_tau_within_groups(measured, one_reversed, ["a"] * 3 + ["b"] * 3) == pytest.approx(0.0)


def test_jobs_without_an_order_to_compare_are_skipped():
    assert math.isnan(kendall_tau_within_groups(np.array([1.0, 2.0]), np.array([1.0, 2.0]), ["a", "b"]))
    constant = kendall_tau_within_groups(
        np.array([1.0, 2.0, 1.0, 2.0]), np.array([1.0, 1.0, 1.0, 2.0]), ["a", "a", "b", "b"]
    )
    assert constant == pytest.approx(1.0), "job a predicts a tie and has no order; job b is ordered right"


def test_top1_regret_is_how_much_slower_the_pick_is():
    measured = np.array([1.0, 1.2, 2.0, 2.5])
    predicted = np.array([0.9, 0.8, 1.0, 3.0])
    # job a picks the 1.2 s strategy (best 1.0): 20% regret; job b picks 2.0 s, the best: 0%.
    assert top1_regret(measured, predicted, ["a", "a", "b", "b"]) == pytest.approx(0.1)
    scores = score(measured, predicted, ["a", "a", "b", "b"])
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
